"""benchmarks.variant_cv: the cross-validation that chose the demo's variants. Every image is scored
by a model that never trained on it, and the folds keep the classes balanced."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REPO_ROOT
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import variant_cv
from common import cli
from trainer.fashion_mnist import NUM_CLASSES, Split, read_split

SAMPLE = REPO_ROOT / "datasets" / "fashion-mnist-sample"


@given(counts=st.lists(st.integers(0, 30), min_size=NUM_CLASSES, max_size=NUM_CLASSES),
       folds=st.integers(2, 10))
def test_folds_partition_the_images_with_each_class_spread_evenly(counts, folds):
    labels = np.repeat(np.arange(NUM_CLASSES), counts)
    fold_of = variant_cv.fold_of_each_image(labels, folds)
    assert fold_of.shape == labels.shape
    assert set(fold_of.tolist()) <= set(range(folds))
    for class_id, count in enumerate(counts):
        per_fold = np.bincount(fold_of[labels == class_id], minlength=folds)
        assert per_fold.max() - per_fold.min() <= 1
        assert per_fold.sum() == count
    np.testing.assert_array_equal(fold_of, variant_cv.fold_of_each_image(labels, folds))


class Recorder:
    """Stands in for training: remembers what each model trained on; its logits name each image."""

    def __init__(self):
        self.trained_on: list[np.ndarray] = []

    def __call__(self, variant, training: Split, seed, epochs):
        self.trained_on.append(training.images[:, 0, 0, 0].copy())
        return self

    def predict(self, images, verbose=0):
        logits = np.full((len(images), NUM_CLASSES), -50.0, dtype=np.float32)
        logits[np.arange(len(images)), images[:, 0, 0, 0].astype(int) % NUM_CLASSES] = 50.0
        return logits


def test_each_image_is_predicted_by_the_model_that_did_not_train_on_it(monkeypatch):
    labels = np.arange(40) % NUM_CLASSES
    images = np.zeros((40, 28, 28, 1), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(40)  # each image carries its index
    recorder = Recorder()
    monkeypatch.setattr(variant_cv, "trained_model", recorder)
    fold_of = variant_cv.fold_of_each_image(labels, 4)

    probabilities = variant_cv.out_of_fold_probabilities("cnn", Split(images, labels), fold_of, 1, 1)

    assert len(recorder.trained_on) == 4
    for fold, trained_on in enumerate(recorder.trained_on):
        assert sorted(trained_on.tolist()) == np.flatnonzero(fold_of != fold).tolist()
    np.testing.assert_array_equal(probabilities.argmax(axis=1), np.arange(40) % NUM_CLASSES)


@pytest.mark.parametrize("argv, message", [
    (["--folds", "1"], "--folds: must be at least 2"),
    (["--variants", "resnet"], "invalid choice"),
    (["--seeds", "0"], "--seeds"),
])
def test_bad_arguments_are_one_line_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.run("variant_cv", variant_cv.main, argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # trains every fold
def test_cross_validates_the_sample_and_its_ensemble(capsys):
    variant_cv.main(["--variants", "cnn", "cnn_gap", "--folds", "2", "--seeds", "1", "--epochs", "1",
                     "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == len(read_split(SAMPLE, "train")) and report["folds"] == 2
    assert set(report["results"]) == {"cnn", "cnn_gap", "ensemble"}
    for result in report["results"].values():
        assert len(result["accuracy_per_seed"]) == 1
        assert 0.0 <= result["mean_accuracy"] <= 1.0
    assert report["results"]["cnn"]["mean_accuracy"] > 0.3  # one epoch learns something
