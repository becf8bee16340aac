"""Asynchronous parameter-server training: the strategy, its input and its servers.

    python -m trainer.parameter_server    # a parameter server (or worker) of the cluster in its environment

A cluster whose TF_CONFIG has `ps` tasks trains with tf.distribute.ParameterServerStrategy: the
chief is the coordinator (tf-keras `model.fit` creates a ClusterCoordinator under it) and runs this
module's strategy; workers and parameter servers run only a tf.distribute.Server and never exit by
themselves, so whoever started them (trainer.launch, or TFJob's cleanPodPolicy) stops them once the
chief is done. Variables live on the parameter servers (split across them when there are several);
each worker takes scheduled steps, reading and updating them without waiting for the others, and a
step scheduled on a worker that is lost is run again on another (ClusterCoordinator's fault
tolerance, https://www.tensorflow.org/api_docs/python/tf/distribute/coordinator/ClusterCoordinator).
"""

from __future__ import annotations

import os
import signal
from typing import NoReturn, Sequence

import tensorflow as tf
import tf_keras as keras

from common import cli, termination
from trainer import data
from trainer.cluster import RPC_LAYER, ClusterConfigError, ClusterSpec, cluster_from_environment
from trainer.fashion_mnist import Split

# A variable is split across parameter servers only if each shard keeps at least this many bytes:
# the small CNNs' kernels (a few hundred KiB at most) go whole to one server each, round robin.
MIN_SHARD_BYTES = 64 << 10


def serve_forever(cluster: ClusterSpec) -> NoReturn:
    """A worker or parameter server: host this task's TensorFlow server until the process is stopped."""
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster.cluster), job_name=cluster.task_type,
                                  task_index=cluster.task_index, protocol=RPC_LAYER, start=False)
    server.start()
    print(f"parameter_server[{cluster.task_type}:{cluster.task_index}]: serving at "
          f"{cluster.cluster[cluster.task_type][cluster.task_index]}", flush=True)
    # Waiting in Python, not in server.join(): SIGTERM's handler (common.termination) can then end the
    # process at once; join() would not return to Python for it to run.
    while True:
        signal.pause()


def variable_partitioner(num_ps: int) -> tf.distribute.experimental.partitioners.Partitioner | None:
    """With several parameter servers, large variables are split across them (ShardedVariable)."""
    if num_ps < 2:
        return None
    return tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=MIN_SHARD_BYTES, max_shards=num_ps)


def strategy(cluster: ClusterSpec, resolver: tf.distribute.cluster_resolver.ClusterResolver,
             ) -> tf.distribute.ParameterServerStrategy:
    """The coordinator's strategy; it connects to every worker and parameter server of the cluster."""
    return tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner(cluster.num_parameter_servers))


def worker_seed() -> tf.Tensor:
    """A shuffle seed taken on the worker when it builds its dataset: the dataset function is traced
    once on the coordinator, so a Python seed would give every worker the same order of images."""
    return tf.cast(tf.timestamp() * 1e6, tf.int64)


def training_input(split: Split, batch_size: int) -> keras.utils.experimental.DatasetCreator:
    """Each worker builds its own endless stream of `batch_size` batches (one step's worth): the
    same pipeline as synchronous training, shuffled in its own order."""
    def dataset_fn(_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return data.training_dataset(split, batch_size, shuffle_seed=worker_seed())

    return keras.utils.experimental.DatasetCreator(dataset_fn)


def main(argv: Sequence[str] | None = None) -> None:
    """The `ps` pods of our training runtime: they need no trainer flags, only their cluster."""
    cli.OneLineParser(prog="parameter_server", description=__doc__.split("\n\n")[0]).parse_args(argv)
    cluster = cluster_from_environment(os.environ)
    train_instead = "run python -m trainer.train"
    if not cluster.uses_parameter_servers:
        raise ClusterConfigError(f"this process's cluster has no parameter servers: {train_instead}")
    if cluster.is_chief:
        raise ClusterConfigError(f"this process is its cluster's chief, which trains: {train_instead}")
    serve_forever(cluster)


if __name__ == "__main__":
    termination.exit_on_sigterm("parameter_server")  # a ps pod's first process, stopped with SIGTERM
    cli.run("parameter_server", main, expected=(ClusterConfigError,))
