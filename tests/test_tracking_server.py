"""A real `mlflow server`, started as the stacks start it (the tracking-server image's lock, the
arguments infra/tracking.py gives it) on loopback: the local engine trains and publishes through it and
MLflow's own API finds the run, the comparison and the registered champion, with the artifacts the
server proxies; requests naming a host the cluster's pods do not use are refused; and a tracking
server that refuses connections costs each step one warning line and the run nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import mlflow
import pytest
import requests
from conftest import run_module
from mlflow import MlflowClient
from stack_checks import STACK_NAMESPACE

from common import tracking_names as names
from infra.tracking import DATA_DIR, MIGRATE_CONTAINER, SERVER_ENV, SERVER_RESOURCES, volume_pod
from testdata import mlflow_store
from tools import virtualenvs

pytestmark = pytest.mark.slow  # builds the server's virtualenv, starts it, trains

STARTED = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")
START_SECONDS = 120
# One variant, two small epochs; two workers where only the chief may track.
FAST = ["--steps-per-epoch", "2", "--batch-size-per-replica", "8", "--epochs", "2", "--variants", "cnn"]
TWO_WORKERS = ["--workers", "2", *FAST]


def loopback(args: list[str]) -> list[str]:
    """The stacks' arguments, listening on a port of the kernel's choosing on loopback."""
    changed = list(args)
    host, port = changed.index("--host") + 1, changed.index("--port") + 1
    assert (changed[host], changed[port]) == ("0.0.0.0", str(names.SERVER_PORT))
    changed[host], changed[port] = "127.0.0.1", "0"
    return changed


def mlflow_command() -> Path:
    return virtualenvs.image_python("tracking-server").parent / "mlflow"


def local_pod(data: Path) -> dict:
    """The local stack's server pod, its volume at `data`."""
    pod = volume_pod("dist-ml/tracking-server", STACK_NAMESPACE, names.SERVER_NAME)
    return json.loads(json.dumps(pod).replace(f'{DATA_DIR}/', f"{data}/"))


def migrate(pod: dict, data: Path) -> subprocess.CompletedProcess:
    """The pod's migration, as its init container runs it."""
    (migration,) = [c for c in pod["initContainers"] if c["name"] == MIGRATE_CONTAINER]
    command = [str(mlflow_command()), *migration["command"][1:]]
    return subprocess.run(command, cwd=data, capture_output=True, text=True, timeout=START_SECONDS)


@contextlib.contextmanager
def running_server(pod: dict, data: Path) -> Iterator[tuple[str, int]]:
    """The pod's server, on loopback; yields its URL (the port uvicorn reports having bound) and pid."""
    (container,) = pod["containers"]
    process = subprocess.Popen([str(mlflow_command()), "server", *loopback(container["args"])], cwd=data,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **SERVER_ENV})
    port: list[int] = []
    log: list[str] = []

    def read() -> None:
        for line in process.stdout:
            log.append(line)
            if not port and (started := STARTED.search(line)):
                port.append(int(started.group(1)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_SECONDS
        while not port and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert port, "mlflow server did not start:\n" + "".join(log[-30:])
        yield f"http://127.0.0.1:{port[0]}", process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, Path, int]]:
    """The server as its pod starts it on an empty volume, migration first: its URL, its artifact
    directory and its pid."""
    data = tmp_path_factory.mktemp("tracking-server")
    pod = local_pod(data)
    migrated = migrate(pod, data)
    assert migrated.returncode == 0, migrated.stderr
    with running_server(pod, data) as (url, pid):
        yield url, data / "artifacts", pid


def process_tree(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(found for child in children for found in process_tree(int(child)))]


def resident_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    (line,) = [line for line in status if line.startswith("VmRSS:")]
    return int(line.split()[1]) * 1024


def test_the_server_as_the_stacks_start_it_fits_its_memory_limit(server):
    """With the stacks' environment (SERVER_ENV: no GenAI job runner, whose nine worker processes took
    2.4 GiB and got the server OOM-killed on the tier's real node) the server's processes together
    stay well under the container's limit, after answering."""
    url, _, pid = server
    requests.get(f"{url}/health", timeout=30).raise_for_status()
    limit = SERVER_RESOURCES.as_manifest()["limits"]["memory"]
    assert limit.endswith("Mi")
    tree = process_tree(pid)
    commands = [Path(f"/proc/{each}/cmdline").read_bytes().replace(b"\0", b" ").decode() for each in tree]
    assert not [command for command in commands if "mlflow.server.jobs" in command], commands
    used = sum(resident_bytes(each) for each in tree)
    assert used < int(limit.removesuffix("Mi")) * 2**20 * 0.6, (used, limit)


