"""The whole workflow as a user submits it, every pod run for real: a Workflow of the stack's
WorkflowTemplate (nothing of ours substituted), Argo's executor in each step pod, ingest from the
mirror, a TrainJob whose two trainer pods find each other by JobSet's hostnames, selection, the
InferenceService's predictor Ready through its probes, a prediction through its Service, the tracking
server's runs and `champion`; then a second run whose ingest is memoized."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
import requests
from e2e_stack import PROMETHEUS_URL
from prometheus_scrape import file_targets, listening_port, write_targets

from common import tracking_names
from common.cluster_names import ISVC_LABEL, predictor_deployment_name
from engines.trainjob import JOBSET_NAME_LABEL, NODE_CONTAINER, RESTART_ATTEMPT_LABEL
from pipeline import argo
from serving import client
from tools import prometheus as prometheus_tool
from tools.control_plane.build import ROOT
from tools.control_plane.cluster import BRIDGE_ADDRESS
from tools.control_plane.nodes.real import NEVER_STARTS
from tools.control_plane.processes import answers
from tools.control_plane.pytest_plugin import unavailable
from tools.e2e import holdout_png

NAMESPACE = "dist-ml"  # Pulumi.local.yaml's
WORKFLOW_API = "argoproj.io/v1alpha1"
WORKFLOW_SECONDS = 1200.0
POLL_SECONDS = 2.0
LOG_LINES = 3  # of a failed container, in the run's message
MODEL = "fmnist"  # Pulumi.local.yaml's pipeline.modelName
EPOCH_METRIC = "epoch_seconds"  # trainer.train.EpochTracking logs it at every epoch's end


def never_starts(api) -> list[str]:
    """Each container of the namespace the kubelet says will not start, in its words."""
    found = []
    for pod in api.list("v1", "Pod", NAMESPACE):
        status = pod.get("status") or {}
        containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        for container in containers:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in NEVER_STARTS:
                found.append(f"pod {pod['metadata']['name']} container {container['name']}: "
                             f"{waiting['reason']}: {waiting.get('message')}")
    return found


def record_failures(api, failures: dict[str, str], say) -> None:
    """Each container of the namespace that ended with an error, once, with the end of its log: what a
    failed run's message names (JobSet replaces a failed attempt's pods)."""
    for pod in api.list("v1", "Pod", NAMESPACE):
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            ended = (container.get("state") or {}).get("terminated") or {}
            key = f"pod {pod['metadata']['name']} container {container['name']}"
            if ended.get("exitCode") and key not in failures:
                try:
                    tail = api.core.read_namespaced_pod_log(pod["metadata"]["name"], NAMESPACE,
                                                            container=container["name"], tail_lines=LOG_LINES)
                except Exception as error:  # noqa: BLE001 - the pod may be gone already
                    tail = f"(log unavailable: {error})"
                failures[key] = f"exit {ended['exitCode']} ({ended.get('reason')}): {tail.strip()}"
                say(f"{key} failed: {failures[key]}")


def failed_nodes(workflow: dict) -> list[str]:
    nodes = (workflow.get("status") or {}).get("nodes") or {}
    return [f"{node.get('displayName')}: {node.get('phase')}: {node.get('message')}"
            for node in nodes.values() if node.get("phase") in ("Failed", "Error")]


def run_workflow(api, say) -> dict:
    """Submits a run of the template and waits until it ends; the run's pods' or steps' own words at
    once if something in it will not happen."""
    workflow = argo.workflow()
    created = api.create({**workflow, "metadata": {**workflow["metadata"], "namespace": NAMESPACE}})
    name = created["metadata"]["name"]
    say(f"submitted workflow {NAMESPACE}/{name}")
    deadline, seen, failures = time.monotonic() + WORKFLOW_SECONDS, None, {}
    while True:
        current = api.get(WORKFLOW_API, "Workflow", name, NAMESPACE)
        status = current.get("status") or {}
        state = (status.get("phase"), status.get("progress"))
        if state != seen:
            seen = state
            say(f"workflow {name}: {state[0] or 'not started'} {state[1] or ''}")
        if status.get("phase") == "Succeeded":
            return current
        record_failures(api, failures, say)
        assert status.get("phase") not in ("Failed", "Error"), (
            f"workflow {name} ended {status.get('phase')}: {status.get('message')}; "
            + "; ".join([*failed_nodes(current), *(f"{key}: {what}" for key, what in failures.items())]))
        stuck = never_starts(api)
        assert not stuck, "; ".join(stuck)
        assert time.monotonic() < deadline, (f"workflow {name} still {state} after {WORKFLOW_SECONDS:g} s; "
                                             + "; ".join(f"{key}: {what}" for key, what in failures.items()))
        time.sleep(POLL_SECONDS)


def output(workflow: dict, step: str, parameter: str) -> str:
    nodes = [node for node in workflow["status"]["nodes"].values()
             if node.get("displayName") == step and (node.get("outputs") or {}).get("parameters")]
    (value,) = {p["value"] for node in nodes for p in node["outputs"]["parameters"] if p["name"] == parameter}
    return value


def tracking_get(api, workflow: dict, path: str, body: dict | None = None, **params: str) -> dict:
    """A GET (a POST with `body`) of MLflow's REST API on the tracking server's Service, with the Host
    the pipeline's pods send (the server refuses others: DNS rebinding), from outside the pod network."""
    uri = urllib.parse.urlsplit(tracking_uri(workflow))
    service = api.get("v1", "Service", uri.hostname.split(".")[0], NAMESPACE)
    response = requests.request(
        "POST" if body is not None else "GET",
        f"http://{service['spec']['clusterIP']}:{uri.port}/api/2.0/mlflow/{path}",
        params=params, json=body, headers={"Host": uri.netloc}, timeout=30)
    assert response.status_code == 200, (path, response.status_code, response.text)
    return response.json()


