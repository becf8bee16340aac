"""Benchmark: each variant's accuracy by k-fold cross-validation on the sample's training images, the
evidence behind which variants `make demo` trains (50 validation images cannot tell apart two
variants a few points apart: one image is 2 points).

    python -m benchmarks.variant_cv [--variants NAME...] [--folds 5] [--seeds 1 2] [--epochs E]
        [--json]

The sample's 500 training images (never its test split, never the holdout) are split into `folds`
folds, each class spread evenly over them. Each variant is trained once per fold and seed, on the
other folds, with the trainer's recipe (its model, loss, augmentation, global batch, learning rate
and cosine schedule; by default as many epochs as trainer.train gives that many images), in this
one process on the CPU, and scored on the fold it never saw: every image is predicted once per
seed by a model that did not learn it. Prints per variant the accuracy over all images for each
seed and their mean, and the same for the ensemble of all the variants (the mean of their
probabilities, as trainer.select builds it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from common import cli
from trainer import data, train
from trainer.fashion_mnist import NUM_CLASSES, Split, read_split
from trainer.variants import VARIANTS

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "datasets" / "fashion-mnist-sample"  # in the repo
FOLD_SEED = 0
DEFAULT_FOLDS = 5
DEFAULT_SEEDS = (1, 2)
GLOBAL_BATCH = 32  # make demo's: 2 workers x 16


def fold_of_each_image(labels: np.ndarray, folds: int, seed: int = FOLD_SEED) -> np.ndarray:
    """The fold (0 .. folds - 1) of each image: each class's images dealt round-robin in a shuffled
    order, so that every fold holds about the same number of each class."""
    rng = np.random.default_rng(seed)
    fold_of = np.empty(len(labels), dtype=int)
    for class_id in range(NUM_CLASSES):
        members = rng.permutation(np.flatnonzero(labels == class_id))
        fold_of[members] = np.arange(len(members)) % folds
    return fold_of


def out_of_fold_probabilities(variant: str, images: Split, fold_of: np.ndarray, seed: int,
                              epochs: int | None) -> np.ndarray:
    """Each image's class probabilities from the model trained on the folds without it."""
    probabilities = np.zeros((len(images), NUM_CLASSES), dtype=np.float32)
    for fold in np.unique(fold_of):
        held_out = fold_of == fold
        training = Split(images.images[~held_out], images.labels[~held_out])
        model = trained_model(variant, training, seed, epochs)
        logits = model.predict(images.images[held_out].astype(np.float32), verbose=0)
        probabilities[held_out] = tf.nn.softmax(logits).numpy()
    return probabilities


def trained_model(variant: str, training: Split, seed: int, epochs: int | None) -> keras.Model:
    """trainer.train's recipe in one process: the same model, loss, data pipeline and schedule."""
    keras.utils.set_random_seed(seed)
    epochs = epochs or max(train.MIN_EPOCHS, math.ceil(train.MIN_EXAMPLES_SEEN / len(training)))
    steps_per_epoch = max(1, len(training) // GLOBAL_BATCH)
    learning_rate = train.scaled_learning_rate(train.DEFAULT_LEARNING_RATE, GLOBAL_BATCH)
    model = train.compiled_model(variant, learning_rate, steps_per_execution=steps_per_epoch)
    schedule = train.cosine_schedule(learning_rate, epochs)
    model.fit(data.training_dataset(training, GLOBAL_BATCH), epochs=epochs,
              steps_per_epoch=steps_per_epoch, verbose=0,
              callbacks=[keras.callbacks.LearningRateScheduler(schedule)])
    return model


def accuracy(probabilities: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(probabilities.argmax(axis=1) == labels))


def cross_validate(variants: Sequence[str], images: Split, folds: int, seeds: Sequence[int],
                   epochs: int | None) -> dict:
    """Accuracy per variant and seed, and of the variants' ensemble, on out-of-fold predictions."""
    fold_of = fold_of_each_image(images.labels, folds)
    results: dict[str, dict] = {}
    per_seed: dict[str, list[np.ndarray]] = {}
    for variant in variants:
        started = time.perf_counter()
        per_seed[variant] = [out_of_fold_probabilities(variant, images, fold_of, seed, epochs)
                             for seed in seeds]
        results[variant] = summary(per_seed[variant], images.labels,
                                   seconds=time.perf_counter() - started)
        print(f"variant_cv: {variant}: {results[variant]['mean_accuracy']:.4f}", file=sys.stderr,
              flush=True)
    if len(variants) > 1:
        ensemble = [np.mean([per_seed[variant][index] for variant in variants], axis=0)
                    for index in range(len(seeds))]
        results["ensemble"] = summary(ensemble, images.labels)
    return {"images": len(images), "folds": folds, "seeds": list(seeds), "results": results}


def summary(probabilities_per_seed: Sequence[np.ndarray], labels: np.ndarray,
            seconds: float | None = None) -> dict:
    accuracies = [accuracy(probabilities, labels) for probabilities in probabilities_per_seed]
    result = {"accuracy_per_seed": accuracies, "mean_accuracy": float(np.mean(accuracies))}
    if seconds is not None:
        result["seconds"] = seconds
    return result


def print_table(report: dict) -> None:
    seeds = report["seeds"]
    print(f"{report['folds']}-fold cross-validation on {report['images']} training images "
          f"(each predicted by a model that did not learn it), seeds {', '.join(map(str, seeds))}")
    print(f"{'variant':<16} " + " ".join(f"{'seed ' + str(seed):>8}" for seed in seeds)
          + f" {'mean':>8} {'train time':>11}")
    for name, result in report["results"].items():
        seconds = f"{result['seconds']:.0f}s" if "seconds" in result else "(averaged)"
        print(f"{name:<16} " + " ".join(f"{value:>8.4f}" for value in result["accuracy_per_seed"])
              + f" {result['mean_accuracy']:>8.4f} {seconds:>11}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="variant_cv", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--folds", type=cli.positive_int, default=DEFAULT_FOLDS)
    parser.add_argument("--seeds", type=cli.positive_int, nargs="+", default=list(DEFAULT_SEEDS))
    parser.add_argument("--epochs", type=cli.positive_int,
                        help="default: trainer.train's for the images each model trains on")
    parser.add_argument("--sample-dir", type=Path, default=SAMPLE_DIR,
                        help="IDX files whose train split is cross-validated")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args(argv)
    if args.folds < 2:
        raise cli.UsageError(f"--folds: must be at least 2, got {args.folds}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    images = read_split(args.sample_dir, "train")
    if np.bincount(images.labels, minlength=NUM_CLASSES).min() < args.folds:
        raise cli.UsageError(f"--folds {args.folds}: some class of {args.sample_dir} has fewer images")
    report = cross_validate(args.variants, images, args.folds, args.seeds, args.epochs)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)


if __name__ == "__main__":
    cli.run("variant_cv", main)
