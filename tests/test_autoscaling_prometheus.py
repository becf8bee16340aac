"""The autoscaler's queries, exactly as the rendered InferenceService's KEDA trigger carries them,
answered by a real Prometheus (Debian's, unpacked by tools/prometheus.py, which `make test` runs)
scraping our model server under a known load: CLIENTS clients held in flight read as about CLIENTS
requests in flight; the request rate reads the clients' requests (the share of its one-minute window
that was scraped). A query naming a wrong metric or label, which would never scale anything, finds
nothing.

The server holds each batch open for BATCH_WAIT_MS (--max-batch-wait-ms), so that every client's
request is in flight nearly all the time: the clients' requests share a batch and are answered
together, and the moment between an answer and the next request, which a loaded machine stretches
(200 ms held let a scrape read 1 of 4 under a full load), is a small share of each second.
Prometheus scrapes it every second with the labels Prometheus Operator gives a target of the
stacks' PodMonitor (`namespace`, `pod`, `container`, `endpoint`, `job`, and each podTargetLabels
label under its sanitized name: v0.87.1 pkg/prometheus/promcfg.go generatePodMonitorConfig
1483-1538), and starts once the load is on; the queries are evaluated at a
moment the load was still on (at the latest a second before the clients' deadline, however slowly a
loaded machine started Prometheus), so that their one-minute window holds loaded samples only (on a
cluster, the load would have lasted that long).
Every server binds port 0: ours reports its port (serving.process), Prometheus's is read from its
listening socket."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from conftest import in_ci
from prometheus_scrape import listening_port, target_labels
from stack_checks import STACK_NAMESPACE, embedded

from cluster_steps.inference_service import PREDICTOR_PORT_NAME
from common.cluster_names import ISVC_LABEL, PREDICTOR_CONTAINER
from engines import DEFAULT_ENGINE, ENGINES
from infra.monitoring import monitors
from pipeline import argo
from pipeline.config import parse_config
from serving.loadtest import generated_images, run_load
from serving.process import running_server, stop
from tools import prometheus

pytestmark = pytest.mark.slow  # starts the model server and Prometheus

MODEL = "fmnist"
CLIENTS = 4
BATCH_WAIT_MS = 1000
LOAD_SECONDS = 16.0
SCRAPES = 6  # seconds of samples before the queries are asked
LOADED_MARGIN_SECONDS = 1.0  # before the clients' deadline: every client still holds a request
POD = f"{MODEL}-predictor-7d9f8c6b5-x2k4q"  # a name KServe's Deployment gives a predictor pod


def trigger_query(metric: str) -> str:
    """The query of the rendered InferenceService's one External metric, as a run submits it."""
    config = parse_config({"serving": {"autoscaling": {"metric": metric}}})
    isvc = embedded(argo.workflow_template(config), "serve")
    (spec,) = isvc["spec"]["predictor"]["autoScaling"]["metrics"]
    return spec["external"]["metric"]["query"]


@pytest.fixture(scope="module")
def prometheus_binary() -> Path:
    if prometheus.BINARY.is_file():
        return prometheus.BINARY
    message = f"Prometheus {prometheus.RELEASE} is not at {prometheus.BINARY}: run {prometheus.INSTALL_HINT}"
    if in_ci():
        pytest.fail(f"{message} (CI=true, so not skipped)", pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def prometheus_scraping(binary: Path, server_url: str, labels: dict[str, str], work: Path) -> Iterator[str]:
    config = work / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "predictor", "static_configs": [
            {"targets": [server_url.removeprefix("http://")], "labels": labels}]}]}))
    log = work / "prometheus.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [str(binary), f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb",
             "--web.listen-address=127.0.0.1:0"], stdout=out, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{listening_port(process, log)}"
    finally:
        stop(process)


