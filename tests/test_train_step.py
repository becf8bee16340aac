"""The train step on a cluster (cluster_steps.train) against fake API servers that answer as the engines
do: a TrainJob as Kubeflow Trainer v2.3.0 and JobSet v0.12.0 move it (held suspended by Kueue v0.19.2
until its queue admits it, then Complete or Failed with JobSet's reason), and a TFJob as the training
operator v1.9.4 moves it (a job failed by its backoff limit gets a Failed condition and no failed
replica count, which the resource template it replaced never saw). Either way a pod that cannot pull
its image fails the step at once, a retried step finds its earlier job, and the timeout deletes it."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from conftest import REPO_ROOT, run_module
from stack_checks import embedded

from cluster_steps import kubernetes
from cluster_steps import train as train_step
from cluster_steps.kubernetes import Timing
from common import cluster_names
from engines import ENGINES
from engines.tfjob import TFJOB, TFJOB_NAME_LABEL
from engines.trainjob import JOBSET_NAME_LABEL, TRAINING_QUEUE, TRAINJOB, WORKLOAD
from pipeline import argo
from pipeline.config import parse_config

NAMESPACE = "dist-ml"
NAME = "run-1-train-cnn"
UID = "3f0c2f5e-1111-4a2b-9c3d-5e6f7a8b9c0d"
# Trainer v2.3.0 copies the JobSet's Completed and Failed conditions, type renamed, reason and message
# kept (pkg/runtime/framework/plugins/jobset/jobset.go); it sets Suspended itself.
COMPLETE = {"type": "Complete", "status": "True", "reason": "AllJobsCompleted",
            "message": "jobset completed successfully"}
SUSPENDED = {"type": "Suspended", "status": "True", "reason": "Suspended", "message": "TrainJob is suspended"}
RESUMED = {"type": "Suspended", "status": "False", "reason": "Resumed", "message": "TrainJob is resumed"}
TRAINJOB_FAILURES = {  # JobSet's reasons (jobset v0.12.0 pkg/constants), and Trainer's own deadline
    "FailedJobs": "jobset failed due to one or more job failures (first failed job: run-1-train-cnn-node-0)",
    "ReachedMaxRestarts": "jobset failed due to reaching max number of restarts",
    # As JobSet says it (seen by the control-plane tier, tests/cluster/test_train.py).
    "FailJobSetFailurePolicyAction": "applying FailJobSet failure policy action (first failed job: "
                                     "run-1-train-cnn-node-0)",
    "DeadlineExceeded": "trainJob exceeded its activeDeadlineSeconds",
}
# The training operator v1.9.4's.
BACKOFF_FAILED = {"type": "Failed", "status": "True", "reason": "TFJobFailed",
                  "message": f"Job {NAME} has failed because it has reached the specified backoff limit"}
SUCCEEDED = {"type": "Succeeded", "status": "True", "reason": "TFJobSucceeded",
             "message": f"TFJob {NAMESPACE}/{NAME} successfully completed."}
RUNNING = {"type": "Running", "status": "True", "reason": "TFJobRunning"}


def failed(reason: str) -> dict:
    return {"type": "Failed", "status": "True", "reason": reason, "message": TRAINJOB_FAILURES[reason]}


def trainjob(*conditions: dict, suspend: bool = False, jobs: list[dict] | None = None) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": NAME, "uid": UID}, "spec": {"suspend": suspend, "trainer": {"numNodes": 2}},
            "status": {"conditions": list(conditions), "jobsStatus": jobs or []}}


def running(active: int = 1) -> dict:
    return trainjob(RESUMED, jobs=[{"name": "node", "active": active, "ready": active}])


def queued() -> dict:
    """What Kueue's webhook makes of a created TrainJob: suspended until admitted."""
    return trainjob(SUSPENDED, suspend=True, jobs=[{"name": "node", "suspended": 1}])


def workload(*conditions: dict, active: bool = True) -> dict:
    return {"metadata": {"name": f"trainjob-{NAME}-8a1f3", "labels": {"kueue.x-k8s.io/job-uid": UID}},
            "spec": {"queueName": TRAINING_QUEUE, "active": active},
            "status": {"conditions": list(conditions)}}


NO_QUOTA = {"type": "QuotaReserved", "status": "False", "reason": "Pending",
            "message": "couldn't assign flavors to pod set node: insufficient unused quota for cpu in "
                       "flavor dist-ml-k3d, 1 more needed"}


