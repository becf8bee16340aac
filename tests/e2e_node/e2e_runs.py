"""What the end-to-end scenarios share about runs of the stack's workflow: submitting one and waiting
for it to end (with the pods' and steps' own words when something in it will not happen), reading its
outputs and the tracking server's REST API, the TrainJob's pods, the predictor's Service, and what the
served model answers for images whose labels are known."""

from __future__ import annotations

import dataclasses
import re
import signal
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np
import requests
from e2e_stack import NAMESPACE

from common.cluster_names import predictor_deployment_name
from engines.trainjob import JOBSET_NAME_LABEL, NODE_CONTAINER, RESTART_ATTEMPT_LABEL
from pipeline import argo
from serving import client
from tools.control_plane.nodes.real import never_starts, signalled
from trainer.fashion_mnist import CLASS_NAMES

WORKFLOW_SECONDS = 1200.0
POLL_SECONDS = 2.0
LOG_LINES = 3  # of a failed container, in the run's message
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # Kubernetes' Indexed Job: the pod's worker index
# The holdout's first images, sent in one request (serving.inputs.MAX_INSTANCES is 64): one image alone
# proves little of a small model.
CHECKED_IMAGES = 50
# Chance is one in ten. The e2e's model (conftest.E2E_SETTINGS: `cnn`, three passes over the sample's
# 450 training images) scores about 0.7; a model that answers the wrong class scores near 0.
MIN_ACCURACY = 0.4


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


def submit(api, workflow: dict, say) -> str:
    created = api.create({**workflow, "metadata": {**workflow["metadata"], "namespace": NAMESPACE}})
    name = created["metadata"]["name"]
    say(f"submitted workflow {NAMESPACE}/{name}")
    return name


def wait_until_ended(api, name: str, say, seconds: float = WORKFLOW_SECONDS,
                     stuck_fails: bool = True) -> tuple[dict, dict[str, str]]:
    """The Workflow `name` once it has ended, whatever its phase, and its failed containers' last words;
    a failure of the test at the deadline, and (`stuck_fails`) in the pods' own words if one of the
    namespace's will never start."""
    deadline, seen, failures = time.monotonic() + seconds, None, {}
    while True:
        current = api.get(argo.API_VERSION, "Workflow", name, NAMESPACE)
        status = current.get("status") or {}
        state = (status.get("phase"), status.get("progress"))
        if state != seen:
            seen = state
            say(f"workflow {name}: {state[0] or 'not started'} {state[1] or ''}")
        record_failures(api, failures, say)
        if status.get("phase") in ("Succeeded", "Failed", "Error"):
            return current, failures
        stuck = never_starts(api, NAMESPACE) if stuck_fails else []
        assert not stuck, "; ".join(stuck)
        assert time.monotonic() < deadline, (f"workflow {name} still {state} after {seconds:g} s; "
                                             + "; ".join(f"{key}: {what}" for key, what in failures.items()))
        time.sleep(POLL_SECONDS)


def run_workflow(api, say) -> dict:
    """Submits a run of the stack's template and waits until it Succeeded; the run's pods' or steps' own
    words at once if something in it will not happen."""
    name = submit(api, argo.workflow(), say)
    ended, failures = wait_until_ended(api, name, say)
    status = ended["status"]
    assert status["phase"] == "Succeeded", (
        f"workflow {name} ended {status['phase']}: {status.get('message')}; "
        + "; ".join([*failed_nodes(ended), *(f"{key}: {what}" for key, what in failures.items())]))
    return ended


def output(workflow: dict, step: str, parameter: str) -> str:
    nodes = [node for node in workflow["status"]["nodes"].values()
             if node.get("displayName") == step and (node.get("outputs") or {}).get("parameters")]
    (value,) = {p["value"] for node in nodes for p in node["outputs"]["parameters"] if p["name"] == parameter}
    return value


def tracking_uri(workflow: dict) -> str:
    """MLFLOW_TRACKING_URI as the run's select step had it."""
    spec = workflow["status"]["storedWorkflowTemplateSpec"]
    (template,) = [t for t in spec["templates"] if t["name"] == "select"]
    (uri,) = [env["value"] for env in template["container"]["env"] if env["name"] == "MLFLOW_TRACKING_URI"]
    return uri


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


def tags_of(entity: dict) -> dict[str, str]:
    """An MLflow run's or model version's tags as a dict (the REST API lists them)."""
    found = entity.get("tags") or (entity.get("data") or {}).get("tags") or []
    return {tag["key"]: tag["value"] for tag in found}


def trainer_pods(api, attempt: int | None = None) -> dict[int, dict]:
    """The TrainJob's pods by worker index (of JobSet's restart `attempt`, or all)."""
    pods = [pod for pod in api.list("v1", "Pod", NAMESPACE)
            if JOBSET_NAME_LABEL in pod["metadata"].get("labels", {})]
    return {int(pod["metadata"]["labels"][INDEX_LABEL]): pod for pod in pods
            if attempt is None or pod["metadata"]["labels"].get(RESTART_ATTEMPT_LABEL) == str(attempt)}


