"""The serve step's rollout on a cluster: it succeeds only when every predictor replica runs the
version the run published, fails with the reason when a pod cannot start, and gives up at its
timeout; a fake API server stands in for the cluster, answering as Kubernetes and KServe do."""

from __future__ import annotations

import json
import subprocess
import sys
from unittest import mock

import pytest
from conftest import REPO_ROOT, run_module

from pipeline import argo
from pipeline.config import parse_config
from pipeline.manifests import ClusterTarget, gcs_storage, inference_service
from serving import rollout

NAMESPACE = "dist-ml"
OLD_URI, NEW_URI = "gs://bucket/releases/fmnist/2", "gs://bucket/releases/fmnist/3"


def manifest(version: str = "3") -> dict:
    return inference_service(parse_config({}), ClusterTarget(storage=gcs_storage("bucket")), version)


def deployment(uri: str, generation: int = 2, observed: int = 2, replicas: int = 2, updated: int = 2,
               total: int = 2, available: int = 2, conditions: list | None = None) -> dict:
    """The predictor's Deployment as the API server returns it; KServe writes the storage URI into
    its pod template (the storage initializer's source annotation)."""
    template = {"metadata": {"annotations": {
        "internal.serving.kserve.io/storage-initializer-sourceuri": uri}}, "spec": {"containers": []}}
    return {"metadata": {"name": "fmnist-predictor", "generation": generation},
            "spec": {"replicas": replicas, "template": template},
            "status": {"observedGeneration": observed, "replicas": total, "updatedReplicas": updated,
                       "availableReplicas": available, "conditions": conditions or []}}


def pod(uri: str, waiting: str | None = None, container: str = "storage-initializer",
        message: str = "") -> dict:
    statuses = [{"name": container, "state": {"waiting": {"reason": waiting, "message": message}}
                 if waiting else {"running": {}}}]
    key = "initContainerStatuses" if container == "storage-initializer" else "containerStatuses"
    return {"metadata": {"name": f"fmnist-predictor-{uri[-1]}-abc",
                         "annotations": {"internal.serving.kserve.io/storage-initializer-sourceuri": uri}},
            "status": {key: statuses}}


class FakeCluster:
    """Answers each poll with the next (deployment, pods) state; records what was applied."""

    def __init__(self, states: list[tuple[dict | None, list[dict]]], existing: dict | None = None):
        self.states, self.existing = list(states), existing
        self.created: list[dict] = []
        self.replaced: list[dict] = []

    def get_inference_service(self, namespace, name):
        return self.existing

    def create_inference_service(self, namespace, manifest):
        self.created.append(manifest)

    def replace_inference_service(self, namespace, name, manifest):
        self.replaced.append(manifest)

    def _state(self):
        return self.states[0] if len(self.states) == 1 else self.states.pop(0)

    def get_deployment(self, namespace, name):
        assert name == "fmnist-predictor"
        return self._state()[0]

    def list_pods(self, namespace, label_selector):
        assert label_selector == "serving.kserve.io/inferenceservice=fmnist"
        return self.states[0][1]


