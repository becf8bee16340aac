"""Train one CNN variant across workers, synchronously or with parameter servers, and export it.

    python -m trainer.train --model NAME --data-dir DATA_DIR --checkpoint-dir CKPT \\
        --export-dir EXPORT [--epochs N] [--batch-size-per-replica B] [--steps-per-epoch S] \\
        [--learning-rate LR] [--mixed-precision auto|on|off] [--gpus N]

The cluster comes from TF_CONFIG, as TFJob sets it in every pod, or from what a TrainJob's pod
knows (trainer.cluster builds TF_CONFIG from it); without either this is one local worker.
Synchronous (worker tasks only, MultiWorkerMirroredStrategy): every worker runs the same code
and the same number of steps; only the chief writes the export. With `ps` tasks
(ParameterServerStrategy, trainer.parameter_server): workers and parameter servers only serve, and
the chief coordinates the steps and writes the export. BackupAndRestore under CKPT lets restarted
workers (or a restarted chief) resume from the last completed epoch.

Every GPU a worker sees is a replica (MultiWorkerMirroredStrategy's all-reduce between GPUs is NCCL),
so the global batch grows with the GPUs and the learning rate follows it (scaled_learning_rate). A
worker given GPUs (--gpus, from its pod's nvidia.com/gpu) that TensorFlow cannot see fails at once
(trainer.devices).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import tensorflow as tf
import tf_keras as keras

from common import cli, termination
from common.tracking_names import RUN_ID_KEY
from trainer import data, devices, export, models, parameter_server, tracking
from trainer.atomic import staged_directory
from trainer.cluster import (
    LOCAL,
    RPC_LAYER,
    ClusterConfigError,
    ClusterSpec,
    cluster_from_environment,
    wait_for_own_host,
)
from trainer.devices import Gpu, GpuUnavailable
from trainer.fashion_mnist import DatasetError, Split, load_split, read_manifest

DEFAULT_BATCH_SIZE_PER_REPLICA = 32
# Adam's learning rate at REFERENCE_GLOBAL_BATCH; other global batches scale it (scaled_learning_rate).
DEFAULT_LEARNING_RATE = 2e-3
# make demo's global batch (2 workers x 16), at which DEFAULT_LEARNING_RATE was chosen and every figure
# of docs/results/model-quality.md was measured: there the rule changes nothing.
REFERENCE_GLOBAL_BATCH = 32
# Without --epochs: enough passes to see MIN_EXAMPLES_SEEN examples, and at least MIN_EPOCHS.
# That is 10 epochs of the full dataset and about 67 of the 450-image sample.
MIN_EPOCHS = 10
MIN_EXAMPLES_SEEN = 30_000
TRAINING_SEED = 1
# Targets of 0.9 for the true class and 0.01 for each other one, not 1 and 0: with 450 images the
# model otherwise grows confident on what it memorised. Kept, with zoom (trainer.data), because it
# raised every variant's validation accuracy (docs/results/model-quality.md).
LABEL_SMOOTHING = 0.1
CHECKPOINT_OWNER_FILE = "model.txt"
BACKUP_DIR = "backup"  # BackupAndRestore's, in the checkpoint directory


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: str
    data_dir: Path
    checkpoint_dir: Path
    export_dir: Path
    epochs: int | None
    batch_size_per_replica: int
    steps_per_epoch: int | None
    learning_rate: float
    mixed_precision: str
    gpus: int


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    parser = cli.OneLineParser(prog="train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(models.MODELS))
    parser.add_argument("--data-dir", type=Path, required=True, help="written by trainer.ingest")
    parser.add_argument("--checkpoint-dir", type=Path, required=True,
                        help="this variant's own: backups for resuming, TensorBoard logs")
    parser.add_argument("--export-dir", type=Path, required=True, help="the SavedModel to write")
    parser.add_argument("--epochs", type=cli.positive_int,
                        help=f"default: at least {MIN_EPOCHS}, and enough to see "
                        f"{MIN_EXAMPLES_SEEN} examples")
    parser.add_argument("--batch-size-per-replica", type=cli.positive_int,
                        default=DEFAULT_BATCH_SIZE_PER_REPLICA)
    parser.add_argument("--steps-per-epoch", type=cli.positive_int,
                        help="default: one pass over the training images")
    parser.add_argument("--learning-rate", type=cli.positive_float, default=DEFAULT_LEARNING_RATE,
                        help=f"Adam's rate at a global batch of {REFERENCE_GLOBAL_BATCH}, scaled with the "
                        "square root of the global batch's ratio to it")
    parser.add_argument("--mixed-precision", choices=devices.MIXED_PRECISION_CHOICES, default="auto",
                        help="float16 compute with float32 weights; auto: on where every GPU supports it")
    parser.add_argument("--gpus", type=cli.non_negative_int, default=0,
                        help="the GPUs this worker's pod was given: fail unless TensorFlow sees them")
    return TrainConfig(**vars(parser.parse_args(argv)))


def log(cluster: ClusterSpec, message: str) -> None:
    print(f"train[{cluster.task_type}:{cluster.task_index}]: {message}", flush=True)


def cosine_schedule(base_rate: float, epochs: int) -> Callable[[int, float], float]:
    """Learning rate per epoch, decaying from `base_rate` towards zero along half a cosine."""
    def rate(epoch: int, _current: float) -> float:
        return base_rate * 0.5 * (1.0 + math.cos(math.pi * epoch / epochs))

    return rate


class ProgressLogger(keras.callbacks.Callback):
    """One line per epoch (metrics, learning rate, time) and the throughput of the whole run.

    Placed after BackupAndRestore, so a logged epoch end means its backup is on disk.
    """

    def __init__(self, cluster: ClusterSpec, epochs: int, examples_per_epoch: int):
        super().__init__()
        self.cluster, self.epochs, self.examples_per_epoch = cluster, epochs, examples_per_epoch
        self.first_epoch: int | None = None
        self.epoch_seconds: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch
            if epoch > 0:
                log(self.cluster, f"resuming from backup at epoch {epoch + 1}/{self.epochs}")
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._started
        self.epoch_seconds.append(seconds)
        logs = logs or {}
        log(self.cluster, f"epoch {epoch + 1}/{self.epochs} loss={logs.get('loss', math.nan):.4f} "
            f"accuracy={logs.get('accuracy', math.nan):.4f} lr={logs.get('lr', math.nan):.6f} "
            f"({seconds:.1f}s)")

    def examples_per_second(self) -> float:
        """Steady-state throughput: the first epoch of a run also traces and compiles."""
        timed = self.epoch_seconds[1:] or self.epoch_seconds
        return self.examples_per_epoch * len(timed) / sum(timed) if timed else 0.0


class EpochTracking(keras.callbacks.Callback):
    """Each epoch's figures into the chief's MLflow run (trainer.tracking), stepped by epoch number, with
    the epoch's time as `progress` (placed before this callback) measured it."""

    def __init__(self, tracked: tracking.Tracking, run_id: str, progress: ProgressLogger):
        super().__init__()
        self.tracked, self.run_id, self.progress = tracked, run_id, progress

    def on_epoch_end(self, epoch, logs=None):
        figures = {name: value for name, value in (logs or {}).items() if isinstance(value, (int, float))}
        figures["epoch_seconds"] = self.progress.epoch_seconds[-1]
        self.tracked.log_metrics(self.run_id, figures, step=epoch + 1)