def tfjob(*conditions: dict, replicas: dict | None = None) -> dict:
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": NAME},
            "status": {"conditions": list(conditions), "replicaStatuses": replicas or {}}}


MANIFESTS = {
    "TrainJob": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                 "metadata": {"name": NAME}, "spec": {"trainer": {"numNodes": 2}}},
    "TFJob": {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": NAME}, "spec": {}},
}
POD_LABELS = {"TrainJob": JOBSET_NAME_LABEL, "TFJob": TFJOB_NAME_LABEL}


def pulling_pod(reason: str = "ImagePullBackOff") -> dict:
    container = {"name": "node", "state": {"waiting": {"reason": reason, "message": "pull access denied"}}}
    return {"metadata": {"name": f"{NAME}-node-0-0-x7k2p"},
            "status": {"phase": "Pending", "containerStatuses": [container]}}


def restarted_pod(attempt: int) -> dict:
    return {"metadata": {"name": f"{NAME}-node-0-1-q8d2m", "labels": {"jobset.sigs.k8s.io/restart-attempt":
                                                                        str(attempt)}},
            "status": {"phase": "Running"}}


class FakeCluster:
    """A job's life: `existing` is the job an earlier attempt left (shown as it is); after the step
    creates the job, each look (GET) shows the next of `states`, the last one staying, and the
    Workload list the next of `workloads`. A deletion finishes at the next look."""

    def __init__(self, kind: str, states: list[dict], existing: dict | None = None,
                 pods: list[dict] | None = None, workloads: list[list[dict]] | None = None,
                 warnings: list[dict] | None = None):
        self.kind, self.resource = kind, {"TrainJob": TRAINJOB, "TFJob": TFJOB}[kind]
        self.states, self.current, self.pods = list(states), existing, pods or []
        self.workloads = list(workloads or [])
        self.warnings = warnings or []
        self.calls: list[str] = []
        self.created = self.deleting = False

    def get_job(self, resource, namespace, name):
        assert (resource, namespace, name) == (self.resource, NAMESPACE, NAME)
        self.calls.append("get")
        if self.deleting:
            self.deleting, self.current = False, None
        elif self.created and self.states:
            self.current = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return self.current

    def create_job(self, resource, namespace, manifest):
        assert self.current is None, "AlreadyExists (409)"
        assert resource == self.resource
        self.calls.append("create")
        self.current, self.created = manifest, True

    def delete_job(self, resource, namespace, name):
        assert resource == self.resource
        self.calls.append("delete")
        self.deleting = True

    def list_pods(self, namespace, label_selector):
        assert label_selector == f"{POD_LABELS[self.kind]}={NAME}"
        return self.pods

    def list_objects(self, resource, namespace, label_selector):
        assert self.kind == "TrainJob" and resource == WORKLOAD
        assert label_selector == f"kueue.x-k8s.io/job-uid={UID}"
        self.calls.append("workloads")
        return self.workloads.pop(0) if len(self.workloads) > 1 else (self.workloads or [[]])[0]

    def list_warnings(self, namespace):
        assert self.kind == "TrainJob"
        self.calls.append("events")
        return self.warnings


def run(cluster: FakeCluster, timeout: float = 600, manifest: dict | None = None) -> tuple[str, list[str]]:
    now, said = [0.0], []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    timing = Timing(5, lambda: now[0], sleep)
    manifest = manifest or MANIFESTS[cluster.kind]
    done = train_step.run(cluster, NAMESPACE, manifest, timeout, timing, said.append)
    return done, said


# --- TrainJob: Trainer v2, JobSet and Kueue ---------------------------------------------------------

def test_a_trainjob_kueue_holds_is_waiting_then_admitted_runs_and_completes():
    states = [queued(), queued(), running(), running(2), trainjob(RESUMED, COMPLETE)]
    cluster = FakeCluster("TrainJob", states, workloads=[[workload(NO_QUOTA)], [workload(NO_QUOTA)]])
    done, said = run(cluster)
    assert done == f"TrainJob {NAMESPACE}/{NAME} succeeded (AllJobsCompleted: jobset completed successfully)"
    assert said[0] == f"created TrainJob {NAMESPACE}/{NAME}"
    assert said[1] == (f"{NAME}: queued by Kueue in {TRAINING_QUEUE}: Pending: couldn't assign "
                       "flavors to pod set node: insufficient unused quota for cpu in flavor dist-ml-k3d, "
                       "1 more needed")  # said once while it stays so
    assert said[2:] == [f"{NAME}: node: 1 active, 1 ready", f"{NAME}: node: 2 active, 2 ready"]
    assert cluster.calls.count("create") == 1 and "delete" not in cluster.calls


