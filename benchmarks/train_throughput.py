"""Benchmark: training throughput of our entry point against a plain `model.fit` on arrays, and the
two distributed strategies side by side.

    python -m benchmarks.train_throughput [--table entry-point|strategies|both] [--images N]
        [--epochs E] [--batch-size B] [--strategy-epochs E] [--sample-repeats REPEATS]
        [--global-batch G] [--slow-percent P]

For each variant, on one worker and the CPU: (a) `python -m trainer.train` as users run it (tf.data
pipeline with augmentation, MultiWorkerMirroredStrategy, BackupAndRestore, TensorBoard, learning
rate schedule), its examples per second from its metrics.json; (b) the same model compiled the
same way, `model.fit` on in-memory NumPy arrays with no callbacks. Both are steady-state figures:
the first epoch, which traces and compiles, is left out. Target: (a) / (b) >= 0.9.

The data is the Fashion-MNIST sample (or random pixels without it) tiled to N training images,
ingested through trainer.ingest, so that an epoch is long enough to measure.

Strategies table: one variant (cnn), the sample's training images tiled REPEATS times, so that an
epoch is long enough to measure (accuracy: on the sample's 100 test images, which no run trains on),
the same epochs and the same global batch (the examples behind
one update of the weights: the same --batch-size-per-replica) for: one worker alone; sync, 2 workers
(MultiWorkerMirroredStrategy, half the global batch each); parameter-server, 2 workers + 1 PS
(ParameterServerStrategy, each step one worker's whole global batch). Each runs through
`trainer.launch` as users run it; then sync and parameter-server again with the last worker paused
P% of the time (`--slow-worker-percent`), to show how each degrades when one worker is slow.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tf_keras as keras

from trainer import data, export, models
from trainer.dataset_files import SPLIT_FILES
from trainer.fashion_mnist import Split, load_split, read_split, write_split
from trainer.ingest import ingest
from trainer.train import DEFAULT_LEARNING_RATE, compiled_model

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "datasets" / "fashion-mnist-sample"  # in the repo
TARGET_RATIO = 0.9
STRATEGY_VARIANT = "cnn"
WORKERS = 2


@dataclasses.dataclass(frozen=True)
class Setup:
    """One row of the strategies table: how trainer.launch runs it."""
    name: str
    workers: int
    parameter_servers: int = 0
    slow_percent: int = 0


@dataclasses.dataclass(frozen=True)
class Measured:
    examples_per_second: float
    wall_seconds: float
    test_accuracy: float


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


def run_setup(setup: Setup, data_dir: Path, work_dir: Path, epochs: int, global_batch: int) -> Measured:
    """Trains STRATEGY_VARIANT as `setup` says; its steady-state examples/s, wall time, test accuracy."""
    run_dir = work_dir / setup.name.replace(" ", "-").replace(",", "")
    train_args = ["--model", STRATEGY_VARIANT, "--data-dir", str(data_dir),
                  "--checkpoint-dir", str(run_dir / "checkpoints"), "--export-dir", str(run_dir / "export"),
                  "--epochs", str(epochs), "--batch-size-per-replica",
                  str(global_batch // setup.workers)]
    launch = [sys.executable, "-m", "trainer.launch", "--workers", str(setup.workers),
              "--log-dir", str(run_dir / "logs"), "--slow-worker-percent", str(setup.slow_percent)]
    if setup.parameter_servers:
        launch += ["--parameter-servers", str(setup.parameter_servers)]
    started = time.perf_counter()
    subprocess.run([*launch, "--", *train_args], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    metrics = json.loads((run_dir / "export" / "metrics.json").read_text())
    test = load_split(data_dir, "test")
    probabilities = export.predict_pixels(run_dir / "export", test.images)
    accuracy, _ = export.accuracy_and_loss(probabilities, test.labels)
    return Measured(metrics["examples_per_second"], wall, accuracy)


def tiled_sample(work_dir: Path, repeats: int) -> Path:
    """The sample's training images `repeats` times over, beside its own test images, ingested."""
    source = work_dir / "tiled-source"
    source.mkdir()
    train = read_split(SAMPLE_DIR, "train")
    write_split(source, "train", np.tile(train.images, (repeats, 1, 1, 1)), np.tile(train.labels, repeats))
    test = read_split(SAMPLE_DIR, "test")
    write_split(source, "test", test.images, test.labels)
    ingest(str(source), work_dir / "tiled-data")
    return work_dir / "tiled-data"


def strategies_table(work_dir: Path, epochs: int, global_batch: int, slow_percent: int,
                     repeats: int) -> None:
    data_dir = tiled_sample(work_dir, repeats)
    setups = [Setup("1 worker", 1), Setup("sync, 2 workers", WORKERS),
              Setup("parameter-server, 2 workers + 1 PS", WORKERS, parameter_servers=1)]
    slowed = [dataclasses.replace(setup, name=f"{setup.name}, 1 slowed", slow_percent=slow_percent)
              for setup in setups[1:]]
    train, _ = data.split_validation(load_split(data_dir, "train"))
    print(f"bench-train strategies: {STRATEGY_VARIANT}, {len(train)} training images (the sample x "
          f"{repeats}), accuracy on the sample's {len(load_split(data_dir, 'test'))} test images, {epochs} "
          f"epochs (first left out of ex/s), global batch {global_batch}; slowed: the last worker "
          f"paused {slow_percent}% of the time")
    print(f"{'setup':<46} {'ex/s':>7} {'wall s':>7} {'test acc':>8} {'ex/s vs unslowed':>17}")
    measured: dict[str, Measured] = {}
    for setup in [*setups, *slowed]:
        result = measured[setup.name] = run_setup(setup, data_dir, work_dir, epochs, global_batch)
        unslowed = measured.get(setup.name.removesuffix(", 1 slowed")) if setup.slow_percent else None
        degrade = f"{result.examples_per_second / unslowed.examples_per_second:>17.2f}" if unslowed else ""
        print(f"{setup.name:<46} {result.examples_per_second:>7.0f} {result.wall_seconds:>7.1f} "
              f"{result.test_accuracy:>8.3f} {degrade}", flush=True)


def entry_point_table(args: argparse.Namespace, work_dir: Path) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=["entry-point", "strategies", "both"], default="both")
    # Close to the full dataset's size (exactly 60,000 would have to be the official files).
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--strategy-epochs", type=int, default=4)
    parser.add_argument("--sample-repeats", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--slow-percent", type=int, default=50)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        if args.table in ("entry-point", "both"):
            entry_point_table(args, Path(tmp))
        if args.table in ("strategies", "both"):
            strategies_table(Path(tmp), args.strategy_epochs, args.global_batch, args.slow_percent,
                             args.sample_repeats)


if __name__ == "__main__":
    main()
