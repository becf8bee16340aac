"""Parameter-server training with real processes: a chief, two workers and one parameter server on
127.0.0.1 train and export a model that serves; a lost worker, a lost chief and a lost parameter
server each still end in an export."""

from __future__ import annotations

import io
import json
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import epochs_logged, train_args
from PIL import Image

from common.termination import TERMINATED_EXIT
from trainer import fashion_mnist
from trainer.atomic import is_committed
from trainer.launch import (
    WORKER_RESTARTS,
    Worker,
    WorkerFailed,
    start_replicas,
    start_workers,
    stop_workers,
    wait_for_workers,
)

pytestmark = pytest.mark.slow  # trains with parameter servers

DEADLINE_SECONDS = 300
# Long enough that a replica can be killed between two epochs, short enough for 2 shared cores.
EPOCH = ("--steps-per-epoch", "30", "--batch-size-per-replica", "16")
LONG_RUN = ("--epochs", "6", *EPOCH)


# A stand-in replica: exits with the status given for its task ("chief:0" -> 0), else serves forever.
# Its task comes from the TrainJob pod's environment the launcher gives it, as trainer.train's does.
FAKE_REPLICA = """
import os, sys, time
from trainer.cluster import cluster_from_environment
spec = cluster_from_environment(os.environ)
key = f"{spec.task_type}:{spec.task_index}"
print(f"{key} up", flush=True)
exits = dict(item.split("=") for item in sys.argv[1:])
if key in exits:
    time.sleep(0.5)
    sys.exit(int(exits[key]))
time.sleep(600)
"""


def fake_job(tmp_path: Path, *exits: str) -> list[Worker]:
    return start_replicas([sys.executable, "-c", FAKE_REPLICA, *exits], 2, tmp_path, distributed=True,
                          parameter_servers=1)


def test_the_job_ends_when_the_chief_succeeds_and_the_others_are_stopped(tmp_path):
    workers = fake_job(tmp_path, "chief:0=0")
    wait_for_workers(workers)
    assert {w.name: w.process.returncode for w in workers} == {
        "chief 0": 0, "worker 0": -signal.SIGTERM, "worker 1": -signal.SIGTERM, "ps 0": -signal.SIGTERM}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chief-0.log", "ps-0.log", "worker-0.log",
                                                         "worker-1.log"]


def test_a_worker_that_keeps_failing_is_restarted_then_fails_the_job(tmp_path):
    workers = fake_job(tmp_path, "worker:1=3")
    with pytest.raises(WorkerFailed, match=r"^worker 1 exited with status 3; the end of .*worker-1.log"):
        wait_for_workers(workers)
    assert by_name(workers, "worker 1").restarts == WORKER_RESTARTS
    assert (tmp_path / "worker-1.log").read_text().count("worker:1 up") == 1 + WORKER_RESTARTS
    assert all(w.process.poll() is not None for w in workers)


@pytest.mark.parametrize("lost", ["ps:0=0", "chief:0=1"])
def test_a_parameter_server_exiting_or_the_chief_failing_fails_the_job_at_once(tmp_path, lost):
    workers = fake_job(tmp_path, lost)
    task = lost.split("=")[0].replace(":", " ")
    with pytest.raises(WorkerFailed, match=f"^{task} exited with status {lost[-1]}"):
        wait_for_workers(workers)
    assert all(w.process.poll() is not None for w in workers)


def read_epochs(log: Path) -> list[int]:
    return epochs_logged(log.read_text(errors="replace"))


def by_name(workers: list[Worker], name: str) -> Worker:
    return next(worker for worker in workers if worker.name == name)


def wait_for_epochs(chief: Worker, count: int, workers: list[Worker]) -> int:
    """Waits until the chief has logged `count` epochs (every replica still up); the last logged."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while len(read_epochs(chief.log_path)) < count:
        assert time.monotonic() < deadline, chief.log_tail(40)
        assert all(w.process.poll() is None for w in workers), [w.log_tail(40) for w in workers]
        time.sleep(0.05)
    return max(read_epochs(chief.log_path))


def assert_serves(export_dir: Path, data_dir: Path) -> None:
    """The export's `serving_default` classifies PNG bytes as its `pixels` signature does."""
    assert is_committed(export_dir)
    test = fashion_mnist.load_split(data_dir, "test")
    images = test.images[:8]
    encoded = []
    for pixels in images:
        buffer = io.BytesIO()
        Image.fromarray(pixels[..., 0]).save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    loaded = tf.saved_model.load(str(export_dir))
    by_bytes = loaded.signatures["serving_default"](image_bytes=tf.constant(encoded))
    by_pixels = loaded.signatures["pixels"](pixels=tf.constant(images, tf.float32))
    assert by_bytes["probabilities"].shape == (8, 10)
    np.testing.assert_allclose(by_bytes["probabilities"], by_pixels["probabilities"], atol=1e-5)
    names = [name.decode() for name in by_bytes["class_name"].numpy()]
    assert names == [fashion_mnist.CLASS_NAMES[i] for i in by_bytes["class_id"].numpy()]