def test_a_trainjob_queued_past_the_timeout_is_deleted_and_the_error_says_it_waited_in_the_queue():
    cluster = FakeCluster("TrainJob", [queued()], workloads=[[workload(NO_QUOTA)]])
    with pytest.raises(train_step.TrainingFailed, match=r"not finished after 60 s \(queued by Kueue in "
                                                         r"dist-ml-training: Pending: couldn't assign"):
        run(cluster, timeout=60)
    assert cluster.calls[-1] == "delete"


def test_a_suspended_trainjob_before_kueue_made_its_workload_is_waiting_too():
    cluster = FakeCluster("TrainJob", [queued(), running(), trainjob(COMPLETE)], workloads=[[]])
    done, said = run(cluster)
    assert "succeeded" in done
    assert said[1] == f"{NAME}: suspended, waiting for Kueue to admit it (no Workload yet)"


def test_a_trainjob_whose_workload_kueue_deactivated_fails_the_step_and_is_deleted():
    """After waitForPodsReady's requeues run out Kueue deactivates the Workload: the job stays
    suspended for ever (kueue v0.19.2 never marks it Failed)."""
    gave_up = workload({"type": "Evicted", "status": "True",
                        "reason": "DeactivatedDueToRequeuingLimitExceeded",
                        "message": "The workload is deactivated due to exceeding the maximum number of "
                                   "re-queuing retries"}, active=False)
    cluster = FakeCluster("TrainJob", [queued()], workloads=[[gave_up]])
    with pytest.raises(train_step.TrainingFailed, match="Kueue deactivated Workload trainjob-run-1-train-cnn-"
                                                         "8a1f3: DeactivatedDueToRequeuingLimitExceeded"):
        run(cluster)
    assert cluster.calls[-1] == "delete"


def warning(reason: str, kind: str, name: str, message: str, uid: str | None = None,
            at: str = "2026-11-27T10:00:05Z") -> dict:
    involved = {"kind": kind, "name": name, "namespace": NAMESPACE, **({"uid": uid} if uid else {})}
    return {"type": "Warning", "reason": reason, "involvedObject": involved, "message": message,
            "lastTimestamp": at}


CREATED_AT = "2026-11-27T10:00:00Z"
# Trainer v2.3.0 when JobSet's webhook refuses the JobSet it builds (as the control-plane tier saw it).
JOBSET_REFUSED = warning(
    "TrainJobResourcesCreationFailed", "TrainJob", NAME,
    'TrainJob resources reconciliation failed: admission webhook "vjobset.kb.io" denied the request: '
    f'JobSet.jobset.x-k8s.io "{NAME}" is invalid: <nil>: Internal error: invalid failure policy rule name '
    "'usage-error', a failure policy rule name must start with an alphabetic character, optionally "
    "followed by a string of alphanumeric characters or '_,:', and must end with an alphanumeric "
    "character or '_'", uid=UID)


def created(job: dict) -> dict:
    job["metadata"]["creationTimestamp"] = CREATED_AT
    return job


@pytest.mark.parametrize("refusal", [
    JOBSET_REFUSED,
    # controller-runtime's recorder writes events.k8s.io events: a microsecond eventTime, here in the
    # second the TrainJob was created (a text comparison would put it before)
    {**JOBSET_REFUSED, "lastTimestamp": None, "eventTime": "2026-11-27T10:00:00.081233Z"},
    warning("JobCreationFailed", "JobSet", NAME, f'jobs.batch "{NAME}-node-0" is invalid: spec.template: x'),
    warning("FailedCreate", "Job", f"{NAME}-node-0",
            f'Error creating: pods "{NAME}-node-0-0-x7k2p" is forbidden: error looking up service account '
            'dist-ml/dist-ml-trainer: serviceaccount "dist-ml-trainer" not found'),
])
def test_a_controller_that_cannot_create_the_trainjobs_objects_fails_the_step_at_once_in_its_words(refusal):
    """Trainer records only an event when it cannot create the JobSet: no condition would ever end the
    wait. The step fails at its next look, quoting the controller, and deletes the job."""
    cluster = FakeCluster("TrainJob", [created(running(0))], warnings=[refusal])
    with pytest.raises(train_step.TrainingFailed) as failure:
        run(cluster)
    involved = refusal["involvedObject"]
    assert str(failure.value) == (f"TrainJob {NAMESPACE}/{NAME} cannot start: {refusal['reason']} on "
                                  f"{involved['kind']} {involved['name']}: {refusal['message']}")
    assert cluster.calls.count("get") <= 3 and cluster.calls[-1] == "delete"