def query(prometheus_url: str, promql: str, at: float | None = None) -> list[dict]:
    """The query's answer, evaluated now or at Unix time `at`."""
    parameters = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
    url = f"{prometheus_url}/api/v1/query?{urllib.parse.urlencode(parameters)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def wait_for_samples(prometheus_url: str, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = query(prometheus_url, "count_over_time(up[1m])")
        if found and float(found[0]["value"][1]) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus took fewer than {count} samples in {timeout:.0f}s")


def server_in_flight(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return float(re.search(r"^dist_ml_requests_in_flight (\S+)$", text, re.M)[1])


def test_the_triggers_queries_read_the_load_the_clients_put_on_the_server(
        published_repo, prometheus_binary, tmp_path):
    started = time.monotonic()
    queries = {metric: trigger_query(metric) for metric in ("inflight", "rps")}
    (podmonitor,) = [m for m in monitors(STACK_NAMESPACE, MODEL, "custom", ENGINES[DEFAULT_ENGINE])
                     if m["kind"] == "PodMonitor"]
    assert podmonitor["spec"]["podMetricsEndpoints"][0]["port"] == PREDICTOR_PORT_NAME
    labels = target_labels(podmonitor, STACK_NAMESPACE, POD, PREDICTOR_CONTAINER,
                           {ISVC_LABEL: MODEL, "component": "predictor"})
    server_args = ["--model-repo", published_repo, "--model-name", MODEL,
                   "--max-batch-wait-ms", BATCH_WAIT_MS]
    with running_server(server_args, MODEL, tmp_path / "server.log") as (url, _):
        load = {}
        clients = threading.Thread(target=lambda: load.update(report=run_load(
            url, generated_images(), CLIENTS, model_name=MODEL, duration=LOAD_SECONDS)))
        loaded_until = time.time() + LOAD_SECONDS - LOADED_MARGIN_SECONDS
        clients.start()
        try:
            while server_in_flight(url) < 1:  # the load is on before the first scrape
                time.sleep(0.05)
            with prometheus_scraping(prometheus_binary, url, labels, tmp_path) as prometheus_url:
                wait_for_samples(prometheus_url, SCRAPES)
                at = min(time.time(), loaded_until)
                loaded = query(prometheus_url, "count_over_time(up[1m])", at)
                assert loaded and float(loaded[0]["value"][1]) >= 2, (
                    f"Prometheus took fewer than 2 samples under load (by {at:.0f}): {loaded}")
                answers = {metric: query(prometheus_url, promql, at) for metric, promql in queries.items()}
                in_flight_query = queries["inflight"]
                wrong = {
                    "a wrong metric": in_flight_query.replace("requests_in_flight", "requests_inflight"),
                    "another InferenceService": in_flight_query.replace(f'="{MODEL}"', f'="{MODEL}-canary"'),
                    "a label the monitor does not set": in_flight_query.replace(
                        "serving_kserve_io_inferenceservice=", "inferenceservice="),
                    "another namespace": queries["rps"].replace(f'"{STACK_NAMESPACE}"', '"default"'),
                }
                missed = {name: query(prometheus_url, promql, at) for name, promql in wrong.items()}
        finally:
            clients.join()
    report = load["report"]
    assert report.error_rate == 0, report.summary()
    # KEDA's Prometheus scaler takes one sample (prometheus_scaler.go: more is an error, none is 0).
    (in_flight,), (rate,) = answers["inflight"], answers["rps"]
    assert 0.8 * CLIENTS <= float(in_flight["value"][1]) <= CLIENTS, answers
    # rate() divides the increase it sees by the whole window: with SCRAPES seconds of a one-minute
    # window sampled, it reads that share of the clients' rate (full after a minute of load).
    share = float(rate["value"][1]) / report.requests_per_second
    assert 0 < share <= 1, (answers, report.summary())
    assert missed == {name: [] for name in wrong}, missed
    print(f"in flight {float(in_flight['value'][1]):.2f} of {CLIENTS}; rps {float(rate['value'][1]):.2f} "
          f"(clients: {report.requests_per_second:.1f}); {time.monotonic() - started:.1f} s")