@pytest.fixture(scope="module")
def lost_worker_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Worker]]:
    """`cnn` trained by a chief, two workers and one parameter server, worker 1 killed after the
    chief's first epoch: one job for the tests of a run and of a lost worker (each job costs four
    TensorFlow processes)."""
    work_dir = tmp_path_factory.mktemp("parameter-server")
    workers = start_workers(train_args("cnn", data_dir, work_dir, *LONG_RUN), num_workers=2,
                            log_dir=work_dir / "logs", parameter_servers=1)
    try:
        wait_for_epochs(by_name(workers, "chief 0"), 1, workers)
        by_name(workers, "worker 1").process.send_signal(signal.SIGKILL)
        wait_for_workers(workers)  # restarts the lost worker, as TFJob's restartPolicy OnFailure
    finally:
        stop_workers(workers)
    return work_dir / "export", workers


def test_two_workers_and_a_parameter_server_train_and_export_a_model_that_serves(lost_worker_run, data_dir):
    export_dir, workers = lost_worker_run
    assert sorted(w.name for w in workers) == ["chief 0", "ps 0", "worker 0", "worker 1"]
    metrics = json.loads((export_dir / "metrics.json").read_text())
    assert metrics["workers"] == 2  # the chief coordinates, it computes no steps
    assert metrics["epochs"] == 6 and metrics["steps_per_epoch"] == 30
    assert metrics["global_batch_size"] == 32  # as sync's: 16 per replica x 2, in one worker's step
    assert metrics["validation"]["examples"] == 50
    assert_serves(export_dir, data_dir)


def test_workers_and_parameter_servers_are_stopped_when_the_chief_ends(lost_worker_run):
    _, workers = lost_worker_run
    assert [w.process.returncode for w in workers if w.task_type == "chief"] == [0]
    # Neither exits by itself (they serve until stopped): the launcher's SIGTERM ended them, through
    # their handler (common.termination), as the kubelet's would.
    assert {w.name: w.process.returncode for w in workers if w.task_type != "chief"} == {
        "worker 0": TERMINATED_EXIT, "worker 1": TERMINATED_EXIT, "ps 0": TERMINATED_EXIT}


def test_a_worker_killed_mid_run_is_tolerated_and_the_run_ends_in_an_export(lost_worker_run):
    _, workers = lost_worker_run
    assert by_name(workers, "worker 1").restarts == 1
    assert read_epochs(by_name(workers, "chief 0").log_path) == [1, 2, 3, 4, 5, 6]


def test_a_lost_parameter_server_fails_the_job_and_the_rerun_resumes_as_does_its_restarted_chief(
        data_dir, tmp_path):
    """The variables live on the parameter servers: losing one fails the job, and the rerun starts
    again from the chief's backup. In that rerun the chief is lost too, and restarted alone (as TFJob
    restarts a Chief pod; the workers and the ps keep running): it resumes from its own backup. One job
    fewer than a test of each (four TensorFlow processes); two epochs more than LONG_RUN, room for both."""
    epochs = 8
    args = train_args("cnn", data_dir, tmp_path, "--epochs", str(epochs), *EPOCH)
    workers = start_workers(args, num_workers=2, log_dir=tmp_path / "run-1", parameter_servers=1)
    try:
        wait_for_epochs(by_name(workers, "chief 0"), 2, workers)
        by_name(workers, "ps 0").process.send_signal(signal.SIGKILL)
        with pytest.raises(WorkerFailed, match=r"^ps 0 exited with status -9"):
            wait_for_workers(workers)
    finally:
        stop_workers(workers)
    lost_ps_at = max(read_epochs(by_name(workers, "chief 0").log_path))
    assert 2 <= lost_ps_at < epochs - 1

    rerun = start_workers(args, num_workers=2, log_dir=tmp_path / "run-2", parameter_servers=1)
    chief = by_name(rerun, "chief 0")
    try:
        wait_for_epochs(chief, 1, rerun)
        chief.process.send_signal(signal.SIGKILL)
        chief.process.wait()
        lost_chief_at = max(read_epochs(chief.log_path))
        assert lost_ps_at < lost_chief_at < epochs
        chief.restart()
        wait_for_workers(rerun)
    finally:
        stop_workers(rerun)
    log = chief.log_path.read_text()
    assert f"resuming from backup at epoch {lost_ps_at + 1}/{epochs}" in log
    assert f"resuming from backup at epoch {lost_chief_at + 1}/{epochs}" in log
    assert read_epochs(chief.log_path) == list(range(lost_ps_at + 1, epochs + 1))  # each epoch once
    assert_serves(tmp_path / "export", data_dir)
