"""The published model's accuracy on images it never saw, measured as an outside caller would.

    python -m benchmarks.holdout_accuracy (--model-dir VERSION_DIR | --model-repo REPO
        [--model-name fmnist]) [--holdout-dir DIR] [--png-dir DIR] [--json]

The 300 images of datasets/fashion-mnist-holdout (real Fashion-MNIST images, none of them in the
sample that training, validation and selection read) are written as PNG files, and their bytes are
sent to the SavedModel's `serving_default` signature (`image_bytes`), the one TF Serving, KServe and
our server expose: decoding and resizing happen in the model's graph, as in production. Prints the
accuracy with its sample size and the accuracy per class. With --model-repo, the highest committed
version is measured. Only TensorFlow, NumPy and Pillow: no training code, so no preprocessing of
ours can hide a difference between what was trained and what is served.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import tensorflow as tf
from PIL import Image

from common import cli
from trainer import model_repository
from trainer.fashion_mnist import CLASS_NAMES, NUM_CLASSES, DatasetError, Split, read_split
from trainer.serving_contract import IMAGE_BYTES_INPUT, SERVING_SIGNATURE

HOLDOUT_DIR = Path(__file__).resolve().parents[1] / "datasets" / "fashion-mnist-holdout"  # in the repo
HOLDOUT_SPLIT = "test"  # the holdout's files carry the official test split's names


def write_pngs(split: Split, directory: Path) -> list[Path]:
    """One lossless greyscale PNG per image, `<index>-<class id>.png`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, (image, label) in enumerate(zip(split.images, split.labels)):
        path = directory / f"{index:04d}-{label}.png"
        buffer = io.BytesIO()
        Image.fromarray(image[..., 0], mode="L").save(buffer, format="PNG")
        path.write_bytes(buffer.getvalue())
        paths.append(path)
    return paths


def predicted_classes(model_dir: Path, pngs: Sequence[Path]) -> np.ndarray:
    """Class ids from the SavedModel's serving signature, fed the files' bytes."""
    try:
        serve = tf.saved_model.load(str(model_dir)).signatures[SERVING_SIGNATURE]
    except (OSError, ValueError, KeyError) as error:
        raise cli.UsageError(f"{model_dir}: not a SavedModel with a '{SERVING_SIGNATURE}' signature "
                             f"({type(error).__name__})") from None
    images = tf.constant([path.read_bytes() for path in pngs])
    return serve(**{IMAGE_BYTES_INPUT: images})["class_id"].numpy()


def score(predicted: np.ndarray, labels: np.ndarray) -> dict:
    """Accuracy, sample size and accuracy per class name."""
    correct = predicted == labels
    return {
        "accuracy": float(correct.mean()),
        "examples": len(labels),
        "per_class": {CLASS_NAMES[c]: float(correct[labels == c].mean())
                      for c in range(NUM_CLASSES) if (labels == c).any()},
    }


def evaluate(model_dir: Path, holdout_dir: Path, png_dir: Path) -> dict:
    holdout = read_split(holdout_dir, HOLDOUT_SPLIT)
    pngs = write_pngs(holdout, png_dir)
    result = score(predicted_classes(model_dir, pngs), holdout.labels.astype(np.int64))
    return {"model_dir": str(model_dir), **result}


def model_dir_of(args: argparse.Namespace) -> Path:
    """--model-dir as given, or the highest committed version under --model-repo."""
    if args.model_dir is not None:
        return args.model_dir
    version = model_repository.latest_version(args.model_repo, args.model_name)
    if version is None:
        raise cli.UsageError(f"{args.model_repo / args.model_name}: no committed version to evaluate")
    return args.model_repo / args.model_name / str(version)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="holdout_accuracy", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model-dir", type=Path, help="a SavedModel (a published version)")
    which.add_argument("--model-repo", type=Path, help="measure its highest committed version")
    parser.add_argument("--model-name", default="fmnist")
    parser.add_argument("--holdout-dir", type=Path, default=HOLDOUT_DIR)
    parser.add_argument("--png-dir", type=Path, help="keep the PNG files here (default: a temporary "
                        "directory, removed afterwards)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    if args.model_dir is not None and not (args.model_dir / "saved_model.pb").is_file():
        raise cli.UsageError(f"{args.model_dir}: no SavedModel here (no saved_model.pb)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    model_dir = model_dir_of(args)
    if args.png_dir is not None:
        result = evaluate(model_dir, args.holdout_dir, args.png_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="holdout-png-") as scratch:
            result = evaluate(model_dir, args.holdout_dir, Path(scratch))
    if args.json:
        print(json.dumps(result))
        return
    for name, accuracy in result["per_class"].items():
        print(f"  {name:<12} {accuracy:.3f}")
    print(f"holdout accuracy {result['accuracy']:.4f} on {result['examples']} unseen images "
          f"(PNG through '{SERVING_SIGNATURE}'): {model_dir}")


def run(argv: Sequence[str] | None = None) -> None:
    """`python -m benchmarks.holdout_accuracy`: a user's mistake is one line."""
    cli.run("holdout_accuracy", main, argv, expected=(DatasetError,))


if __name__ == "__main__":
    run()