def predictor_url(api, model: str) -> str:
    """The predictor's Service, from outside the pod network (kube-proxy's rules on the tier's host)."""
    service = api.get("v1", "Service", predictor_deployment_name(model), NAMESPACE)
    return f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def served_predictions(url: str, model: str, images: list[bytes]) -> list[dict]:
    """The v1 protocol's predictions for `images`, each with every class's probability."""
    path, body, headers = client.http_request(images, "v1", model)
    response = requests.post(url + path, data=body, headers=headers, timeout=client.TIMEOUT_SECONDS)
    assert response.status_code == 200, (response.status_code, response.text)
    return response.json()["predictions"]


def disagreements(predictions: list[dict], labels: np.ndarray) -> tuple[list[str], float]:
    """What the served classes get wrong: each image whose served class is not the class of its highest
    served probability, and the accuracy on the images' known labels; each line names the predicted
    and the expected class."""
    wrong, correct = [], 0
    for index, (prediction, label) in enumerate(zip(predictions, labels, strict=True)):
        served, expected = prediction["class_name"], CLASS_NAMES[int(label)]
        likeliest = CLASS_NAMES[int(np.argmax(prediction["probabilities"]))]
        correct += served == expected
        if served != likeliest:
            wrong.append(f"image {index}: predicted {served!r}, expected {expected!r}, but its highest "
                         f"probability ({max(prediction['probabilities']):.3f}) is {likeliest!r}")
    return wrong, correct / len(labels)


def label_of(png: Path) -> int:
    return int(png.stem.partition("-")[2])


def check_served_classes(url: str, model: str, pngs: list[Path]) -> str:
    """Fails, naming the predicted and expected classes, unless the served classes agree with the served
    probabilities and the accuracy on the images sent is well above chance; what it found, in a line."""
    predictions = served_predictions(url, model, [png.read_bytes() for png in pngs])
    labels = np.array([label_of(png) for png in pngs])
    wrong, accuracy = disagreements(predictions, labels)
    found = [f"{index}: predicted {p['class_name']!r}, expected {CLASS_NAMES[int(label)]!r}"
             for index, (p, label) in enumerate(zip(predictions, labels, strict=True))]
    assert not wrong, "; ".join(wrong)
    assert accuracy >= MIN_ACCURACY, (f"accuracy {accuracy:.2f} on {len(pngs)} holdout images, under "
                                      f"{MIN_ACCURACY}: " + "; ".join(found))
    return f"accuracy {accuracy:.2f} on {len(pngs)} holdout images (chance 0.10)"


FIRST_EPOCH_END = re.compile(r"epoch 1/(\d+) ")  # trainer.train.ProgressLogger: its backup is on disk
HOLD_SLICE_SECONDS = 0.1  # how long worker 1's trainer runs between WorkerKiller's looks at worker 0's log


class WorkerKiller(threading.Thread):
    """Once worker 0 has ended its first epoch (the backup written), SIGKILLs worker 1's trainer
    container on the node, as a crash or the OOM killer would, with epochs still to go."""

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
        (container,) = [status for status in worker1["status"]["containerStatuses"]
                        if status["name"] == NODE_CONTAINER]
        node = self.cluster.real_node
        trainer = node.container_pids(container["containerID"])
        try:
            first_epoch = self.first_epoch_held(worker0, trainer)
            assert int(first_epoch[1]) > 1, f"one epoch only: nothing left to resume ({first_epoch[0]})"
            node.kill_container(container["containerID"])
        finally:
            signalled(trainer, signal.SIGCONT)
        self.killed = worker1["metadata"]["name"]
        self.when = first_epoch[0].strip()

    def first_epoch_held(self, worker0: dict, trainer: list[int]) -> re.Match:
        """Worker 0's first-epoch line, read while worker 1's trainer is stopped (SIGSTOP), as it stays.
        The trainer runs HOLD_SLICE_SECONDS between looks, and synchronous training ends no epoch without
        it: after epoch 1 the rest takes a few seconds, and a loaded machine may take as long to act."""
        name, deadline = worker0["metadata"]["name"], time.monotonic() + WORKFLOW_SECONDS
        while time.monotonic() < deadline:
            if not signalled(trainer, signal.SIGSTOP):
                raise AssertionError(f"worker 1's trainer ended before worker 0 ({name}) ended an epoch")
            logged = self.cluster.api.core.read_namespaced_pod_log(name, NAMESPACE, container=NODE_CONTAINER)
            if first_epoch := FIRST_EPOCH_END.search(logged):
                return first_epoch
            signalled(trainer, signal.SIGCONT)
            time.sleep(HOLD_SLICE_SECONDS)
        raise TimeoutError(f"worker 0 ({name}) ended no epoch within {WORKFLOW_SECONDS} s")


@dataclasses.dataclass(frozen=True)
class FirstRun:
    """The session's first run of the workflow, a trainer worker killed in it, and how long it took."""

    workflow: dict
    killer: WorkerKiller
    seconds: float
