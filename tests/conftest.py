"""Shared fixtures: the real Fashion-MNIST sample, the upstream CRDs, subprocess runners, and
trained exports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from testdata import fixtures
from testdata.crd_schema import validate_manifest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Values of CI that mean "every test must run": GitHub Actions and the project's CI set CI=true.
CI_VALUES = {"true", "1", "yes"}
T = TypeVar("T")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in CI_VALUES


def require_fixture(find: Callable[[], T]) -> T:
    """find(), or, when what it looks for is missing (FixtureMissing), a skip whose one-line reason
    says what is missing and how to get it. Under CI=true the same is a failure: CI must run every
    test, so a missing fixture cannot pass as a skip. A wrong file (bad checksum) always errors."""
    try:
        return find()
    except fixtures.FixtureMissing as missing:
        if in_ci():
            pytest.fail(f"missing fixture (CI=true, so not skipped): {missing}", pytrace=False)
        pytest.skip(f"missing fixture: {missing}")


def run_module(module: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs `python -m module args` from the repository root, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=REPO_ROOT, env={**os.environ, **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    """The in-repo sample (datasets/fashion-mnist-sample), checksums verified."""
    return require_fixture(fixtures.sample_dir)


@pytest.fixture(scope="session")
def data_dir(sample_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample, ingested."""
    from trainer.ingest import ingest

    out = tmp_path_factory.mktemp("ingested") / "data"
    ingest(str(sample_dir), out)
    return out


def train_args(model: str, data_dir: Path, work_dir: Path, *extra: str) -> list[str]:
    return ["--model", model, "--data-dir", str(data_dir),
            "--checkpoint-dir", str(work_dir / "checkpoints"),
            "--export-dir", str(work_dir / "export"), *extra]


@pytest.fixture(scope="session")
def two_worker_export(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `cnn` trained for a few steps by two real worker processes with generated TF_CONFIG."""
    from trainer.launch import run_workers

    work_dir = tmp_path_factory.mktemp("two-workers")
    run_workers(train_args("cnn", data_dir, work_dir, "--epochs", "2", "--steps-per-epoch", "6"),
                num_workers=2, log_dir=work_dir / "logs")
    return work_dir / "export"


@pytest.fixture(scope="session")
def one_worker_export(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `cnn_batchnorm` trained for a few steps by one local worker (no TF_CONFIG)."""
    work_dir = tmp_path_factory.mktemp("one-worker")
    result = run_module("trainer.train", *train_args(
        "cnn_batchnorm", data_dir, work_dir, "--epochs", "1", "--steps-per-epoch", "3"))
    assert result.returncode == 0, result.stderr[-3000:]
    return work_dir / "export"


@pytest.fixture(scope="module")
def published_repo(two_worker_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with `two_worker_export` as fmnist version 1; each test module its own."""
    repo = tmp_path_factory.mktemp("models")
    shutil.copytree(two_worker_export, repo / "fmnist" / "1")
    return repo


@pytest.fixture(scope="session")
def validate_crd() -> Callable[[str, dict], list[str]]:
    """validate(crd file, manifest) -> errors, strict fields: the pinned upstream CRDs of
    testdata/pins.py (names as under ../shared/schemas), from ../shared or the fixtures cache."""
    found: dict[str, Path] = {}  # each file's checksum is verified once per session

    def validate(crd: str, manifest: dict) -> list[str]:
        if crd not in found:
            found[crd] = require_fixture(lambda: fixtures.resolve(fixtures.pin_for(crd)))
        return validate_manifest(found[crd], manifest, strict=True)

    return validate
