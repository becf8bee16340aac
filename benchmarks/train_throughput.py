"""Benchmark: training throughput of our entry point against a plain `model.fit` on arrays.

    python -m benchmarks.train_throughput [--images N] [--epochs E] [--batch-size B]

For each variant, on one worker and the CPU: (a) `python -m trainer.train` as users run it (tf.data
pipeline with augmentation, MultiWorkerMirroredStrategy, BackupAndRestore, TensorBoard, learning
rate schedule), its examples per second from its metrics.json; (b) the same model compiled the
same way, `model.fit` on in-memory NumPy arrays with no callbacks. Both are steady-state figures:
the first epoch, which traces and compiles, is left out. Target: (a) / (b) >= 0.9.

The data is the Fashion-MNIST sample (or random pixels without it) tiled to N training images,
ingested through trainer.ingest, so that an epoch is long enough to measure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tf_keras as keras

from trainer import data, models
from trainer.fashion_mnist import SPLIT_FILES, Split, load_split, read_split, write_split
from trainer.ingest import ingest
from trainer.train import DEFAULT_LEARNING_RATE, compiled_model

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "datasets" / "fashion-mnist-sample"  # in the repo
TARGET_RATIO = 0.9


class EpochTimer(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.seconds: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._started)


def source_images(count: int) -> Split:
    """The sample tiled to `count` images, or random pixels when the sample is absent."""
    if (SAMPLE_DIR / SPLIT_FILES["train"][0]).is_file():
        sample = read_split(SAMPLE_DIR, "train")
        repeats = -(-count // len(sample))
        return Split(np.tile(sample.images, (repeats, 1, 1, 1))[:count],
                     np.tile(sample.labels, repeats)[:count])
    rng = np.random.default_rng(0)
    return Split(rng.integers(0, 256, (count, 28, 28, 1), dtype=np.uint8),
                 rng.integers(0, 10, count, dtype=np.uint8))


def make_dataset(count: int, work_dir: Path) -> Path:
    source = work_dir / "source"
    source.mkdir()
    for split, size in (("train", count), ("test", count // 10)):
        images = source_images(size)
        write_split(source, split, images.images, images.labels)
    ingest(str(source), work_dir / "data")
    return work_dir / "data"


def entry_point_throughput(model: str, data_dir: Path, work_dir: Path, epochs: int,
                           batch_size: int) -> float:
    run_dir = work_dir / f"entry-{model}"
    subprocess.run(
        [sys.executable, "-m", "trainer.train", "--model", model, "--data-dir", str(data_dir),
         "--checkpoint-dir", str(run_dir / "checkpoints"), "--export-dir", str(run_dir / "export"),
         "--epochs", str(epochs), "--batch-size-per-replica", str(batch_size)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return json.loads((run_dir / "export" / "metrics.json").read_text())["examples_per_second"]


def plain_fit_throughput(model_name: str, train: Split, epochs: int, batch_size: int) -> float:
    model = compiled_model(model_name, DEFAULT_LEARNING_RATE)
    timer = EpochTimer()
    steps = len(train) // batch_size
    model.fit(train.images[: steps * batch_size], train.labels[: steps * batch_size],
              batch_size=batch_size, epochs=epochs, callbacks=[timer], verbose=0)
    timed = timer.seconds[1:]
    return steps * batch_size * len(timed) / sum(timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Close to the full dataset's size (exactly 60,000 would have to be the official files).
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work_dir = Path(tmp)
        data_dir = make_dataset(args.images, work_dir)
        train, _ = data.split_validation(load_split(data_dir, "train"))
        print(f"bench-train: {len(train)} training images, batch {args.batch_size}, "
              f"{args.epochs} epochs (first left out), one worker, CPU")
        print(f"{'variant':<15} {'entry point ex/s':>16} {'plain fit ex/s':>15} {'ratio':>6}")
        ratios = []
        for name in models.MODELS:
            ours = entry_point_throughput(name, data_dir, work_dir, args.epochs, args.batch_size)
            plain = plain_fit_throughput(name, train, args.epochs, args.batch_size)
            ratios.append(ours / plain)
            verdict = "ok" if ratios[-1] >= TARGET_RATIO else f"below {TARGET_RATIO}"
            print(f"{name:<15} {ours:>16.0f} {plain:>15.0f} {ratios[-1]:>6.2f}  {verdict}")
    print(f"bench-train: lowest ratio {min(ratios):.2f} (target >= {TARGET_RATIO})")


if __name__ == "__main__":
    main()
