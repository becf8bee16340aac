"""Shared fixtures: the real Fashion-MNIST sample, the upstream CRDs, subprocess runners, and
trained exports."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from testdata import fixtures
from testdata.crd_schema import validate_manifest
from tools.control_plane.cluster import NAMESPACE_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
# The tier's tests (make test-cluster) and its end-to-end run on the real node (make test-e2e).
TIER_TESTS = (REPO_ROOT / "tests" / "cluster", REPO_ROOT / "tests" / "e2e_node")
# Values of CI that mean "every test must run": GitHub Actions and the project's CI set CI=true.
CI_VALUES = {"true", "1", "yes"}
T = TypeVar("T")


# Fixtures that train or export a model: a test that uses one, directly or through another fixture,
# is slow (`make test-fast` leaves it out), whatever its module.
TRAINING_FIXTURES = frozenset({"two_worker_export", "one_worker_export", "published_repo", "constant_export"})


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """tests/cluster/ and tests/e2e_node/ run only in the control-plane tier's own namespaces, with its
    plugin: `make test-cluster` and `make test-e2e` (python -m tools.control_plane test|e2e); any other
    run leaves them out."""
    if collection_path in TIER_TESTS and os.environ.get(NAMESPACE_ENV) != "1":
        return True
    return None


def pytest_unconfigure() -> None:
    """As a program's exit (common.cli.run): the interpreter's last garbage collections skip what every
    test process has loaded (TensorFlow, MLflow, Pulumi) only to end."""
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


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


# trainer.train's line at the end of each epoch, "train[worker:0]: epoch 2/6 loss=...".
EPOCH_END = re.compile(r"\]: epoch (\d+)/\d+ loss=")


def names_a_path(message: str, names: set[str]) -> bool:
    """A config error's message starts with the path of one of `names` (the name, then ": ", "." or
    "["); a key may itself hold ": " (raw={': ': {}}), so the message is not split at it."""
    return any(message.startswith((f"{name}: ", f"{name}.", f"{name}[")) for name in names)


def epochs_logged(log_text: str) -> list[int]:
    """The numbers of the epochs a trainer's log says ended, in order."""
    return [int(match.group(1)) for match in EPOCH_END.finditer(log_text)]


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port whose connections are refused while the block runs: bound, so that no other
    process can take it, but not listening (a port merely found free could be taken meanwhile)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    """The in-repo sample (datasets/fashion-mnist-sample), checksums verified."""
    return require_fixture(fixtures.sample_dir)


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A directory `build` fills once per test run, however many pytest-xdist workers ask: the first
    builds it under a lock, the others wait and reuse it (a trained export costs a minute)."""
    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    root = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.getbasetemp()
    directory, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            build(directory)
            done.touch()
    return directory


@pytest.fixture(scope="session")
def data_dir(sample_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample, ingested."""
    from trainer.ingest import ingest

    ingested = built_once(tmp_path_factory, "ingested", lambda out: ingest(str(sample_dir), out / "data"))
    return ingested / "data"


def train_args(model: str, data_dir: Path, work_dir: Path, *extra: str) -> list[str]:
    return ["--model", model, "--data-dir", str(data_dir),
            "--checkpoint-dir", str(work_dir / "checkpoints"),
            "--export-dir", str(work_dir / "export"), *extra]


@pytest.fixture(scope="session")
def two_worker_export(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `cnn` trained for a few steps by two real worker processes with generated TF_CONFIG."""
    from trainer.launch import run_workers

    def train(work_dir: Path) -> None:
        run_workers(train_args("cnn", data_dir, work_dir, "--epochs", "2", "--steps-per-epoch", "6"),
                    num_workers=2, log_dir=work_dir / "logs")

    return built_once(tmp_path_factory, "two-workers", train) / "export"


@pytest.fixture(scope="session")
def one_worker_export(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `cnn_batchnorm` trained for a few steps by one local worker (no TF_CONFIG), in mixed precision
    (float16 compute, as on a GPU, here on the CPU): what selects, ensembles and serves it sees such an
    export too."""
    def train(work_dir: Path) -> None:
        result = run_module("trainer.train", *train_args(
            "cnn_batchnorm", data_dir, work_dir, "--epochs", "1", "--steps-per-epoch", "3",
            "--mixed-precision", "on"))
        assert result.returncode == 0, result.stderr[-3000:]

    return built_once(tmp_path_factory, "one-worker", train) / "export"


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
