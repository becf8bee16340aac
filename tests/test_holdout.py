"""The holdout set (datasets/fashion-mnist-holdout) and the outside evaluator that scores a published
SavedModel on it through the `image_bytes` serving signature."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tf_keras as keras
from conftest import REPO_ROOT, last_line, run_module
from PIL import Image

from benchmarks import holdout_accuracy
from trainer import export
from trainer.atomic import commit
from trainer.fashion_mnist import read_split

pytestmark = pytest.mark.slow  # scores a trained model

HOLDOUT = REPO_ROOT / "datasets" / "fashion-mnist-holdout"
SAMPLE = REPO_ROOT / "datasets" / "fashion-mnist-sample"
ALWAYS = 3  # the class the constant model below predicts: 30 of the 300 holdout images are Dresses


def cut_module():
    spec = importlib.util.spec_from_file_location("holdout_cut", HOLDOUT / "cut.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def constant_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SavedModel with the serving signatures whose logits always favour class ALWAYS."""
    dense = keras.layers.Dense(10, kernel_initializer="zeros",
                               bias_initializer=keras.initializers.Constant(np.eye(10)[ALWAYS]))
    model = keras.Sequential([keras.layers.Input((28, 28, 1)), keras.layers.Flatten(), dense])
    directory = tmp_path_factory.mktemp("constant") / "1"
    export.save_for_serving(model, str(directory))
    return directory


def test_holdout_files_are_the_pinned_ones_30_per_class_none_in_the_sample():
    for name, expected in cut_module().FILE_SHA256.items():
        assert hashlib.sha256((HOLDOUT / name).read_bytes()).hexdigest() == expected
    holdout = read_split(HOLDOUT, "test")
    assert np.bincount(holdout.labels).tolist() == [30] * 10
    sample = {image.tobytes() for split in ("train", "test") for image in read_split(SAMPLE, split).images}
    assert not any(image.tobytes() in sample for image in holdout.images)
    assert len({image.tobytes() for image in holdout.images}) == 300


def test_pngs_hold_the_exact_pixels(tmp_path):
    holdout = read_split(HOLDOUT, "test")
    paths = holdout_accuracy.write_pngs(holdout, tmp_path)
    assert len(paths) == 300
    decoded = np.stack([np.asarray(Image.open(path)) for path in paths])
    np.testing.assert_array_equal(decoded, holdout.images[..., 0])


def test_scores_a_model_through_its_image_bytes_signature(constant_export, tmp_path):
    result = holdout_accuracy.evaluate(constant_export, HOLDOUT, tmp_path)
    assert result["examples"] == 300
    assert result["accuracy"] == pytest.approx(0.1)
    assert result["per_class"]["Dress"] == 1.0 and result["per_class"]["Bag"] == 0.0


def test_command_measures_the_latest_committed_version(constant_export, tmp_path):
    repo = tmp_path / "models"
    shutil.copytree(constant_export, repo / "fmnist" / "1")
    commit(repo / "fmnist" / "1", {"model_name": "fmnist", "version": 1})
    (repo / "fmnist" / "2").mkdir()  # uncommitted: a publish still under way

    result = run_module("benchmarks.holdout_accuracy", "--model-repo", repo, "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(last_line(result.stdout))
    assert (measured["accuracy"], measured["examples"]) == (pytest.approx(0.1), 300)
    assert measured["model_dir"].endswith("fmnist/1")


def test_command_measures_a_model_directory_in_words(constant_export, capsys):
    holdout_accuracy.run(["--model-dir", str(constant_export)])  # in process: its entry point
    assert last_line(capsys.readouterr().out).startswith("holdout accuracy 0.1000 on 300 unseen images")


def test_a_directory_without_a_saved_model_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        holdout_accuracy.run(["--model-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert last_line(capsys.readouterr().err) == (
        f"holdout_accuracy: error: {tmp_path}: no SavedModel here (no saved_model.pb)")
