"""tools.virtualenvs as `make test` uses it: a virtualenv another process is building is waited for
and built once (the background build and a test worker ask for the same one)."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import pytest

from tools import virtualenvs

BUILD_SECONDS = 0.5


def test_a_virtualenv_being_built_is_waited_for_and_built_once(tmp_path, monkeypatch):
    built: list[str] = []

    def slow_build(home: Path, install_args: tuple[str, ...], cwd: Path) -> None:
        built.append(home.name)
        time.sleep(BUILD_SECONDS)  # the other caller arrives while this one builds
        home.mkdir()
        (home / virtualenvs.READY_MARKER).touch()

    monkeypatch.setattr(virtualenvs, "ENVS_DIR", tmp_path)
    monkeypatch.setattr(virtualenvs, "build", slow_build)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pythons = list(pool.map(lambda _: virtualenvs.virtualenv("image", "key", "-r", "lock.txt"), range(2)))

    assert built == ["image-key"]
    assert pythons == [tmp_path / "image-key" / "bin" / "python"] * 2


def test_a_failed_build_is_tried_again_by_the_next_caller(tmp_path, monkeypatch):
    attempts: list[str] = []

    def failing_then_working_build(home: Path, install_args: tuple[str, ...], cwd: Path) -> None:
        attempts.append(home.name)
        if len(attempts) == 1:
            raise virtualenvs.BuildError(f"{home.name}: pip install: the registry is down")
        home.mkdir()
        (home / virtualenvs.READY_MARKER).touch()

    monkeypatch.setattr(virtualenvs, "ENVS_DIR", tmp_path)
    monkeypatch.setattr(virtualenvs, "build", failing_then_working_build)
    with pytest.raises(virtualenvs.BuildError, match="the registry is down"):
        virtualenvs.virtualenv("policy", "key")
    assert virtualenvs.virtualenv("policy", "key") == tmp_path / "policy-key" / "bin" / "python"
    assert attempts == ["policy-key", "policy-key"]


def test_an_installer_that_cannot_be_had_is_a_build_error_naming_it(tmp_path, monkeypatch):
    def unavailable() -> Path:
        raise virtualenvs.Unavailable("pip install uv==0.13.9:\nERROR: No matching distribution found")

    monkeypatch.setattr(virtualenvs, "ENVS_DIR", tmp_path)
    monkeypatch.setattr(virtualenvs, "uv", unavailable)
    with pytest.raises(virtualenvs.BuildError, match=r"^image-key: pip install uv==0\.13\.9:\nERROR: No "):
        virtualenvs.virtualenv("image", "key", "-r", "lock.txt")
    assert not (tmp_path / "image-key" / virtualenvs.READY_MARKER).exists()
