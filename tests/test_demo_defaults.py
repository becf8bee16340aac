"""The Makefile's demo defaults: which variants `make demo` trains, and what `make evaluate` scores."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from trainer.variants import VARIANTS


def dry_run(*args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", *args, "INSTALLED=", f"PYTHON={sys.executable}"],
        cwd=REPO_ROOT, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_demo_trains_every_variant_but_the_skipped_ones():
    expected = " ".join(name for name in VARIANTS if name not in ("cnn_dropout", "cnn_batchnorm", "cnn_vgg"))
    assert f"--variants {expected} --batch-size-per-replica" in dry_run("demo")
    assert f"--variants {' '.join(VARIANTS)} --batch-size" in dry_run("demo", "DEMO_SKIP=")


def test_evaluate_scores_the_demo_repository_on_the_holdout():
    line = dry_run("evaluate", "DEMO_DIR=/tmp/x").strip()
    assert line.endswith("-m benchmarks.holdout_accuracy --model-repo /tmp/x/models")
