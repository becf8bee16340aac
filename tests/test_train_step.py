"""The train step on a cluster (cluster_steps.train) against a fake API server whose TFJob status
moves as the training operator (kubeflow/trainer v1.9.4) moves it: a job failed by its backoff limit
gets a Failed condition and no failed replica count, which the resource template it replaces never
saw; a pod that cannot pull its image never fails the job; a retried step finds its earlier job."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from conftest import REPO_ROOT, run_module
from stack_checks import embedded

from cluster_steps import kubernetes
from cluster_steps import names as cluster_names
from cluster_steps import train as tfjob_step
from cluster_steps.kubernetes import Timing
from pipeline import argo
from pipeline.config import parse_config

NAMESPACE = "dist-ml"
NAME = "run-1-train-cnn"
BACKOFF_FAILED = {"type": "Failed", "status": "True", "reason": "TFJobFailed",
                  "message": f"Job {NAME} has failed because it has reached the specified backoff limit"}
SUCCEEDED = {"type": "Succeeded", "status": "True", "reason": "TFJobSucceeded",
             "message": f"TFJob {NAMESPACE}/{NAME} successfully completed."}
RUNNING = {"type": "Running", "status": "True", "reason": "TFJobRunning"}


def job(*conditions: dict, replicas: dict | None = None) -> dict:
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": NAME},
            "status": {"conditions": list(conditions), "replicaStatuses": replicas or {}}}


def manifest() -> dict:
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": NAME}, "spec": {}}


def pulling_pod(reason: str = "ImagePullBackOff") -> dict:
    return {"metadata": {"name": f"{NAME}-worker-0"}, "status": {"phase": "Pending", "containerStatuses": [
        {"name": "tensorflow", "state": {"waiting": {"reason": reason, "message": "pull access denied"}}}]}}


class FakeCluster:
    """A TFJob's life: `existing` is the job an earlier attempt left (shown as it is); after the
    step creates the job, each look (GET) shows the next of `states`, the last one staying.
    A deletion finishes at the next look."""

    def __init__(self, states: list[dict], existing: dict | None = None, pods: list[dict] | None = None):
        self.states, self.current, self.pods = list(states), existing, pods or []
        self.calls: list[str] = []
        self.created = self.deleting = False

    def get_tfjob(self, namespace, name):
        self.calls.append("get")
        if self.deleting:
            self.deleting, self.current = False, None
        elif self.created and self.states:
            self.current = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return self.current

    def create_tfjob(self, namespace, manifest):
        assert self.current is None, "AlreadyExists (409)"
        self.calls.append("create")
        self.current, self.created = manifest, True

    def delete_tfjob(self, namespace, name):
        self.calls.append("delete")
        self.deleting = True

    def list_pods(self, namespace, label_selector):
        assert label_selector == f"{tfjob_step.JOB_NAME_LABEL}={NAME}"
        return self.pods


def run(cluster: FakeCluster, timeout: float = 600) -> tuple[str, list[str]]:
    now, said = [0.0], []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    timing = Timing(5, lambda: now[0], sleep)
    done = tfjob_step.run(cluster, NAMESPACE, manifest(), timeout, timing, said.append)
    return done, said


def test_a_job_that_succeeds_ends_the_step():
    cluster = FakeCluster([job(RUNNING), job(RUNNING), job(SUCCEEDED)])
    done, said = run(cluster)
    assert done.startswith(f"TFJob {NAMESPACE}/{NAME} succeeded") and cluster.calls[0] == "get"
    assert cluster.calls.count("create") == 1 and "delete" not in cluster.calls


def test_a_job_failed_by_its_backoff_limit_fails_the_step_with_the_operators_reason():
    """No replica counts a failure (pods restart in place): the old failureCondition never matched."""
    cluster = FakeCluster([job(RUNNING, replicas={"Worker": {"active": 2}}),
                           job(BACKOFF_FAILED, replicas={"Worker": {"active": 2}})])
    with pytest.raises(tfjob_step.TrainingFailed, match="failed: TFJobFailed: .*specified backoff limit"):
        run(cluster)
    assert "delete" not in cluster.calls  # a failed job stays for its pods' logs


def test_a_pod_that_cannot_pull_its_image_fails_the_step_at_once_and_deletes_the_job():
    cluster = FakeCluster([job(RUNNING)], pods=[pulling_pod()])
    with pytest.raises(tfjob_step.TrainingFailed, match="ImagePullBackOff: pull access denied"):
        run(cluster)
    assert cluster.calls[-1] == "delete"


def test_a_job_that_never_ends_fails_at_the_timeout_and_is_deleted():
    cluster = FakeCluster([job(RUNNING, replicas={"Worker": {"active": 1}})])
    with pytest.raises(tfjob_step.TrainingFailed, match=r"not finished after 60 s \(Worker: 1 active\)"):
        run(cluster, timeout=60)
    assert cluster.calls[-1] == "delete"


def test_a_job_deleted_while_watched_fails_the_step():
    cluster = FakeCluster([job(RUNNING)])
    cluster.create_tfjob = lambda namespace, manifest: setattr(cluster, "current", None)
    with pytest.raises(tfjob_step.TrainingFailed, match="was deleted while the step watched it"):
        run(cluster)


def test_a_retry_recreates_the_job_its_earlier_attempt_lost_and_training_resumes():
    """A preempted node took a worker; the operator failed the job; Argo retries the step."""
    failed = job(BACKOFF_FAILED)
    cluster = FakeCluster([job(RUNNING), job(SUCCEEDED)], existing=failed)
    done, said = run(cluster)
    assert "succeeded" in done
    assert cluster.calls[:4] == ["get", "delete", "get", "create"]  # gone before it is created again
    assert any("creating it again: training resumes from its last backup" in line for line in said)


def test_a_retry_watches_a_job_that_still_runs_and_accepts_one_that_succeeded():
    running = FakeCluster([job(RUNNING), job(SUCCEEDED)], existing=job(RUNNING))
    running.created = True  # the earlier attempt's job goes on to succeed
    assert "succeeded" in run(running)[0] and "create" not in running.calls
    succeeded = FakeCluster([], existing=job(SUCCEEDED))
    assert "succeeded" in run(succeeded)[0] and succeeded.calls == ["get"]


def test_the_argo_step_creates_the_rendered_tfjob_and_is_retried():
    config = parse_config({"pipeline": {"variants": ["cnn"], "retries": 3, "trainTimeout": "2h"}})
    template = argo.workflow_template(config)
    (train,) = [t for t in template["spec"]["templates"] if t["name"] == "train-cnn"]
    args = train["container"]["args"]
    assert args[args.index("--timeout-seconds") + 1] == "7200"
    assert train["retryStrategy"]["limit"] == "3"
    tfjob = embedded(template, "train-cnn")
    assert tfjob_step.tfjob_arg(json.dumps(tfjob))["kind"] == "TFJob"


def test_a_bad_manifest_is_refused_in_one_line():
    result = run_module("cluster_steps.train", "--namespace", "x", "--manifest", '{"kind": "Pod"}')
    assert result.returncode == 2 and "not a TFJob manifest (ValueError: kind 'Pod')" in result.stderr
    assert "Traceback" not in result.stderr and REPO_ROOT.is_dir()


def test_the_kubernetes_calls_are_the_ones_the_workflow_role_grants_and_a_gone_job_is_deleted():
    from kubernetes import client

    from infra.pipeline import WORKFLOW_POD_RULES

    granted = {(group, resource, verb) for rule in WORKFLOW_POD_RULES for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    verbs = {"get_namespaced_custom_object": "get", "create_namespaced_custom_object": "create",
             "delete_namespaced_custom_object": "delete"}
    made = set()

    def recording(method):
        def call(group, version, namespace, plural, *rest, **options):
            assert (group, version, plural) == ("kubeflow.org", "v1", "tfjobs")
            made.add((group, plural, verbs[method]))
            if method == "delete_namespaced_custom_object":
                assert options == {"propagation_policy": "Foreground"}  # its pods go before it does
                raise client.ApiException(status=404, reason="Not Found")
            return {}
        return call

    objects = mock.Mock(**{method: recording(method) for method in verbs})
    core = mock.Mock(**{"list_namespaced_pod.side_effect":
                        lambda *a, **k: made.add(("", "pods", "list")) or client.V1PodList(items=[])})
    with mock.patch("kubernetes.config.load_incluster_config"), \
            mock.patch("kubernetes.client.CustomObjectsApi", lambda *a: objects), \
            mock.patch("kubernetes.client.CoreV1Api", lambda *a: core):
        cluster = kubernetes.TrainApi()
        cluster.get_tfjob(NAMESPACE, NAME)
        cluster.create_tfjob(NAMESPACE, manifest())
        cluster.delete_tfjob(NAMESPACE, NAME)  # already gone: no error
        assert cluster.list_pods(NAMESPACE, "x=y") == []
    assert made == set(cluster_names.TFJOB_STEP_CALLS) and made <= granted