def tracking_uri(workflow: dict) -> str:
    """MLFLOW_TRACKING_URI as the run's select step had it."""
    spec = workflow["status"]["storedWorkflowTemplateSpec"]
    (template,) = [t for t in spec["templates"] if t["name"] == "select"]
    (uri,) = [env["value"] for env in template["container"]["env"] if env["name"] == "MLFLOW_TRACKING_URI"]
    return uri


INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # Kubernetes' Indexed Job: the pod's worker index
FIRST_EPOCH_END = re.compile(r"epoch 1/(\d+) ")  # trainer.train.ProgressLogger: its backup is on disk
RESUMED = re.compile(r"resuming from backup at epoch (\d+)/(\d+)")


def trainer_pods(api, attempt: int | None = None) -> dict[int, dict]:
    """The TrainJob's pods by worker index (of JobSet's restart `attempt`, or all)."""
    pods = [pod for pod in api.list("v1", "Pod", NAMESPACE)
            if JOBSET_NAME_LABEL in pod["metadata"].get("labels", {})]
    return {int(pod["metadata"]["labels"][INDEX_LABEL]): pod for pod in pods
            if attempt is None or pod["metadata"]["labels"].get(RESTART_ATTEMPT_LABEL) == str(attempt)}


class WorkerKiller(threading.Thread):
    """Follows worker 0's log; the moment it ends its first epoch (the backup written), SIGKILLs worker
    1's trainer container on the node, as a crash or the OOM killer would, with epochs still to go."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster, self.killed, self.when, self.error = cluster, None, None, None

    def run(self) -> None:
        try:
            self.kill_after_the_first_epoch()
        except Exception as error:  # noqa: BLE001 - reported by the test's own thread
            self.error = error

    def running_pair(self) -> tuple[dict, dict]:
        deadline = time.monotonic() + WORKFLOW_SECONDS  # the run's own bound: the test fails by then
        while time.monotonic() < deadline:
            pods = trainer_pods(self.cluster.api, attempt=0)
            if len(pods) == 2 and all(pod["status"].get("phase") == "Running" for pod in pods.values()):
                return pods[0], pods[1]
            time.sleep(POLL_SECONDS)
        raise TimeoutError(f"the two trainer pods were not Running together within {WORKFLOW_SECONDS} s")

    def kill_after_the_first_epoch(self) -> None:
        worker0, worker1 = self.running_pair()
        log = self.cluster.api.core.read_namespaced_pod_log(
            worker0["metadata"]["name"], NAMESPACE, container=NODE_CONTAINER, follow=True,
            _preload_content=False)
        seen, first_epoch = "", None
        for chunk in log.stream():
            seen += chunk.decode(errors="replace")
            if first_epoch := FIRST_EPOCH_END.search(seen):
                break
        log.release_conn()
        assert first_epoch, f"worker 0 ended without its first epoch: {seen[-600:]}"
        assert int(first_epoch[1]) > 1, f"one epoch only: nothing left to resume ({first_epoch[0]})"
        (container,) = [status for status in worker1["status"]["containerStatuses"]
                        if status["name"] == NODE_CONTAINER]
        self.cluster.real_node.kill_container(container["containerID"])
        self.killed = worker1["metadata"]["name"]
        self.when = first_epoch[0].strip()


def test_the_workflow_runs_end_to_end_on_the_real_node(cluster, say, tmp_path):
    api = cluster.api
    started = time.monotonic()
    killer = WorkerKiller(cluster)
    killer.start()
    workflow = run_workflow(api, say)
    say(f"workflow {workflow['metadata']['name']} Succeeded in {time.monotonic() - started:.0f} s")
    killer.join(timeout=POLL_SECONDS)
    assert killer.error is None and killer.killed, killer.error or "no trainer pod was killed"
    say(f"worker 0 ended {killer.when}: pod {killer.killed}'s trainer was SIGKILLed then")

    # Training: a worker killed after the first epoch; JobSet restarted the set, and its two new pods
    # resumed from the backup on the real node and ended Succeeded together.
    pods = trainer_pods(api)
    assert sorted(pods) == [0, 1], [pod["metadata"]["name"] for pod in pods.values()]
    for pod in pods.values():
        assert pod["spec"]["nodeName"] == cluster.real_node.name
        assert pod["status"]["phase"] == "Succeeded", (pod["metadata"]["name"], pod["status"])
        assert pod["metadata"]["labels"][RESTART_ATTEMPT_LABEL] == "1", pod["metadata"]["labels"]
    resumed = RESUMED.search(api.core.read_namespaced_pod_log(pods[0]["metadata"]["name"], NAMESPACE,
                                                              container=NODE_CONTAINER))
    assert resumed and int(resumed[1]) > 1, "worker 0 of the restarted set did not resume from the backup"
    say(f"JobSet restarted the set once; worker 0 {resumed[0]}")

    # Serving: the published version, Ready through the kubelet's probe, answers through its Service.
    version = output(workflow, "serve", "version")
    service = api.get("v1", "Service", f"{MODEL}-predictor", NAMESPACE)
    url = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    image = holdout_png(tmp_path)  # `0000-<label>.png`
    ((predicted, score),) = client.predict([image.read_bytes()], url=url, model_name=MODEL)
    label = image.stem.partition("-")[2]
    say(f"served version {version}: holdout image 0 (label {label}) -> {predicted} ({score:.3f})")

    # Tracking: the tracking server's pod holds the variant's run and points `champion` at the version.
    champion = tracking_get(api, workflow, "registered-models/alias", name=MODEL,
                            alias=tracking_names.CHAMPION)
    run = tracking_get(api, workflow, "runs/get", run_id=champion["model_version"]["run_id"])["run"]
    say(f"tracking: {MODEL} version {champion['model_version']['version']} is {tracking_names.CHAMPION}, "
        f"from run {run['info']['run_name']} ({run['info']['status']})")
    assert run["info"]["status"] == "FINISHED", run["info"]
    # The killed set resumed its run: one training run of the variant in this pipeline run, each epoch
    # logged once (the epoch it resumed from on), not a second run beside it.
    tags = {tag["key"]: tag["value"] for tag in run["data"].get("tags", [])}
    trainings = tracking_get(api, workflow, "runs/search", body={
        "experiment_ids": [run["info"]["experiment_id"]],
        "filter": f"tags.`{tracking_names.PIPELINE_RUN_TAG}` = '{tags[tracking_names.PIPELINE_RUN_TAG]}' "
                  f"and tags.`{tracking_names.STEP_TAG}` = 'train'"}).get("runs", [])
    assert [found["info"]["run_id"] for found in trainings] == [run["info"]["run_id"]], trainings
    assert tracking_names.RESTARTED_FROM_TAG not in tags, tags
    history = tracking_get(api, workflow, "metrics/get-history", run_id=run["info"]["run_id"],
                           metric_key=EPOCH_METRIC)["metrics"]
    steps = sorted(point["step"] for point in history)
    resumed_at, epochs = int(resumed[1]), int(resumed[2])
    assert len(steps) == len(set(steps)) and set(range(resumed_at, epochs + 1)) <= set(steps), steps
    say(f"tracking: run {run['info']['run_id']} resumed, {EPOCH_METRIC} logged at epochs {steps}")

    # A second run: ingest is memoized (the template says so), the rest runs again.
    again = run_workflow(api, say)
    ingest = [node for node in again["status"]["nodes"].values() if node.get("displayName") == "ingest"]
    assert any((node.get("memoizationStatus") or {}).get("hit") for node in ingest), ingest


# --- Scaling on load: KEDA's HPA, through the aggregation layer, on the stack's Prometheus query ------

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

    def __init__(self, url: str, image: bytes, clients: int):
        self.url, self.image, self.stopped = url, image, threading.Event()
        self.answered, self.errors = 0, []
        self.threads = [threading.Thread(target=self.send, daemon=True) for _ in range(clients)]

    def send(self) -> None:
        while not self.stopped.is_set():
            try:
                client.predict([self.image], url=self.url, model_name=MODEL)
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


def scaling_state(api) -> str:
    """The predictor's replicas and what KEDA's HPA says of them: the words a failed wait ends with."""
    name = predictor_deployment_name(MODEL)
    deployment = api.get("apps/v1", "Deployment", name, NAMESPACE)
    hpas = api.list("autoscaling/v2", "HorizontalPodAutoscaler", NAMESPACE)
    conditions = [f"{hpa['metadata']['name']} {c['type']}={c['status']} {c.get('reason')}: {c.get('message')}"
                  for hpa in hpas for c in (hpa.get("status") or {}).get("conditions") or []]
    metrics = [m for hpa in hpas for m in (hpa.get("status") or {}).get("currentMetrics") or []]
    status = deployment.get("status") or {}
    return (f"{name}: {deployment['spec'].get('replicas')} wanted, {status.get('readyReplicas', 0)} ready; "
            f"metrics {json.dumps(metrics)}; " + "; ".join(conditions))


def wait_for_ready_replicas(api, count: int, what: str) -> float:
    """Seconds until the predictor has `count` replicas wanted and ready; the HPA's words if not."""
    started = time.monotonic()
    name = predictor_deployment_name(MODEL)

    def scaled() -> bool:
        deployment = api.get("apps/v1", "Deployment", name, NAMESPACE)
        status = deployment.get("status") or {}
        return deployment["spec"].get("replicas") == count and status.get("readyReplicas", 0) == count

    while not scaled():
        assert time.monotonic() - started < SCALE_SECONDS, (
            f"{what}: not {count} replica(s) after {SCALE_SECONDS:g} s: {scaling_state(api)}")
        time.sleep(POLL_SECONDS)
    return time.monotonic() - started