def cluster_resolver(cluster: ClusterSpec) -> tf.distribute.cluster_resolver.SimpleClusterResolver:
    """TensorFlow's view of `cluster`: what TFConfigClusterResolver would read from TF_CONFIG, which a
    TrainJob's pods do not have in their environment (trainer.cluster builds it)."""
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.cluster), task_type=cluster.task_type, task_id=cluster.task_index,
        rpc_layer=RPC_LAYER)


def communication_options(gpus: int) -> tf.distribute.experimental.CommunicationOptions:
    """How MultiWorkerMirroredStrategy all-reduces: NCCL between GPUs (GPU to GPU, within a node and
    across nodes), TensorFlow's choice otherwise (AUTO: its ring all-reduce on CPUs)."""
    implementation = tf.distribute.experimental.CommunicationImplementation
    return tf.distribute.experimental.CommunicationOptions(
        implementation=implementation.NCCL if gpus else implementation.AUTO)


def distribution_strategy(cluster: ClusterSpec, gpus: int) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy for a cluster from TF_CONFIG, ParameterServerStrategy for one with
    parameter servers; either makes a replica of every GPU of every worker. A lone local worker takes
    the default strategy, on its one GPU if it has one: there all-reduce has nothing to do but still
    costs time (docs/results/training-throughput.md); with several GPUs, MirroredStrategy over them."""
    if cluster is LOCAL:
        return tf.distribute.MirroredStrategy() if gpus > 1 else tf.distribute.get_strategy()
    if cluster.uses_parameter_servers:
        return parameter_server.strategy(cluster, cluster_resolver(cluster))
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(cluster),
                                                     communication_options=communication_options(gpus))


class SmoothedSparseCrossentropy(keras.losses.Loss):
    """Cross-entropy from logits against class ids, with label smoothing, which Keras' sparse loss
    lacks: the ids become smoothed one-hot targets here, so the data and metrics keep class ids."""

    def __init__(self, smoothing: float = LABEL_SMOOTHING, name: str = "smoothed_crossentropy"):
        super().__init__(name=name)
        self.smoothing = smoothing

    def call(self, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
        targets = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), tf.shape(y_pred)[-1])
        return keras.losses.categorical_crossentropy(targets, y_pred, from_logits=True,
                                                     label_smoothing=self.smoothing)

    def get_config(self) -> dict:
        return {**super().get_config(), "smoothing": self.smoothing}


def global_batch_size(batch_size_per_replica: int, strategy: tf.distribute.Strategy,
                      cluster: ClusterSpec) -> int:
    """The examples behind one update of the weights: the per-replica batch stays as configured, so
    the global batch grows with the replicas (every GPU of every worker, or each worker's CPU). Under
    parameter servers a step is one worker's (its GPUs being its replicas), and it takes the batch of
    all the workers, so that a config means the same global batch, steps per epoch and learning rate
    under either strategy."""
    if cluster.uses_parameter_servers:
        return batch_size_per_replica * cluster.num_workers * strategy.num_replicas_in_sync
    return batch_size_per_replica * strategy.num_replicas_in_sync


def scaled_learning_rate(rate_at_reference: float, global_batch: int) -> float:
    """Adam's learning rate for `global_batch`: `rate_at_reference` (the rate at REFERENCE_GLOBAL_BATCH)
    times the square root of the batch's ratio to that reference.

    A global batch k times larger averages k times as many gradients, whose noise shrinks by sqrt(k).
    For Adam the square-root rule keeps training on the same course (Malladi et al., "On the SDEs and
    Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022, which also adjusts Adam's betas and
    epsilon; we scale the rate alone); the linear rule (Goyal et al. 2017) is SGD's. Doubling the GPUs
    doubles the global batch and multiplies the rate by 1.41."""
    return rate_at_reference * math.sqrt(global_batch / REFERENCE_GLOBAL_BATCH)


def precision_policy(choice: str, gpus: list[Gpu], cluster: ClusterSpec) -> str:
    """The Keras dtype policy for --mixed-precision: mixed_float16 (float16 compute, float32 weights)
    `on`, float32 `off`, and `auto` on where every GPU supports it (trainer.devices). tf-keras scales
    the loss against float16 underflow (LossScaleOptimizer) under MultiWorkerMirroredStrategy but not
    ParameterServerStrategy, so parameter servers train in float32 and refuse `on`."""
    if cluster.uses_parameter_servers:
        if choice == "on":
            raise cli.UsageError("--mixed-precision on: tf-keras cannot scale the loss under parameter "
                                 "servers; train this variant with the sync strategy, or precision off")
        return devices.FULL_POLICY
    if choice == "on" or (choice == "auto" and devices.mixed_precision_supported(gpus)):
        return devices.MIXED_POLICY
    return devices.FULL_POLICY


def training_input(cluster: ClusterSpec, split: Split, global_batch: int, strategy: tf.distribute.Strategy,
                   ) -> tf.data.Dataset | keras.utils.experimental.DatasetCreator:
    """A dataset that every worker shards, or under parameter servers a DatasetCreator from which
    each worker builds its own (model.fit's only input there besides in-memory arrays), of which each
    of the worker's replicas takes a batch a step."""
    if cluster.uses_parameter_servers:
        return parameter_server.training_input(split, global_batch // strategy.num_replicas_in_sync)
    return data.training_dataset(split, global_batch)


def compiled_model(name: str, learning_rate: float, steps_per_execution: int = 1,
                   policy: str = devices.FULL_POLICY) -> keras.Model:
    """`steps_per_execution` > 1 runs that many steps per call from Python: it speeds up one
    process's small steps (benchmarks.variant_cv); the trainer keeps 1, as under
    MultiWorkerMirroredStrategy the per-step all-reduce dominates and it gained nothing measurable
    (docs/results/training-throughput.md). Under mixed_float16, compile wraps the optimizer in a
    LossScaleOptimizer."""
    model = models.build_model(name, policy)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=SmoothedSparseCrossentropy(),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return model


def recipe() -> dict:
    """The training recipe's knobs, recorded in metrics.json beside what they gave."""
    return {"augmentation": {"flip": True, "shift_pixels": data.SHIFT_PIXELS,
                             "zoom_fraction": data.ZOOM_FRACTION},
            "label_smoothing": LABEL_SMOOTHING, "schedule": "cosine", "optimizer": "adam"}


def tracked_parameters(config: TrainConfig, cluster: ClusterSpec, gpus: list[Gpu], policy: str,
                       global_batch: int, learning_rate: float, epochs: int, steps_per_epoch: int) -> dict:
    """What this training was asked to do and the dataset it read, as its MLflow run's parameters."""
    manifest = read_manifest(config.data_dir)
    return {
        "variant": config.model,
        "strategy": "parameter-server" if cluster.uses_parameter_servers else "sync",
        "workers": cluster.num_workers, "parameter_servers": cluster.num_parameter_servers,
        "gpus": len(gpus), "batch_size_per_replica": config.batch_size_per_replica,
        "global_batch_size": global_batch, "learning_rate": learning_rate,
        "learning_rate_at_reference_batch": config.learning_rate, "precision": policy,
        "epochs": epochs, "steps_per_epoch": steps_per_epoch,
        "dataset_source": manifest["source"],
        "dataset_manifest_sha256": hashlib.sha256(json.dumps(manifest, sort_keys=True).encode())
        .hexdigest(),
    }


def evaluate_export(export_dir: Path, split: Split) -> dict[str, float]:
    """Accuracy and loss of the exported SavedModel itself."""
    probabilities = export.predict_pixels(export_dir, split.images)
    accuracy, loss = export.accuracy_and_loss(probabilities, split.labels)
    return {"accuracy": accuracy, "loss": loss, "examples": len(split)}


def export_model(model: keras.Model, cluster: ClusterSpec, export_dir: Path,
                 write_metrics: Callable[[Path], dict]) -> None:
    """Every worker saves (saving reads synchronised variables collectively); only the chief keeps.

    The chief's export is staged beside `export_dir`, evaluated, then moved in file by file and
    committed (trainer.atomic): readers such as trainer.select take it only once its marker is
    there, and no directory is renamed, so it may be on object storage mounted with GCS FUSE.
    TensorFlow's own writes rename files only (the SavedModel's variables are saved into a
    `variables_temp` directory and merged into `variables/` by renaming files, then that directory
    is deleted; saved_model.pb and checkpoints go through a temporary file renamed over).
    """
    if not cluster.is_chief:
        scratch = Path(tempfile.mkdtemp(prefix="export-worker-"))
        try:
            export.save_for_serving(model, str(scratch))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    with staged_directory(export_dir) as staging:
        export.save_for_serving(model, str(staging))
        metrics = write_metrics(staging)
    log(cluster, f"exported {export_dir}: validation accuracy {metrics['validation']['accuracy']:.4f}")


def train(config: TrainConfig, cluster: ClusterSpec, gpus: list[Gpu]) -> None:
    started = time.time()
    train_split, validation_split = data.split_validation(load_split(config.data_dir, "train"))
    policy = precision_policy(config.mixed_precision, gpus, cluster)
    strategy = distribution_strategy(cluster, len(gpus))
    keras.utils.set_random_seed(TRAINING_SEED)
    global_batch = global_batch_size(config.batch_size_per_replica, strategy, cluster)
    learning_rate = scaled_learning_rate(config.learning_rate, global_batch)
    steps_per_epoch = config.steps_per_epoch or max(1, len(train_split) // global_batch)
    epochs = config.epochs or max(MIN_EPOCHS, math.ceil(MIN_EXAMPLES_SEEN / len(train_split)))
    log(cluster, f"trains on {devices.describe(gpus)}, dtype policy {policy}")
    log(cluster, f"{config.model}: {len(train_split)} training images, {cluster.num_workers} "
        f"worker(s), global batch {global_batch}, learning rate {learning_rate:g}, {epochs} epochs of "
        f"{steps_per_epoch} steps")

    with strategy.scope():
        model = compiled_model(config.model, learning_rate, policy=policy)
    progress = ProgressLogger(cluster, epochs, steps_per_epoch * global_batch)
    # The chief alone tracks; a restarted set or a retried step continues its run.
    tracked = tracking.Tracking.from_environment("train") if cluster.is_chief else tracking.OFF
    backup_dir = config.checkpoint_dir / BACKUP_DIR
    run_id = tracking.begin_training(tracked, config.model, config.checkpoint_dir, tracked_parameters(
        config, cluster, gpus, policy, global_batch, learning_rate, epochs, steps_per_epoch),
        resumes=has_backup(backup_dir))
    callbacks = [
        keras.callbacks.BackupAndRestore(backup_dir=str(backup_dir)),
        keras.callbacks.LearningRateScheduler(cosine_schedule(learning_rate, epochs)),
        keras.callbacks.TensorBoard(log_dir=str(config.checkpoint_dir / "tensorboard"),
                                    profile_batch=0),
        progress,
        *([EpochTracking(tracked, run_id, progress)] if run_id else []),
    ]

    def write_metrics(export_dir: Path) -> dict:
        metrics = {
            "model": config.model,
            "validation": evaluate_export(export_dir, validation_split),
            "epochs": epochs,
            "steps_per_epoch": steps_per_epoch,
            "global_batch_size": global_batch,
            "learning_rate": learning_rate,
            "workers": cluster.num_workers,
            "gpus": len(gpus),
            "precision": policy,
            "training_examples": len(train_split),
            "recipe": recipe(),
            "examples_per_second": progress.examples_per_second(),
            "wall_time_seconds": time.time() - started,
        }
        if run_id:
            metrics[RUN_ID_KEY] = run_id
        (export_dir / export.METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
        return metrics

    with tracking.ends_with_its_step(tracked, run_id):
        model.fit(training_input(cluster, train_split, global_batch, strategy), epochs=epochs,
                  steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=0)
        export_model(model, cluster, config.export_dir, write_metrics)
    if run_id:
        track_end(tracked, run_id, config)


def has_backup(backup_dir: Path) -> bool:
    """Whether BackupAndRestore will resume from `backup_dir` (its CheckpointManager's state file)."""
    return any(backup_dir.rglob("checkpoint"))


def track_end(tracked: tracking.Tracking, run_id: str, config: TrainConfig) -> None:
    """The chief's run ends with what its export's metrics.json says, and that file."""
    metrics_file = config.export_dir / export.METRICS_FILE
    final = json.loads(metrics_file.read_text())
    tracking.end_training(tracked, run_id, config.checkpoint_dir, {
        "validation_accuracy": final["validation"]["accuracy"],
        "validation_loss": final["validation"]["loss"],
        "examples_per_second": final["examples_per_second"],
        "wall_time_seconds": final["wall_time_seconds"],
    }, [metrics_file])


def claim_checkpoint_dir(checkpoint_dir: Path, model: str, cluster: ClusterSpec) -> None:
    """A checkpoint directory belongs to one variant: restoring another's backup fails obscurely."""
    owner_file = checkpoint_dir / CHECKPOINT_OWNER_FILE
    if owner_file.is_file() and (owner := owner_file.read_text().strip()) != model:
        raise cli.UsageError(f"{checkpoint_dir}: holds checkpoints of {owner!r}, not {model!r}; "
                             "give each variant its own --checkpoint-dir")
    if cluster.is_chief:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        owner_file.write_text(model + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    cluster = cluster_from_environment(os.environ)
    wait_for_own_host(cluster)
    gpus = devices.visible_gpus()
    devices.require_gpus(config.gpus, gpus)
    if cluster.uses_parameter_servers and not cluster.is_chief:
        parameter_server.serve_forever(cluster)
    claim_checkpoint_dir(config.checkpoint_dir, config.model, cluster)
    train(config, cluster, gpus)


def run(argv: Sequence[str] | None = None) -> None:
    """`python -m trainer.train`: a user's mistake (arguments, TF_CONFIG, data) or a pod's GPUs that
    TensorFlow cannot use is one line."""
    cli.run("train", main, argv, expected=(ClusterConfigError, DatasetError, GpuUnavailable))


if __name__ == "__main__":
    termination.exit_on_sigterm("train")  # a pod's first process: the kubelet's SIGTERM must end it
    run()