@pytest.mark.parametrize("transient", [
    warning("TrainJobResourcesCreationFailed", "TrainJob", NAME, "TrainJob resources reconciliation failed: "
            'Operation cannot be fulfilled on jobsets.jobset.x-k8s.io "x": the object has been modified',
            uid=UID),
    warning("FailedCreate", "Job", f"{NAME}-node-0",
            'Error creating: pods "p" is forbidden: exceeded quota: compute, requested: cpu=1'),
    {**JOBSET_REFUSED, "involvedObject": {**JOBSET_REFUSED["involvedObject"], "uid": "an-earlier-one"}},
    warning("JobCreationFailed", "JobSet", "run-1-train-cnn2", "jobs.batch is invalid"),  # another job's
    warning("TrainJobResourcesCreationFailed", "TrainJob", NAME, JOBSET_REFUSED["message"], uid=UID,
            at="2026-11-27T09:59:59.999999Z"),  # before this TrainJob was created
])
def test_a_conflict_a_quota_or_another_jobs_warning_is_not_a_refusal_of_this_one(transient):
    cluster = FakeCluster("TrainJob", [created(running()), created(trainjob(RESUMED, COMPLETE))],
                          warnings=[transient])
    done, _ = run(cluster)
    assert "succeeded" in done


@pytest.mark.parametrize("reserved", [
    {"type": "QuotaReserved", "status": "False", "reason": "Inadmissible",
     "message": "LocalQueue dist-ml-training doesn't exist"},
    {"type": "QuotaReserved", "status": "False", "reason": "Pending",
     "message": "couldn't assign flavors to pod set node: insufficient quota for cpu in flavor "
                "dist-ml-k3d, previously considered podsets requests (0) + current podset request (3) > "
                "maximum capacity (2)"},
    # What the tier's gke placement test sees when a flavor's node labels and the runtime's node
    # selector disagree (tests/cluster/test_gke_placement.py).
    {"type": "QuotaReserved", "status": "False", "reason": "Pending",
     "message": "couldn't assign flavors to pod set node: flavor dist-ml-spot doesn't match node affinity"},
])
def test_a_workload_kueue_can_never_admit_fails_the_step_with_kueues_reason(reserved):
    cluster = FakeCluster("TrainJob", [queued()], workloads=[[workload(reserved)]])
    with pytest.raises(train_step.TrainingNeverSucceeds, match=f"Kueue will never admit Workload .*: "
                                                         f"{reserved['reason']}: "):
        run(cluster)
    assert cluster.calls[-1] == "delete"


@pytest.mark.parametrize("reason", sorted(TRAINJOB_FAILURES))
def test_a_failed_trainjob_fails_the_step_with_jobsets_reason_and_is_kept_for_its_logs(reason):
    cluster = FakeCluster("TrainJob", [running(), trainjob(RESUMED, failed(reason))])
    with pytest.raises(train_step.TrainingFailed) as error:
        run(cluster)
    assert str(error.value) == f"TrainJob {NAMESPACE}/{NAME} failed: {reason}: {TRAINJOB_FAILURES[reason]}"
    assert "delete" not in cluster.calls


def test_jobsets_restarts_after_a_lost_pod_show_in_the_steps_log():
    cluster = FakeCluster("TrainJob", [running(2), running(2), trainjob(COMPLETE)], pods=[restarted_pod(1)])
    _, said = run(cluster)
    assert said[1] == f"{NAME}: node: 2 active, 2 ready (restarted 1 time(s) after a lost pod)"


