"""Scaling on load: the InferenceService the first run served, scaled by KEDA (KServe's ScaledObject,
KEDA's HPA, the external metric through KEDA's metrics adapter) on the stack's in-flight query, under
load sent through the predictor's Service, then after it. The cluster's own Prometheus (the stack's
monitoring.prometheusUrl) scrapes the predictor's pods."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse

import pytest
from e2e_runs import POLL_SECONDS, predictor_url
from e2e_stack import NAMESPACE, PROMETHEUS_URL
from prometheus_scrape import file_targets, listening_port, write_targets

from common.cluster_names import predictor_deployment_name
from serving import client
from tools import prometheus as prometheus_tool
from tools.control_plane.cluster import BRIDGE_ADDRESS
from tools.control_plane.processes import answers
from tools.control_plane.pytest_plugin import unavailable
from tools.e2e import holdout_png

SCALE_CLIENTS = 6  # requests held in flight: three times one replica's target (conftest.E2E_SCALING)
SCALE_SECONDS = 240.0
DISCOVERY_SECONDS = 1.0
PROMETHEUS_START_SECONDS = 60.0


@pytest.fixture
def prometheus(cluster, tmp_path):
    """The cluster's own Prometheus (the stack's monitoring.prometheusUrl names it): Debian's, behind a
    Service of that name with no selector, its endpoint the process on the tier's bridge, where KEDA's
    operator reaches it through CoreDNS and kube-proxy. It scrapes every pod the stack's PodMonitor
    selects, as the Prometheus Operator would configure it, the pods discovered here each second
    (prometheus_scrape.py). Its URL."""
    if not prometheus_tool.BINARY.is_file():
        unavailable(f"Prometheus {prometheus_tool.RELEASE} is not unpacked: {prometheus_tool.INSTALL_HINT}")
    (podmonitor,) = cluster.api.list("monitoring.coreos.com/v1", "PodMonitor", NAMESPACE)
    (endpoint,) = podmonitor["spec"]["podMetricsEndpoints"]
    targets = tmp_path / "targets.json"
    write_targets(targets, [])
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": endpoint["interval"], "evaluation_interval": endpoint["interval"]},
        "scrape_configs": [{"job_name": "podmonitor", "metrics_path": endpoint["path"],
                            "file_sd_configs": [{"files": [str(targets)]}]}]}))
    log = tmp_path / "prometheus.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [str(prometheus_tool.BINARY), f"--config.file={config}", f"--storage.tsdb.path={tmp_path}/tsdb",
             f"--web.listen-address={BRIDGE_ADDRESS}:0"], stdout=out, stderr=subprocess.STDOUT)
    stopped = threading.Event()

    def discover() -> None:
        while not stopped.wait(DISCOVERY_SECONDS):
            write_targets(targets, file_targets(podmonitor, cluster.api.list("v1", "Pod", NAMESPACE)))

    discovery = threading.Thread(target=discover, daemon=True)
    try:
        port = listening_port(server, log)
        address = urllib.parse.urlsplit(PROMETHEUS_URL)
        service_name, namespace = address.hostname.split(".")[:2]
        metadata = {"name": service_name, "namespace": namespace}
        cluster.api.apply({"apiVersion": "v1", "kind": "Service", "metadata": metadata,
                           "spec": {"ports": [{"name": "http-web", "port": address.port}]}})
        cluster.api.apply({"apiVersion": "v1", "kind": "Endpoints", "metadata": metadata, "subsets": [
            {"addresses": [{"ip": BRIDGE_ADDRESS}], "ports": [{"name": "http-web", "port": port}]}]})
        discovery.start()
        url = f"http://{BRIDGE_ADDRESS}:{port}"
        cluster.api.wait(answers(f"{url}/-/ready"), "Prometheus ready", PROMETHEUS_START_SECONDS)
        yield url
    finally:
        stopped.set()
        if discovery.is_alive():
            discovery.join()
        server.terminate()
        server.wait(timeout=30)


class HeldLoad:
    """`clients` threads, each sending one holdout image after another through `url` until stopped."""

    def __init__(self, url: str, model: str, image: bytes, clients: int):
        self.url, self.model, self.image, self.stopped = url, model, image, threading.Event()
        self.answered, self.errors = 0, []
        self.threads = [threading.Thread(target=self.send, daemon=True) for _ in range(clients)]

    def send(self) -> None:
        while not self.stopped.is_set():
            try:
                client.predict([self.image], url=self.url, model_name=self.model)
                self.answered += 1
            except Exception as error:  # noqa: BLE001 - counted, and the test fails on any
                self.errors.append(repr(error))

    def __enter__(self) -> HeldLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join()


def scaling_state(api, model: str) -> str:
    """The predictor's replicas and what KEDA's HPA says of them: the words a failed wait ends with."""
    name = predictor_deployment_name(model)
    deployment = api.get("apps/v1", "Deployment", name, NAMESPACE)
    hpas = api.list("autoscaling/v2", "HorizontalPodAutoscaler", NAMESPACE)
    conditions = [f"{hpa['metadata']['name']} {c['type']}={c['status']} {c.get('reason')}: {c.get('message')}"
                  for hpa in hpas for c in (hpa.get("status") or {}).get("conditions") or []]
    metrics = [m for hpa in hpas for m in (hpa.get("status") or {}).get("currentMetrics") or []]
    status = deployment.get("status") or {}
    return (f"{name}: {deployment['spec'].get('replicas')} wanted, {status.get('readyReplicas', 0)} ready; "
            f"metrics {json.dumps(metrics)}; " + "; ".join(conditions))


def wait_for_ready_replicas(api, model: str, count: int, what: str) -> float:
    """Seconds until the predictor has `count` replicas wanted and ready; the HPA's words if not."""
    started = time.monotonic()
    name = predictor_deployment_name(model)

    def scaled() -> bool:
        deployment = api.get("apps/v1", "Deployment", name, NAMESPACE)
        status = deployment.get("status") or {}
        return deployment["spec"].get("replicas") == count and status.get("readyReplicas", 0) == count

    while not scaled():
        assert time.monotonic() - started < SCALE_SECONDS, (
            f"{what}: not {count} replica(s) after {SCALE_SECONDS:g} s: {scaling_state(api, model)}")
        time.sleep(POLL_SECONDS)
    return time.monotonic() - started


def test_the_predictor_scales_from_one_replica_to_two_on_requests_in_flight_and_back(
    cluster, first_run, prometheus, say, tmp_path
):
    api, model = cluster.api, cluster.config.pipeline.model_name
    wait_for_ready_replicas(api, model, 1, "before the load")
    image = holdout_png(tmp_path).read_bytes()
    with HeldLoad(predictor_url(api, model), model, image, SCALE_CLIENTS) as load:
        up = wait_for_ready_replicas(api, model, 2, f"{SCALE_CLIENTS} requests held in flight")
        say(f"scaled to 2 replicas {up:.0f} s into the load: {scaling_state(api, model)}")
    assert not load.errors, load.errors[:3]
    down = wait_for_ready_replicas(api, model, 1, "after the load")
    say(f"back to 1 replica {down:.0f} s after the load ({load.answered} requests answered)")