def test_the_local_engine_trains_and_publishes_through_the_server(server, sample_dir, tmp_path, monkeypatch):
    """Two storage roots, one after the other, as a laptop's runs and a team's would share a server."""
    url, artifacts, _ = server
    root = tmp_path / "root"
    result = run_module("pipeline", "run", "--data-source", str(sample_dir), "--storage-root", str(root),
                        *TWO_WORKERS, env={names.TRACKING_URI_ENV: url}, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "published: fmnist version 1" in result.stdout
    assert not (root / names.EMBEDDED_DIR).exists()  # MLFLOW_TRACKING_URI won over the embedded store
    monkeypatch.setenv(names.TRACKING_URI_ENV, url)
    runs = {run.info.run_name: run for run in mlflow.search_runs(experiment_names=["fmnist"],
                                                                  output_format="list")}
    assert set(runs) == {"cnn", "select"}
    training = runs["cnn"]
    assert training.info.status == "FINISHED"
    assert training.data.params["workers"] == "2" and training.data.params["global_batch_size"] == "16"
    client = MlflowClient()
    for figure in ("loss", "epoch_seconds"):
        assert [metric.step for metric in client.get_metric_history(training.info.run_id, figure)] == [1, 2]
    # The server proxies artifacts: the training pod needed no rights on where they landed.
    assert [artifact.path for artifact in client.list_artifacts(training.info.run_id)] == ["metrics.json"]
    assert list(artifacts.rglob("metrics.json"))
    champion = client.get_model_version_by_alias("fmnist", names.CHAMPION)
    assert champion.tags[names.VERSION_TAG] == "1"
    assert champion.tags[names.URI_TAG] == (root / "releases" / "fmnist" / "1").resolve().as_uri()
    # A server takes a local path as a source only inside its run's artifacts: selection's run stands for it.
    assert champion.source == f"runs:/{runs['select'].info.run_id}/selection.json"
    assert champion.tags[names.TRAINING_RUNS_TAG] == training.info.run_id
    # A second model repository on the same server (another storage root): its version 1 is its own,
    # and its rollout moves the champion to it, not to the first repository's version 1 (one worker:
    # whose version the champion is does not depend on how many trained it).
    other = tmp_path / "other-root"
    again = run_module("pipeline", "run", "--data-source", str(sample_dir), "--storage-root", str(other),
                       "--workers", "1", *FAST, env={names.TRACKING_URI_ENV: url}, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "published: fmnist version 1" in again.stdout
    registered = {version.tags[names.URI_TAG]: version.tags[names.VERSION_TAG]
                  for version in client.search_model_versions("name = 'fmnist'")}
    released = [(place / "releases" / "fmnist" / "1").resolve().as_uri() for place in (root, other)]
    assert registered == dict.fromkeys(released, "1")
    champion = client.get_model_version_by_alias("fmnist", names.CHAMPION)
    assert champion.tags[names.URI_TAG] == released[1]


def schema_revision(data: Path) -> str:
    with contextlib.closing(sqlite3.connect(data / "mlflow.db")) as database:
        ((revision,),) = database.execute("SELECT version_num FROM alembic_version").fetchall()
    return revision


def test_the_pods_migration_brings_an_older_mlflows_store_to_the_schema_of_its_own(tmp_path):
    """A store MLflow 2.17.2 left (testdata/mlflow_store.py), after the init container's `mlflow db
    upgrade`: at the revision the image's MLflow gives a new store, before the server starts (MLflow
    3.17's server would otherwise migrate it while its startup probe counts, and refuse a store whose
    tables are all there at an older revision); again on the next start, a no-op; then the server
    serves the old run, its metric's steps and the version under its alias."""
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir(), old.mkdir()
    assert migrate(local_pod(new), new).returncode == 0
    shutil.copy(mlflow_store.STORE, old / "mlflow.db")
    assert schema_revision(old) != schema_revision(new)
    pod = local_pod(old)
    for start in ("first", "next"):
        migrated = migrate(pod, old)
        assert migrated.returncode == 0, f"{start}: {migrated.stderr}"
        assert schema_revision(old) == schema_revision(new), start
    with running_server(pod, old) as (url, _):
        client = MlflowClient(tracking_uri=url, registry_uri=url)
        experiment = client.get_experiment_by_name(mlflow_store.EXPERIMENT)
        (run,) = client.search_runs([experiment.experiment_id])
        assert (run.info.run_name, run.info.status) == (mlflow_store.RUN_NAME, "FINISHED")
        assert run.data.params == dict([mlflow_store.PARAM])
        history = client.get_metric_history(run.info.run_id, mlflow_store.METRIC)
        assert {metric.step: metric.value for metric in history} == mlflow_store.METRIC_STEPS
        champion = client.get_model_version_by_alias(mlflow_store.MODEL, mlflow_store.ALIAS)
        assert champion.run_id == run.info.run_id


def test_only_the_hosts_the_clusters_pods_call_are_answered(server):
    url, _, _ = server
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
    port = url.rsplit(":", 1)[1]
    for host in (f"{names.SERVER_NAME}.{STACK_NAMESPACE}.svc:{names.SERVER_PORT}", f"localhost:{port}"):
        assert requests.get(search, headers={"Host": host}, timeout=10).status_code == 200, host
    assert requests.get(search, headers={"Host": "attacker.example:5000"}, timeout=10).status_code == 403


def test_a_server_that_refuses_connections_costs_each_step_one_warning_and_nothing_else(sample_dir, tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        refusing = f"http://127.0.0.1:{listener.getsockname()[1]}"  # bound, never listening: refused
        root = tmp_path / "root"
        result = run_module("pipeline", "run", "--data-source", str(sample_dir), "--storage-root", str(root),
                            *TWO_WORKERS, env={names.TRACKING_URI_ENV: refusing}, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "published: fmnist version 1" in result.stdout
    warning = re.compile(r"warning: MLflow tracking is off for this step: .* failed: ")
    assert len(warning.findall(result.stderr)) == 1  # the pipeline's own (it opens the store first)
    (logs,) = root.glob("logs/*")
    chief = (logs / "train-cnn" / "worker-0.log").read_text()
    assert len(warning.findall(chief)) == 1 and "exported" in chief
    assert not warning.findall((logs / "train-cnn" / "worker-1.log").read_text())  # only the chief tracks
    assert len(warning.findall((logs / "select" / "worker-0.log").read_text())) == 1