def test_the_predictor_scales_from_one_replica_to_two_on_requests_in_flight_and_back(
    cluster, prometheus, say, tmp_path
):
    """The InferenceService the run served, scaled by KEDA (KServe's ScaledObject, KEDA's HPA, the
    external metric through KEDA's metrics adapter) on the stack's in-flight query, under load sent
    through the predictor's Service, then after it."""
    api = cluster.api
    wait_for_ready_replicas(api, 1, "before the load")
    service = api.get("v1", "Service", predictor_deployment_name(MODEL), NAMESPACE)
    url = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    with HeldLoad(url, holdout_png(tmp_path).read_bytes(), SCALE_CLIENTS) as load:
        up = wait_for_ready_replicas(api, 2, f"{SCALE_CLIENTS} requests held in flight")
        say(f"scaled to 2 replicas {up:.0f} s into the load: {scaling_state(api)}")
    assert not load.errors, load.errors[:3]
    down = wait_for_ready_replicas(api, 1, "after the load")
    say(f"back to 1 replica {down:.0f} s after the load ({load.answered} requests answered)")


# --- What will never serve: the serve step says so within a minute, in the kubelet's words -------------

STEP_ACCOUNT = "dist-ml-pipeline"  # Pulumi.local.yaml's pipeline.serviceAccountName
FAILS_WITHIN_SECONDS = 60.0  # from the kubelet's first warning about the predictor's pod
STEP_SECONDS = 240.0
POD_GONE_SECONDS = 120.0  # a deleted predictor's pods: their grace period, then the kubelet's cleanup
HISTORY_POLL_SECONDS = 1.0


