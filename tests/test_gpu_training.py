"""The trainer's GPU behaviour that a machine without a GPU can check: the refusal of GPUs TensorFlow
cannot see, the all-reduce and strategy chosen for GPUs, the global batch and learning rate as the
replicas grow, and the mixed-precision policy with its float32 logits. (Training a step under mixed
precision and exporting it: tests/test_train.py. The GPU image's path to the refusal:
tests/test_packaging.py.)"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from conftest import last_line

from common import cli
from pipeline.config import MIXED_PRECISION, PipelineSettings
from trainer import devices, models, train
from trainer.cluster import LOCAL, ClusterSpec, parse_tf_config
from trainer.devices import Gpu

T4 = Gpu("/physical_device:GPU:0", "Tesla T4", (7, 5))
P100 = Gpu("/physical_device:GPU:1", "Tesla P100-PCIE-16GB", (6, 0))
SYNC = parse_tf_config(json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                   "task": {"type": "worker", "index": 0}}))
PARAMETER_SERVERS = ClusterSpec({"chief": ["c:1"], "worker": ["a:1", "b:2"], "ps": ["p:3"]}, "chief", 0)
NCCL = tf.distribute.experimental.CommunicationImplementation.NCCL
AUTO = tf.distribute.experimental.CommunicationImplementation.AUTO


def test_a_pod_given_a_gpu_that_tensorflow_cannot_see_stops_at_once_in_one_line(tmp_path, capsys,
                                                                                 monkeypatch):
    """This machine has no GPU, no CUDA wheels and no driver: what a CPU image on a GPU node sees."""
    monkeypatch.setenv("LD_LIBRARY_PATH", devices.GKE_DRIVER_LIBRARIES)
    argv = ["--model", "cnn", "--data-dir", str(tmp_path / "data"), "--checkpoint-dir", str(tmp_path / "c"),
            "--export-dir", str(tmp_path / "e"), "--gpus", "1"]
    with pytest.raises(SystemExit) as exit_info:
        train.run(argv)
    assert exit_info.value.code == 1
    line = last_line(capsys.readouterr().err)
    assert line.startswith("train: error: given 1 GPU (--gpus 1), TensorFlow sees none: ")
    assert "the CUDA libraries of tensorflow[and-cuda] are not installed (no nvidia-" in line
    assert "the CPU trainer image?" in line
    assert (f"the NVIDIA driver's libcuda.so.1 does not load with "
            f"LD_LIBRARY_PATH='{devices.GKE_DRIVER_LIBRARIES}'") in line
    assert line.endswith("; refusing to train on the CPU")
    assert list(tmp_path.iterdir()) == []  # stopped before the data, the checkpoints or the export


def test_without_gpus_given_a_worker_trains_on_what_it_sees():
    devices.require_gpus(0, [])
    devices.require_gpus(1, [T4, P100])  # a workstation's GPUs: more than asked for is no error


def test_fewer_gpus_than_given_is_refused_naming_those_seen():
    with pytest.raises(devices.GpuUnavailable, match=r"^given 2 GPUs \(--gpus 2\), TensorFlow sees 1 "
                                                       r"\(GPU:0 Tesla T4 \(compute capability 7\.5\)\); "
                                                       "refusing to train on fewer$"):
        devices.require_gpus(2, [T4])


def test_the_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(devices, "driver_loads", lambda: True)
    monkeypatch.setattr(devices, "missing_cuda_wheels", lambda: [])
    assert devices.why_no_gpu().startswith("the driver and the CUDA libraries load, so see TensorFlow's log")
    monkeypatch.setattr(tf.sysconfig, "get_build_info", lambda: {"is_cuda_build": False})
    assert devices.why_no_gpu() == "this TensorFlow is built without CUDA"


def test_the_cuda_wheels_looked_for_are_tensorflows_and_cuda_extra():
    missing = devices.missing_cuda_wheels()  # none is installed here
    assert "nvidia-cudnn-cu12" in missing and "nvidia-nccl-cu12" in missing
    assert not {"numpy", "tensorflow-io-gcs-filesystem"} & set(missing)  # its other requirements and extras


def test_the_devices_are_logged_by_name():
    assert devices.describe([]) == "the CPU (no GPU visible)"
    assert devices.describe([T4, P100]) == ("2 GPUs: GPU:0 Tesla T4 (compute capability 7.5), "
                                            "GPU:1 Tesla P100-PCIE-16GB (compute capability 6.0)")


@pytest.mark.parametrize("choice, gpus, cluster, policy", [
    ("auto", [], SYNC, "float32"),  # CPUs: float16 would be slower
    ("auto", [T4], SYNC, "mixed_float16"),
    ("auto", [T4], LOCAL, "mixed_float16"),
    ("auto", [P100], SYNC, "float32"),  # no Tensor Cores
    ("auto", [T4, P100], SYNC, "float32"),  # every GPU must support it
    ("on", [], SYNC, "mixed_float16"),
    ("off", [T4], SYNC, "float32"),
    ("auto", [T4], PARAMETER_SERVERS, "float32"),  # tf-keras cannot scale the loss there
    ("off", [T4], PARAMETER_SERVERS, "float32"),
])
def test_the_precision_policy_follows_the_choice_and_the_gpus(choice, gpus, cluster, policy):
    assert train.precision_policy(choice, gpus, cluster) == policy


def test_mixed_precision_on_under_parameter_servers_is_refused():
    with pytest.raises(cli.UsageError, match="--mixed-precision on: tf-keras cannot scale the loss under "
                                             "parameter servers"):
        train.precision_policy("on", [T4], PARAMETER_SERVERS)


def test_the_pipeline_offers_the_trainers_choices():
    assert MIXED_PRECISION == devices.MIXED_PRECISION_CHOICES


def test_with_gpus_all_reduce_is_nccl_and_without_tensorflow_chooses(monkeypatch):
    assert train.communication_options(1).implementation == NCCL
    assert train.communication_options(0).implementation == AUTO
    made = []
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", lambda **kwargs: made.append(kwargs))
    for gpus in (4, 0):
        train.distribution_strategy(SYNC, gpus)
    assert [kwargs["communication_options"].implementation for kwargs in made] == [NCCL, AUTO]


def test_a_lone_worker_mirrors_over_its_gpus_when_it_has_several(monkeypatch):
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", lambda: "mirrored over the GPUs")
    assert train.distribution_strategy(LOCAL, 2) == "mirrored over the GPUs"
    assert train.distribution_strategy(LOCAL, 1) is tf.distribute.get_strategy()


def replicas(count: int) -> SimpleNamespace:
    return SimpleNamespace(num_replicas_in_sync=count)


def test_the_per_replica_batch_stays_so_the_global_batch_grows_with_the_gpus():
    assert train.global_batch_size(16, replicas(2), SYNC) == 32  # 2 workers, a CPU each
    assert train.global_batch_size(16, replicas(8), SYNC) == 128  # 2 workers, 4 GPUs each
    # Parameter servers: a step is one worker's, its GPUs its replicas, with every worker's batch.
    assert train.global_batch_size(16, replicas(1), PARAMETER_SERVERS) == 32
    assert train.global_batch_size(16, replicas(4), PARAMETER_SERVERS) == 128


def test_the_learning_rate_grows_with_the_square_root_of_the_global_batch():
    base = train.DEFAULT_LEARNING_RATE
    assert train.scaled_learning_rate(base, train.REFERENCE_GLOBAL_BATCH) == base
    assert train.scaled_learning_rate(base, 4 * train.REFERENCE_GLOBAL_BATCH) == pytest.approx(2 * base)
    assert train.scaled_learning_rate(base, 64) == pytest.approx(base * math.sqrt(2))
    assert train.scaled_learning_rate(base, 8) == pytest.approx(base / 2)


def test_the_demos_configuration_keeps_the_learning_rate_it_was_tuned_at():
    """make demo and the pipeline's defaults: 2 workers x 16 (docs/results/model-quality.md)."""
    defaults = PipelineSettings()
    assert defaults.workers * defaults.batch_size_per_replica == train.REFERENCE_GLOBAL_BATCH
    assert train.DEFAULT_BATCH_SIZE_PER_REPLICA == train.REFERENCE_GLOBAL_BATCH  # one local worker
    assert train.scaled_learning_rate(train.DEFAULT_LEARNING_RATE, train.REFERENCE_GLOBAL_BATCH) == 2e-3


@pytest.mark.parametrize("name", ["cnn", "cnn_batchnorm"])
def test_under_mixed_precision_layers_compute_in_float16_but_the_logits_are_float32(name):
    model = models.build_model(name, devices.MIXED_POLICY)
    assert keras.mixed_precision.global_policy().name == "float32"  # restored for whatever is built next
    assert model.layers[1].compute_dtype == "float16"
    assert model.layers[-1].compute_dtype == "float32"
    assert all(weight.dtype == tf.float32 for weight in model.weights)
    logits = model(np.full((2, 28, 28, 1), 255.0, np.float32))
    assert logits.dtype == tf.float32
    scaling = keras.mixed_precision.LossScaleOptimizer
    assert isinstance(train.compiled_model(name, 1e-3, policy=devices.MIXED_POLICY).optimizer, scaling)
    assert not isinstance(train.compiled_model(name, 1e-3).optimizer, scaling)