def roll(cluster: FakeCluster, timeout: float = 60.0) -> tuple[str, list[str]]:
    said, now = [], [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    reached = rollout.roll_out(cluster, NAMESPACE, manifest(), timeout, poll_seconds=5,
                               clock=lambda: now[0], sleep=sleep, say=said.append)
    return reached, said


def test_it_waits_through_a_rolling_update_until_every_replica_runs_the_new_version():
    cluster = FakeCluster([
        (None, []),  # KServe has not created the Deployment yet
        (deployment(OLD_URI, generation=1, observed=1), [pod(OLD_URI)]),  # nor updated it
        (deployment(NEW_URI, generation=2, observed=1), [pod(OLD_URI)]),
        (deployment(NEW_URI, updated=1, total=3), [pod(OLD_URI), pod(NEW_URI)]),
        (deployment(NEW_URI, updated=2, total=3), [pod(OLD_URI), pod(NEW_URI)]),  # old one terminating
        (deployment(NEW_URI, available=1), [pod(NEW_URI)]),
        (deployment(NEW_URI), [pod(NEW_URI)]),
    ], existing={"metadata": {"name": "fmnist", "resourceVersion": "41"}})
    reached, said = roll(cluster)
    assert reached == "2 of 2 replicas serve it"
    assert [line.removeprefix("rollout: waiting: ") for line in said[1:]] == [
        "the predictor's Deployment does not exist yet",
        "KServe has not yet updated the predictor's Deployment",
        "the Deployment controller has not yet seen the new pod template",
        "1 of 2 replicas run the new version",
        "1 replicas of an earlier version are still terminating",
        "1 of 2 new replicas are available",
    ]
    # An existing InferenceService is replaced with the run's spec, at the version it was read at.
    (replaced,) = cluster.replaced
    assert replaced["metadata"]["resourceVersion"] == "41" and cluster.created == []
    assert rollout.storage_uri(replaced) == NEW_URI


def test_a_first_rollout_creates_the_inference_service():
    cluster = FakeCluster([(deployment(NEW_URI), [pod(NEW_URI)])])
    roll(cluster)
    assert [m["metadata"]["name"] for m in cluster.created] == ["fmnist"] and cluster.replaced == []


def test_a_stale_ready_status_of_the_previous_version_is_not_success():
    """The trap of KServe's status in Standard mode: everything looks ready, for the old version."""
    cluster = FakeCluster([(deployment(OLD_URI), [pod(OLD_URI)])])
    with pytest.raises(rollout.RolloutError, match="not rolled out after 60 s: KServe has not yet updated"):
        roll(cluster)


@pytest.mark.parametrize(("waiting", "container"), [
    ("ImagePullBackOff", "kserve-container"), ("CrashLoopBackOff", "storage-initializer"),
    ("CrashLoopBackOff", "kserve-container"), ("CreateContainerConfigError", "kserve-container")])
def test_a_pod_of_the_new_version_that_cannot_start_fails_the_rollout_with_its_reason(waiting, container):
    cluster = FakeCluster([(deployment(NEW_URI, updated=1, total=3, available=2),
                            [pod(OLD_URI), pod(NEW_URI, waiting, container, "no such object: models/3")])])
    with pytest.raises(rollout.RolloutError) as error:
        roll(cluster)
    assert str(error.value) == (f"pod fmnist-predictor-3-abc: container {container}: {waiting}: "
                                "no such object: models/3")


def test_a_failing_pod_of_the_old_version_is_not_this_rollouts_failure():
    cluster = FakeCluster([(deployment(NEW_URI), [pod(OLD_URI, "CrashLoopBackOff", "kserve-container"),
                                                  pod(NEW_URI)])])
    assert roll(cluster)[0] == "2 of 2 replicas serve it"


def test_a_deployment_past_its_progress_deadline_fails():
    stuck = deployment(NEW_URI, updated=1, total=3, conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": 'ReplicaSet "fmnist-predictor-7d9" has timed out progressing.'}])
    with pytest.raises(rollout.RolloutError, match='has timed out progressing'):
        roll(FakeCluster([(stuck, [pod(NEW_URI)])]))


def test_a_version_whose_uri_is_a_prefix_of_another_is_not_mistaken_for_it():
    assert not rollout.names_uri(deployment("gs://bucket/releases/fmnist/30")["spec"]["template"], NEW_URI)
    assert rollout.names_uri(deployment(NEW_URI)["spec"]["template"], NEW_URI)


def test_the_timeout_bounds_the_wait_and_names_the_last_state():
    cluster = FakeCluster([(deployment(NEW_URI, available=0), [pod(NEW_URI)])])
    with pytest.raises(rollout.RolloutError) as error:
        roll(cluster, timeout=30)
    assert str(error.value) == "not rolled out after 30 s: 0 of 2 new replicas are available"


def test_the_kubernetes_calls_are_the_ones_the_workflow_role_grants():
    """KubernetesCluster makes exactly the API calls infra's Role for the workflow's pods allows."""
    from kubernetes import client

    from infra.pipeline import WORKFLOW_POD_RULES

    granted = {(group, resource, verb) for rule in WORKFLOW_POD_RULES for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    made = set()
    calls = {
        "get_namespaced_custom_object": ("serving.kserve.io", "inferenceservices", "get"),
        "create_namespaced_custom_object": ("serving.kserve.io", "inferenceservices", "create"),
        "replace_namespaced_custom_object": ("serving.kserve.io", "inferenceservices", "update"),
        "read_namespaced_deployment": ("apps", "deployments", "get"),
        "list_namespaced_pod": ("", "pods", "list"),
    }

    def recording(name):
        def call(*args, **kwargs):
            made.add(calls[name])
            return client.V1PodList(items=[]) if name == "list_namespaced_pod" else {}
        return call

    apis = {api: mock.Mock(**{name: recording(name) for name in calls})
            for api in ("CustomObjectsApi", "AppsV1Api", "CoreV1Api")}
    with mock.patch("kubernetes.config.load_incluster_config"), \
            mock.patch.multiple("kubernetes.client", **{name: lambda *a, api=api: api
                                                        for name, api in apis.items()}):
        cluster = rollout.KubernetesCluster()
        cluster.get_inference_service(NAMESPACE, "fmnist")
        cluster.create_inference_service(NAMESPACE, manifest())
        cluster.replace_inference_service(NAMESPACE, "fmnist", manifest())
        cluster.get_deployment(NAMESPACE, "fmnist-predictor")
        cluster.list_pods(NAMESPACE, "x=y")
    assert made == set(calls.values()) == set(rollout.API_CALLS)
    assert made <= granted


def test_the_serve_steps_manifest_is_one_the_cli_accepts():
    template = argo.workflow_template(parse_config({}))
    (serve,) = [t for t in template["spec"]["templates"] if t["name"] == "serve"]
    args = serve["container"]["args"]
    parsed = rollout.parse_args(args)
    assert parsed.manifest == argo.rollout_manifest(serve) and parsed.namespace == "{{workflow.namespace}}"


@pytest.mark.parametrize(("args", "message"), [
    (["--namespace", "ns", "--manifest", "{not json"],
     "argument --manifest: not an InferenceService manifest"),
    (["--namespace", "ns", "--manifest", json.dumps({"metadata": {"name": "x"}, "spec": {}})],
     "argument --manifest: not an InferenceService manifest with a storage URI (KeyError"),
    (["--namespace", "ns", "--manifest", json.dumps(manifest()), "--timeout-seconds", "0"],
     "argument --timeout-seconds: must be a positive number"),
])
def test_bad_arguments_are_one_line(args, message):
    result = run_module("serving.rollout", *args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"serving.rollout: error: {message}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_rollout_module_needs_no_tensorflow():
    """It runs in the serve step's pod; importing it must not pull in the training stack."""
    probe = [sys.executable, "-c", "import sys, serving.rollout; print('tensorflow' in sys.modules)"]
    result = subprocess.run(probe, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
