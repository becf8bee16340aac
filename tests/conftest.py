"""Shared fixtures: the real Fashion-MNIST sample, subprocess runners, and trained exports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = REPO_ROOT.parent / "shared"
SAMPLE_DIR = SHARED_DIR / "datasets" / "fashion-mnist-sample"


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
    if not (SAMPLE_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"the Fashion-MNIST sample is not at {SAMPLE_DIR}")
    return SAMPLE_DIR


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


SCHEMAS_DIR = SHARED_DIR / "schemas"


@pytest.fixture(scope="session")
def validate_crd():
    """validate(crd file, manifest) -> errors: the upstream CRDs of ../shared/schemas, strict fields."""
    if not (SCHEMAS_DIR / "check_crd_schema.py").is_file():
        pytest.skip(f"the upstream schemas are not at {SCHEMAS_DIR} (../shared is absent)")
    sys.path.insert(0, str(SCHEMAS_DIR))
    from check_crd_schema import validate_manifest

    def validate(crd: str, manifest: dict) -> list[str]:
        return validate_manifest(str(SCHEMAS_DIR / crd), manifest, strict=True)

    return validate
