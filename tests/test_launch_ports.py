"""TF_CONFIG names every task's port before the tasks start, so another program may take one in
between: the launcher then starts the job again on other ports (trainer.launch.PortTaken), a bounded
number of times, and a failure that is not a taken port is not retried."""

from __future__ import annotations

import socket
import sys

import pytest

from common import ports
from trainer import cluster as tf_cluster
from trainer import launch

pytestmark = pytest.mark.slow  # starts processes

# A stand-in task: binds the port its TrainJob pod environment gives it, as TensorFlow's server does,
# and says what TensorFlow says when it cannot; exits 0 once bound.
BINDING_TASK = f"""
import json, os, socket, sys
from trainer.cluster import cluster_from_environment
spec = cluster_from_environment(os.environ)
host, _, port = spec.cluster[spec.task_type][spec.task_index].rpartition(":")
try:
    socket.create_server(("127.0.0.1", int(port)))
except OSError:
    print("E0000 grpc_server_lib.cc:618] UNKNOWN: {launch.PORT_TAKEN}", flush=True)
    sys.exit(1)
print("bound", port, flush=True)
"""


@pytest.fixture
def taken_port():
    """A port another program holds, which the launcher's first choice of ports will name."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield holder.getsockname()[1]


def choosing_first(monkeypatch, taken: int, times: int) -> list[list[int]]:
    """free_ports returns `taken` among its ports for its first `times` calls; the choices made."""
    chosen, real = [], ports.free_ports

    def free_ports(count: int) -> list[int]:
        found = real(count)
        if len(chosen) < times:
            found[-1] = taken
        chosen.append(found)
        return found

    monkeypatch.setattr(tf_cluster, "free_ports", free_ports)
    return chosen


def tasks_run(monkeypatch, script: str) -> None:
    """The launcher's jobs run `script` in place of trainer.train."""
    def start_workers(train_args, workers, log_dir, parameter_servers):
        return launch.start_replicas([sys.executable, "-c", script], workers, log_dir, distributed=True,
                                     parameter_servers=parameter_servers)

    monkeypatch.setattr(launch, "start_workers", start_workers)


def test_a_port_taken_before_its_task_bound_it_starts_the_job_again_on_other_ports(
        monkeypatch, tmp_path, taken_port, capsys):
    chosen = choosing_first(monkeypatch, taken_port, times=1)
    tasks_run(monkeypatch, BINDING_TASK)
    launch.run_workers([], 2, tmp_path)
    assert len(chosen) == 2 and taken_port not in chosen[1]
    assert "starting the job again on other ports" in capsys.readouterr().out
    assert (tmp_path / "worker-1.log").read_text().count("bound") == 1


def test_ports_taken_every_time_fail_the_job_after_the_retries(monkeypatch, tmp_path, taken_port):
    chosen = choosing_first(monkeypatch, taken_port, times=launch.PORT_RETRIES + 1)
    tasks_run(monkeypatch, BINDING_TASK)
    with pytest.raises(launch.PortTaken, match="worker 1 exited with status 1"):
        launch.run_workers([], 2, tmp_path)
    assert len(chosen) == launch.PORT_RETRIES + 1


def test_a_failure_that_is_not_a_taken_port_is_not_retried(monkeypatch, tmp_path, taken_port):
    """Worker 1 loses its port on the first start, then fails for another reason: the failure is
    reported, not retried, though that worker's log (appended to) still holds the first start's line."""
    chosen = choosing_first(monkeypatch, taken_port, times=1)
    # Written by worker 1 as it loses its port: the first start's own doing, however slowly worker 0
    # starts before the launcher stops it.
    marker = tmp_path / "lost-its-port"
    failing = BINDING_TASK.replace("except OSError:\n",
                                   f"except OSError:\n    open({str(marker)!r}, 'w').close()\n")
    failing = failing.replace('print("bound", port, flush=True)', f"""
import time
if spec.task_index == 1 and os.path.exists({str(marker)!r}):
    sys.exit(3)
time.sleep(60)""")
    tasks_run(monkeypatch, failing)
    with pytest.raises(launch.WorkerFailed) as error:
        launch.run_workers([], 2, tmp_path / "logs")
    assert not isinstance(error.value, launch.PortTaken)
    assert str(error.value).startswith("worker 1 exited with status 3")
    assert launch.PORT_TAKEN in (tmp_path / "logs" / "worker-1.log").read_text()
    assert len(chosen) == 2