def test_a_trainjob_name_jobsets_webhook_would_refuse_is_refused_before_it_is_created():
    """Trainer v2.3.0 leaves such a TrainJob without any condition (an event only): it would hang."""
    long_name = "a-workflow-name-someone-chose-by-hand-1234-train-cnn"  # 52 > 63 - len("-node-0-1-abcde")
    manifest = {**MANIFESTS["TrainJob"], "metadata": {"name": long_name}}
    cluster = FakeCluster("TrainJob", [])
    cluster.get_job = lambda resource, namespace, name: cluster.calls.append("get")  # none there yet
    with pytest.raises(train_step.TrainingFailed, match=f"TrainJob name '{long_name}' has 52 characters, and "
                                                        "its pods' names allow 48: submit the workflow with"):
        run(cluster, manifest=manifest)
    assert cluster.calls == ["get"]


# --- Either engine ---------------------------------------------------------------------------------

ENDS = {"TrainJob": (running(), trainjob(COMPLETE), trainjob(failed("FailedJobs"))),
        "TFJob": (tfjob(RUNNING), tfjob(SUCCEEDED), tfjob(BACKOFF_FAILED))}


@pytest.fixture(params=sorted(ENDS))
def kind(request) -> str:
    return request.param


def test_a_job_that_succeeds_ends_the_step(kind):
    going, done, _ = ENDS[kind]
    cluster = FakeCluster(kind, [going, going, done])
    result, _ = run(cluster)
    assert result.startswith(f"{kind} {NAMESPACE}/{NAME} succeeded") and cluster.calls[0] == "get"
    assert cluster.calls.count("create") == 1 and "delete" not in cluster.calls


def test_a_tfjob_failed_by_its_backoff_limit_fails_the_step_with_the_operators_reason():
    """No replica counts a failure (pods restart in place): the old failureCondition never matched."""
    cluster = FakeCluster("TFJob", [tfjob(RUNNING, replicas={"Worker": {"active": 2}}),
                                    tfjob(BACKOFF_FAILED, replicas={"Worker": {"active": 2}})])
    with pytest.raises(train_step.TrainingFailed, match="failed: TFJobFailed: .*specified backoff limit"):
        run(cluster)
    assert "delete" not in cluster.calls  # a failed job stays for its pods' logs


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff"])
def test_a_pod_that_cannot_start_fails_the_step_at_once_and_deletes_the_job(kind, reason):
    cluster = FakeCluster(kind, [ENDS[kind][0]], pods=[pulling_pod(reason)])
    with pytest.raises(train_step.TrainingFailed, match=f"container node: {reason}: pull access denied"):
        run(cluster)
    assert cluster.calls[-1] == "delete"


def test_a_job_that_never_ends_fails_at_the_timeout_and_is_deleted(kind):
    progress = {"TrainJob": "node: 1 active, 1 ready", "TFJob": "Worker: 1 active"}[kind]
    going = running() if kind == "TrainJob" else tfjob(RUNNING, replicas={"Worker": {"active": 1}})
    cluster = FakeCluster(kind, [going])
    with pytest.raises(train_step.TrainingFailed, match=rf"not finished after 60 s \({progress}\)"):
        run(cluster, timeout=60)
    assert cluster.calls[-1] == "delete"


def test_a_job_deleted_while_watched_fails_the_step(kind):
    cluster = FakeCluster(kind, [ENDS[kind][0]])
    cluster.create_job = lambda resource, namespace, manifest: setattr(cluster, "current", None)
    with pytest.raises(train_step.TrainingFailed, match="was deleted while the step watched it"):
        run(cluster)


def test_a_retry_recreates_the_job_its_earlier_attempt_lost_and_training_resumes(kind):
    """A preempted node took pods beyond what the engine's own restarts absorb; the job failed; Argo
    retries the step."""
    going, done, lost = ENDS[kind]
    cluster = FakeCluster(kind, [going, done], existing=lost)
    result, said = run(cluster)
    assert "succeeded" in result
    assert cluster.calls[:4] == ["get", "delete", "get", "create"]  # gone before it is created again
    assert any("creating it again: training resumes from its last backup" in line for line in said)


