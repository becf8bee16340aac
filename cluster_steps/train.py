"""The training step on a cluster: create the variant's job, a TrainJob (Kubeflow Trainer v2) or a
TFJob (the training operator v1), and watch it to its end.

    python -m cluster_steps.train --namespace NS --manifest JSON --timeout-seconds 21600

Argo's resource template cannot do this: its conditions cannot select an entry of
`status.conditions` by type (argoproj/argo-workflows#2288, #7143), and the training operator
(kubeflow/trainer v1.9.4) marks a job Failed by its backoff limit without counting a failed replica,
so a crashing job held the workflow for ever. This step fails as soon as the job's Failed condition
appears, with the engine's reason (a TrainJob carries its JobSet's: FailedJobs, ReachedMaxRestarts,
FailJobSetFailurePolicyAction, or Trainer's DeadlineExceeded); at once when a pod waits on something
that will not come by itself (an image that cannot be pulled, a crash loop); and at --timeout-seconds
otherwise, deleting the job so that no pod is left running or pending. It succeeds when the job's
Complete (TrainJob) or Succeeded (TFJob) condition appears.

A TrainJob waits in Kueue's queue, suspended, until the queue's quota admits all of its pods at once:
that is waiting, not failing. The step says so with Kueue's reason (its Workload's QuotaReserved
message), and the timeout covers the wait. What says the job will never start by itself fails the step
within a poll, with the controller's own words (read in their code at the tags the stacks install):
- Kueue: a Workload it deactivated (it gave up requeueing the job), or one it finds inadmissible (its
  LocalQueue or ClusterQueue missing or inactive, its namespace not the queue's: reason Inadmissible),
  or whose pods need more than the queue could ever hold ("... > maximum capacity").
- A controller refused, on its warning event: Trainer cannot create the JobSet
  (TrainJobResourcesCreationFailed, with no condition on the TrainJob: a JobSet its webhook refuses),
  JobSet cannot create a Job or its headless Service (JobCreationFailed, HeadlessServiceCreationFailed),
  or Kubernetes' Job controller cannot create a pod (FailedCreate) — each when the API server or a
  webhook refused the object (denied, invalid, forbidden, not found), which it will be on every retry.
Judged transient, and left to the controllers' retries and the timeout: those events for any other
cause (a conflict, a timeout), Kueue's "insufficient unused quota" (waiting for others to finish), a
suspended TrainJob with no Workload yet, and Kueue's waitForPodsReady evictions (it requeues them).

Argo retries the step (retryStrategy): a retry finds the job it created, watches it if it still runs,
succeeds if it has succeeded, and creates it anew if it failed, so a run that lost its pods (beyond
what JobSet's or the operator's own restarts absorb) trains again from the variant's last backup
(BackupAndRestore).

The engines differ in what is read (Engine, one adapter each); the watch is the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
from typing import Any, Callable, Protocol, Sequence

from cluster_steps.kubernetes import (
    TFJOB,
    TRAINJOB,
    ClusterStepError,
    CustomResource,
    Timing,
    TrainApi,
    pod_failure,
)
from cluster_steps.names import (
    DNS_LABEL_LENGTH,
    JOBSET_NAME_LABEL,
    MANIFEST_FLAG,
    TFJOB_NAME_LABEL,
    WORKLOAD_JOB_UID_LABEL,
    trainjob_name_limit,
)
from common import cli
from trainer.cluster import NODE_JOB

DEFAULT_TIMEOUT_SECONDS = 6 * 3600.0
DELETION_TIMEOUT_SECONDS = 300.0  # a failed job and its pods gone (foreground), before the retry
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"  # JobSet's count of its restarts, on pods
# Warning events that say an object of a TrainJob's was not created, by reason, with the kind they are
# recorded on: Trainer v2.3.0's (pkg/controller/trainjob_controller.go), JobSet v0.12.0's
# (pkg/controllers/jobset_controller.go), Kubernetes' Job controller's (pkg/controller/job).
NOT_CREATED = {"TrainJobResourcesCreationFailed": "TrainJob", "JobCreationFailed": "JobSet",
               "HeadlessServiceCreationFailed": "JobSet", "FailedCreate": "Job"}
# The API server's or a webhook's refusal: the same object is refused on every retry (Trainer builds the
# JobSet from its snapshot of the runtime, taken once). A ResourceQuota's refusal passes once others end.
REFUSED = re.compile(r"denied the request|is invalid|not found|is forbidden(?!: exceeded quota)")
# Kueue v0.19.2's scheduler, when a pod set asks for more than the ClusterQueue could ever lend it
# (pkg/scheduler/flavorassigner): "... > maximum capacity (...)".
BEYOND_QUOTA = "> maximum capacity"
INADMISSIBLE = "Inadmissible"  # Kueue's QuotaReserved reason for a missing or inactive queue


class TrainingFailed(ClusterStepError):
    """The job failed, or cannot finish by itself; the message says why."""


class Cluster(Protocol):
    """The API calls the step makes (plain dicts, as the API server sends them)."""

    def get_job(self, resource: CustomResource, namespace: str, name: str) -> dict | None: ...
    def create_job(self, resource: CustomResource, namespace: str, manifest: dict) -> None: ...
    def delete_job(self, resource: CustomResource, namespace: str, name: str) -> None: ...
    def list_pods(self, namespace: str, label_selector: str) -> list[dict]: ...
    def list_workloads(self, namespace: str, label_selector: str) -> list[dict]: ...
    def list_warnings(self, namespace: str) -> list[dict]: ...


def condition(job: dict, kind: str, status: str = "True") -> dict | None:
    """The object's condition of type `kind` when its status is `status`."""
    for found in (job.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind and found.get("status") == status:
            return found
    return None


def described(found: dict) -> str:
    return f"{found.get('reason', '')}: {found.get('message', '')}".strip(": ")


# --- What differs between the engines --------------------------------------------------------------

def tfjob_progress(job: dict, pods: list[dict]) -> str:
    """Each replica type's counts, e.g. `Worker: 2 active`."""
    counts = []
    for kind, status in sorted(((job.get("status") or {}).get("replicaStatuses") or {}).items()):
        shown = [f"{status[key]} {key}" for key in ("active", "succeeded", "failed") if status.get(key)]
        counts.append(f"{kind}: {', '.join(shown) or 'none started'}")
    return "; ".join(counts) or "no replica started yet"


def trainjob_progress(job: dict, pods: list[dict]) -> str:
    """Each replicated job's Jobs (`node: 1 active`), and JobSet's restarts so far, read off its pods."""
    counts = []
    for status in (job.get("status") or {}).get("jobsStatus") or []:
        shown = [f"{status[key]} {key}" for key in ("active", "ready", "succeeded", "failed", "suspended")
                 if status.get(key)]
        counts.append(f"{status.get('name')}: {', '.join(shown) or 'no job yet'}")
    restarts = max((int(pod["metadata"].get("labels", {}).get(RESTART_ATTEMPT_LABEL, 0)) for pod in pods),
                   default=0)
    shown = "; ".join(counts) or "no job started yet"
    return f"{shown} (restarted {restarts} time(s) after a lost pod)" if restarts else shown


def tfjob_is_waiting(cluster: Cluster, namespace: str, job: dict) -> str | None:
    return None  # the training operator starts a TFJob's pods at once; Kueue does not hold TFJobs


def trainjob_is_waiting(cluster: Cluster, namespace: str, job: dict) -> str | None:
    """Why Kueue holds the TrainJob (suspended until its queue admits it), None when it does not.
    Raises TrainingFailed when Kueue gave up on it (its Workload deactivated)."""
    if not (job.get("spec") or {}).get("suspend"):
        return None
    uid = job["metadata"].get("uid")
    workloads = cluster.list_workloads(namespace, f"{WORKLOAD_JOB_UID_LABEL}={uid}") if uid else []
    if not workloads:
        return "suspended, waiting for Kueue to admit it (no Workload yet)"
    workload = workloads[0]
    if (workload.get("spec") or {}).get("active") is False:
        evicted = condition(workload, "Evicted") or {}
        raise TrainingFailed(f"Kueue deactivated Workload {workload['metadata']['name']}: "
                             f"{described(evicted) or 'spec.active is false'}")
    if reserved := condition(workload, "QuotaReserved", status="False"):
        if reserved.get("reason") == INADMISSIBLE or BEYOND_QUOTA in reserved.get("message", ""):
            raise TrainingFailed(f"Kueue will never admit Workload {workload['metadata']['name']} in "
                                 f"{workload['spec'].get('queueName')}: {described(reserved)}")
        return f"queued by Kueue in {workload['spec'].get('queueName')}: {described(reserved)}"
    return f"suspended, Kueue's Workload {workload['metadata']['name']} admitting it"


def trainjob_refusal(cluster: Cluster, namespace: str, job: dict) -> str | None:
    """The first controller's warning that an object of this TrainJob (the TrainJob, its JobSet, the
    JobSet's Jobs, all named after it) was refused, as `<reason> on <kind> <name>: <message>`."""
    name, uid = job["metadata"]["name"], job["metadata"].get("uid")
    since = timestamp(job["metadata"].get("creationTimestamp"))
    for event in cluster.list_warnings(namespace):
        involved, reason = event.get("involvedObject") or {}, event.get("reason")
        if NOT_CREATED.get(reason) != involved.get("kind") or not REFUSED.search(event.get("message") or ""):
            continue
        ours = (involved.get("uid") == uid if involved.get("kind") == "TrainJob"
                else involved.get("name") == name or involved.get("name", "").startswith(f"{name}-"))
        if ours and event_time(event) >= since:
            message = (event.get("message") or "").strip()
            return f"{reason} on {involved['kind']} {involved.get('name')}: {message}"
    return None


def event_time(event: dict) -> datetime.datetime:
    """When it last happened, from a core/v1 or an events.k8s.io event (controller-runtime's recorder
    writes the latter: eventTime, to the microsecond, or its series')."""
    return timestamp((event.get("series") or {}).get("lastObservedTime") or event.get("lastTimestamp")
                     or event.get("eventTime") or event.get("firstTimestamp"))


def timestamp(text: str | None) -> datetime.datetime:
    """An RFC 3339 time of the API's, to the second or finer (compared as times, not as text: an event
    at 10:00:05.1 is not before an object created at 10:00:05); the earliest time when there is none.
    An object's creationTimestamp has whole seconds, so an event of the same second counts as after it."""
    if not text:
        return datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    return datetime.datetime.fromisoformat(text).replace(microsecond=0)


def trainjob_name_limit_of(manifest: dict) -> int:
    """JobSet's webhook refuses a JobSet whose pod names would pass 63 characters, and Trainer then
    leaves the TrainJob without any condition (only an event), so the step checks first. The node
    job's pod names are the longest (the ps job's are shorter for any count below 1000 servers)."""
    return trainjob_name_limit({NODE_JOB: manifest["spec"]["trainer"]["numNodes"]})


def no_refusal(cluster: Cluster, namespace: str, job: dict) -> str | None:
    return None  # the training operator's refusals are not read (the control-plane tier does not run it)


@dataclasses.dataclass(frozen=True)
class Engine:
    """One engine's side of the step: its resource, the condition that ends it well, how its pods are
    found, what its progress shows, why it waits, what says it will never start, and the longest name
    its controllers accept."""
    resource: CustomResource
    succeeded: str
    pod_label: str
    progress: Callable[[dict, list[dict]], str]
    waiting: Callable[[Cluster, str, dict], str | None]
    refusal: Callable[[Cluster, str, dict], str | None]
    name_limit: Callable[[dict], int]

    @property
    def kind(self) -> str:
        return self.resource.kind


ENGINES = {engine.kind: engine for engine in (
    Engine(TFJOB, "Succeeded", TFJOB_NAME_LABEL, tfjob_progress, tfjob_is_waiting, no_refusal,
           lambda manifest: DNS_LABEL_LENGTH),
    Engine(TRAINJOB, "Complete", JOBSET_NAME_LABEL, trainjob_progress, trainjob_is_waiting, trainjob_refusal,
           trainjob_name_limit_of),
)}


# --- The watch, the same for every engine ----------------------------------------------------------

def wait_until_gone(cluster: Cluster, engine: Engine, namespace: str, name: str, timing: Timing,
                    timeout_seconds: float) -> None:
    deadline = timing.clock() + timeout_seconds
    while cluster.get_job(engine.resource, namespace, name) is not None:
        if timing.clock() >= deadline:
            raise TrainingFailed(f"{engine.resource.what(namespace, name)}: still there "
                                 f"{timeout_seconds:g} s after its deletion")
        timing.sleep(timing.poll_seconds)


def start(cluster: Cluster, engine: Engine, namespace: str, manifest: dict, timing: Timing,
          say: Callable[[str], None]) -> bool:
    """Creates the job unless this step's earlier attempt did; a failed one is created anew.
    Returns whether the job has already succeeded."""
    name = manifest["metadata"]["name"]
    what = engine.resource.what(namespace, name)
    current = cluster.get_job(engine.resource, namespace, name)
    if current is not None and condition(current, engine.succeeded):
        say(f"{what} succeeded in an earlier attempt")
        return True
    if current is not None and (failed := condition(current, "Failed")):
        say(f"{what} failed in an earlier attempt ({described(failed)}); creating it again: training "
            "resumes from its last backup")
        cluster.delete_job(engine.resource, namespace, name)
        wait_until_gone(cluster, engine, namespace, name, timing, DELETION_TIMEOUT_SECONDS)
        current = None
    if current is None:
        if len(name) > (limit := engine.name_limit(manifest)):
            raise TrainingFailed(f"{engine.kind} name {name!r} has {len(name)} characters, and its pods' "
                                 f"names allow {limit}: submit the workflow with a shorter name")
        cluster.create_job(engine.resource, namespace, manifest)
        say(f"created {what}")
    else:
        say(f"{what} is running from an earlier attempt; watching it")
    return False


def watch(cluster: Cluster, engine: Engine, namespace: str, name: str, timeout_seconds: float,
          timing: Timing, say: Callable[[str], None]) -> str:
    """Waits for the job's success condition; raises TrainingFailed on its Failed condition, on a pod
    that cannot start, when the job vanishes, or at the timeout (a wait in Kueue's queue included)."""
    what = engine.resource.what(namespace, name)
    deadline, last = timing.clock() + timeout_seconds, None
    while True:
        job = cluster.get_job(engine.resource, namespace, name)
        if job is None:
            raise TrainingFailed(f"{what} was deleted while the step watched it")
        if found := condition(job, engine.succeeded):
            return f"{what} succeeded ({described(found)})"
        if found := condition(job, "Failed"):
            raise TrainingFailed(f"{what} failed: {described(found)}")
        if refused := engine.refusal(cluster, namespace, job):
            raise TrainingFailed(f"{what} cannot start: {refused}")
        pods = cluster.list_pods(namespace, f"{engine.pod_label}={name}")
        for pod in pods:
            if failure := pod_failure(pod):
                raise TrainingFailed(f"{what}: {failure}")
        now = engine.waiting(cluster, namespace, job) or engine.progress(job, pods)
        if timing.clock() >= deadline:
            raise TrainingFailed(f"{what}: not finished after {timeout_seconds:g} s ({now})")
        if now != last:
            say(f"{name}: {now}")
            last = now
        timing.sleep(timing.poll_seconds)


def run(cluster: Cluster, namespace: str, manifest: dict, timeout_seconds: float,
        timing: Timing = Timing(), say: Callable[[str], None] = print) -> str:
    """The step: the job created (or found) and watched to its end. A job this step gives up on is
    deleted, so that none of its pods keeps running or pending."""
    engine = ENGINES[manifest["kind"]]
    name = manifest["metadata"]["name"]
    if start(cluster, engine, namespace, manifest, timing, say):
        return f"{engine.resource.what(namespace, name)} succeeded"
    try:
        return watch(cluster, engine, namespace, name, timeout_seconds, timing, say)
    except TrainingFailed:
        job = cluster.get_job(engine.resource, namespace, name)
        if job is not None and not condition(job, "Failed"):  # a failed job is kept for its logs
            cluster.delete_job(engine.resource, namespace, name)
            say(f"deleted {engine.resource.what(namespace, name)}")
        raise


def job_arg(text: str) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
        if manifest["kind"] not in ENGINES:
            raise ValueError(f"kind {manifest['kind']!r}")
        manifest["metadata"]["name"]
    except (ValueError, KeyError, TypeError) as error:
        raise argparse.ArgumentTypeError(f"not a {' or '.join(ENGINES)} manifest "
                                         f"({type(error).__name__}: {error})") from None
    return manifest


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="cluster_steps.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument(MANIFEST_FLAG, type=job_arg, required=True, help="the TrainJob or TFJob, as JSON")
    parser.add_argument("--timeout-seconds", type=cli.positive_float, default=DEFAULT_TIMEOUT_SECONDS,
                        help="longest the job may take, its wait in a queue and its restarts included")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        print(f"train: {run(TrainApi(), args.namespace, args.manifest, args.timeout_seconds, say=log)}")
    except ClusterStepError as error:  # the job failed, or an API call the step could not make
        raise SystemExit(f"train: {error}") from None


def log(line: str) -> None:
    print(f"train: {line}", flush=True)


if __name__ == "__main__":
    cli.run("cluster_steps.train", main)