def serve_manifest(api, version: str) -> dict:
    """The serve step's InferenceService as the installed WorkflowTemplate has the step create it."""
    template = api.get(WORKFLOW_API, "WorkflowTemplate", argo.WORKFLOW_TEMPLATE_NAME, NAMESPACE)
    (serve,) = [t for t in template["spec"]["templates"] if t["name"] == "serve"]
    args = serve["container"]["args"]
    text = args[args.index("--manifest") + 1].replace("{{inputs.parameters.version}}", version)
    return json.loads(text)


def broken_image(container: dict) -> str:
    container["image"] = container["image"].rpartition(":")[0] + ":never-built"
    return "ErrImagePull|ImagePullBackOff"


def broken_probe(container: dict) -> str:
    container["readinessProbe"]["httpGet"]["path"] = "/v2/models/no-such-model/ready"
    return "Readiness probe failed: HTTP probe failed with statuscode: 404"


def broken_memory(container: dict) -> str:
    # Below what Python itself needs at its start: the kernel kills it within a second. A limit that
    # TensorFlow's import crosses later (96Mi) has the kernel reclaim its libraries' pages and read them
    # again for minutes first (measured: 80 s to the kill at 96Mi, none in 120 s at 32Mi): no signal
    # for the step until then.
    container["resources"] = {"requests": {"cpu": "250m", "memory": "10Mi"},
                              "limits": {"cpu": "1", "memory": "10Mi"}}
    return "OOMKilled"