def test_a_retry_watches_a_job_that_still_runs_and_accepts_one_that_succeeded(kind):
    going, done, _ = ENDS[kind]
    still_running = FakeCluster(kind, [going, done], existing=going)
    still_running.created = True  # the earlier attempt's job goes on to succeed
    assert "succeeded" in run(still_running)[0] and "create" not in still_running.calls
    succeeded = FakeCluster(kind, [], existing=done)
    assert "succeeded" in run(succeeded)[0] and succeeded.calls == ["get"]


@pytest.mark.parametrize("engine, kind", [("trainjob", "TrainJob"), ("tfjob", "TFJob")])
def test_the_argo_step_creates_the_rendered_job_of_its_engine_and_is_retried(engine, kind):
    config = parse_config({"pipeline": {"variants": ["cnn"], "retries": 3, "trainTimeout": "2h",
                                        "engine": engine}})
    template = argo.workflow_template(config)
    (train,) = [t for t in template["spec"]["templates"] if t["name"] == "train-cnn"]
    args = train["container"]["args"]
    assert args[args.index("--timeout-seconds") + 1] == "7200"
    assert train["retryStrategy"]["limit"] == "3"
    job = embedded(template, "train-cnn")
    assert train_step.job_arg(json.dumps(job))["kind"] == kind


def test_a_bad_manifest_is_refused_in_one_line():
    result = run_module("cluster_steps.train", "--namespace", "x", "--manifest", '{"kind": "Pod"}')
    assert result.returncode == 2
    assert "not a TrainJob or TFJob manifest (kind 'Pod')" in result.stderr
    assert "Traceback" not in result.stderr and REPO_ROOT.is_dir()


@pytest.mark.parametrize("engine, resource", [("trainjob", TRAINJOB), ("tfjob", TFJOB)])
def test_the_kubernetes_calls_are_the_ones_the_workflow_role_grants_and_a_gone_job_is_deleted(
        engine, resource):
    """TrainApi makes exactly the calls of ENGINES[engine].step_calls, and infra's Role for the workflow's
    pods grants exactly those (with the release steps' calls), no more."""
    from kubernetes import client

    from infra.pipeline import EXECUTOR_RULE, workflow_pod_rules

    granted = {(group, res, verb) for rule in workflow_pod_rules(ENGINES[engine]) if rule != EXECUTOR_RULE
               for group in rule["apiGroups"] for res in rule["resources"] for verb in rule["verbs"]}
    verbs = {"get_namespaced_custom_object": "get", "create_namespaced_custom_object": "create",
             "delete_namespaced_custom_object": "delete", "list_namespaced_custom_object": "list"}
    made = set()

    def recording(method):
        def call(group, version, namespace, plural, *rest, **options):
            made.add((group, plural, verbs[method]))
            if method == "list_namespaced_custom_object":
                assert (group, version, plural) == ("kueue.x-k8s.io", "v1beta2", "workloads")
                return {"items": []}
            assert (group, version, plural) == (resource.group, resource.version, resource.plural)
            if method == "delete_namespaced_custom_object":
                assert options == {"propagation_policy": "Foreground"}  # its pods go before it does
                raise client.ApiException(status=404, reason="Not Found")
            return {}
        return call

    objects = mock.Mock(**{method: recording(method) for method in verbs})
    core = mock.Mock(**{"list_namespaced_pod.side_effect":
                        lambda *a, **k: made.add(("", "pods", "list")) or client.V1PodList(items=[]),
                        "list_namespaced_event.side_effect":
                        lambda *a, **k: made.add(("", "events", "list")) or client.CoreV1EventList(items=[])})
    with mock.patch("kubernetes.config.load_incluster_config"), \
            mock.patch("kubernetes.client.CustomObjectsApi", lambda *a: objects), \
            mock.patch("kubernetes.client.CoreV1Api", lambda *a: core):
        cluster = kubernetes.TrainApi()
        cluster.get_job(resource, NAMESPACE, NAME)
        cluster.create_job(resource, NAMESPACE, MANIFESTS[resource.kind])
        cluster.delete_job(resource, NAMESPACE, NAME)  # already gone: no error
        assert cluster.list_pods(NAMESPACE, "x=y") == []
        if engine == "trainjob":  # what it reads beside its job: Kueue's Workload, the refusals
            assert cluster.list_objects(WORKLOAD, NAMESPACE, "x=y") == []
            assert cluster.list_warnings(NAMESPACE) == []
    assert made == set(ENGINES[engine].step_calls)
    assert granted == made | set(cluster_names.API_CALLS)