class PodHistory(threading.Thread):
    """What the API server said of the pods labelled `selector`, once a second: each container's state
    when it changed, and the kubelet's warnings about them, to tell a late kubelet from a late step."""

    def __init__(self, api, selector: str) -> None:
        super().__init__(daemon=True)
        self.api, self.selector, self.stop = api, selector, threading.Event()
        self.lines: list[str] = []
        self.first_warning: float | None = None  # epoch seconds, the kubelet's clock

    def run(self) -> None:
        last: dict[str, str] = {}
        while not self.stop.wait(HISTORY_POLL_SECONDS):
            try:
                self.look(last)
            except Exception as error:  # noqa: BLE001 - one look lost; the next one sees the rest
                self.lines.append(f"{time.strftime('%H:%M:%S')} not read: {type(error).__name__}: {error}")

    def look(self, last: dict[str, str]) -> None:
        """One read of the pods' states and the kubelet's warnings about them."""
        pods = self.api.list("v1", "Pod", NAMESPACE, label_selector=self.selector)
        for pod in pods:
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                key, seen = f"{pod['metadata']['name']}/{status['name']}", container_state(status)
                if last.get(key) != seen:
                    self.lines.append(f"{time.strftime('%H:%M:%S')} {key}: {seen}")
                    last[key] = seen
        names = {pod["metadata"]["name"] for pod in pods}
        for event in self.api.list("v1", "Event", NAMESPACE, field_selector="type=Warning"):
            if event["involvedObject"]["name"] in names and from_kubelet(event):
                stamp = event.get("firstTimestamp") or event["eventTime"]
                at = datetime.datetime.fromisoformat(stamp).timestamp()
                if self.first_warning is None or at < self.first_warning:
                    self.first_warning = at
                    self.lines.append(f"{time.strftime('%H:%M:%S')} the kubelet's first warning "
                                      f"({stamp}): {event['reason']}: {event['message']}")

    def __enter__(self) -> PodHistory:
        self.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop.set()
        self.join()


def from_kubelet(event: dict) -> bool:
    return "kubelet" in ((event.get("source") or {}).get("component"), event.get("reportingComponent"))


def container_state(status: dict) -> str:
    (state, detail), = ((key, value) for key, value in (status.get("state") or {}).items() if value)
    last = ((status.get("lastState") or {}).get("terminated") or {}).get("reason")
    return (f"{state} {(detail or {}).get('reason') or ''} restarts={status.get('restartCount')}"
            f"{' last=' + last if last else ''}")


@pytest.fixture
def published(cluster, say) -> None:
    """Version 1 on the storage, as the workflow's first run publishes it: the predictor must have a
    model to load for its probe to answer. Run alone, these tests run the workflow first."""
    runs = cluster.api.list(WORKFLOW_API, "Workflow", NAMESPACE)
    if not any((run.get("status") or {}).get("phase") == "Succeeded" for run in runs):
        run_workflow(cluster.api, say)


@pytest.mark.parametrize("breaks", [broken_image, broken_probe, broken_memory],
                         ids=["unpullable-image", "probe-on-a-missing-path", "over-its-memory-limit"])
def test_a_predictor_that_will_never_serve_fails_the_serve_step_within_a_minute(
    cluster, say, tmp_path, breaks, published
):
    """The serve step (cluster_steps.release deploy, as the workflow's account) of the version the run
    published, its predictor changed as a user's mistake would change it."""
    manifest = serve_manifest(cluster.api, "1")
    manifest["metadata"]["name"] = f"{MODEL}-{breaks.__name__.replace('_', '-')}"
    (container,) = manifest["spec"]["predictor"]["containers"]
    expected = breaks(container)
    kubeconfig = cluster.kubeconfig_for(NAMESPACE, STEP_ACCOUNT, f"serve-{breaks.__name__}")
    name = manifest["metadata"]["name"]
    started = time.monotonic()
    with PodHistory(cluster.api, f"{ISVC_LABEL}={name}") as history:
        step = subprocess.run(
            [sys.executable, "-m", "cluster_steps.release", "deploy", "--namespace", NAMESPACE,
             "--canary-percent", "0", "--timeout-seconds", str(int(STEP_SECONDS)),
             "--version-file", str(tmp_path / "version"), "--manifest", json.dumps(manifest)],
            cwd=ROOT, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, capture_output=True, text=True,
            timeout=STEP_SECONDS + 60)
        ended = time.time()
    said = (step.stdout + step.stderr).strip()
    seen = "\n".join(history.lines)
    seconds = time.monotonic() - started
    say(f"{breaks.__name__}: the serve step ended {step.returncode} after {seconds:.0f} s: {said[-400:]}")
    say(seen)
    assert step.returncode != 0 and re.search(expected, said), f"{said}\n{seen}"
    # The promise: a minute from the kubelet's word (KServe's reconcile and the pod's start, slower on a
    # loaded machine, come before it). The event's time has the API server's whole seconds.
    assert history.first_warning is not None, seen
    assert ended - history.first_warning < FAILS_WITHIN_SECONDS + 1, seen
    cluster.api.delete("serving.kserve.io/v1beta1", "InferenceService", name, NAMESPACE)
    # Its pods gone before the next test's ask the node for room.
    cluster.api.wait(
        lambda: not cluster.api.list("v1", "Pod", NAMESPACE, label_selector=f"{ISVC_LABEL}={name}"),
        f"the pods of {name} gone", POD_GONE_SECONDS)
