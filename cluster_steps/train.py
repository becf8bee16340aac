"""The training step on a cluster: create the variant's job, of the training engine it belongs to (a
TrainJob of Kubeflow Trainer v2, or a TFJob of the training operator v1: engines/), and watch it to its
end.

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
within a poll, with the controller's own words (read in their code at the tags the stacks install;
engines/trainjob.py):
- Kueue: a Workload it deactivated (it gave up requeueing the job), or one it finds inadmissible (its
  LocalQueue or ClusterQueue missing or inactive, its namespace not the queue's: reason Inadmissible),
  or whose pods need more than the queue could ever hold ("... > maximum capacity"), or whose pods' node
  selector the queue's flavor does not match ("flavor ... doesn't match node affinity").
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

The engines differ in what is read (engines.base.TrainingEngine: the job's kind, its success
condition, its pods' label, why it waits, what refuses it, its progress); the watch is the same.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable, Sequence

from cluster_steps.kubernetes import ClusterStepError, Timing, TrainApi, pod_failure
from common import cli
from common.cli import step_exit
from common.cluster_names import MANIFEST_FLAG
from engines import ENGINES, engine_of_job
from engines.base import JobApi, TrainingEngine, TrainingFailed, TrainingNeverSucceeds, condition, described

DEFAULT_TIMEOUT_SECONDS = 6 * 3600.0
DELETION_TIMEOUT_SECONDS = 300.0  # a failed job and its pods gone (foreground), before the retry
JOB_KINDS = " or ".join(engine.job_resource.kind for engine in ENGINES.values())


def wait_until_gone(api: JobApi, engine: TrainingEngine, namespace: str, name: str, timing: Timing,
                    timeout_seconds: float) -> None:
    deadline = timing.clock() + timeout_seconds
    while api.get_job(engine.job_resource, namespace, name) is not None:
        if timing.clock() >= deadline:
            raise TrainingFailed(f"{engine.job_resource.what(namespace, name)}: still there "
                                 f"{timeout_seconds:g} s after its deletion")
        timing.sleep(timing.poll_seconds)


def start(api: JobApi, engine: TrainingEngine, namespace: str, manifest: dict, timing: Timing,
          say: Callable[[str], None]) -> bool:
    """Creates the job unless this step's earlier attempt did; a failed one is created anew.
    Returns whether the job has already succeeded."""
    name, resource = manifest["metadata"]["name"], engine.job_resource
    what = resource.what(namespace, name)
    current = api.get_job(resource, namespace, name)
    if current is not None and condition(current, engine.succeeded):
        say(f"{what} succeeded in an earlier attempt")
        return True
    if current is not None and (failed := condition(current, "Failed")):
        say(f"{what} failed in an earlier attempt ({described(failed)}); creating it again: training "
            "resumes from its last backup")
        api.delete_job(resource, namespace, name)
        wait_until_gone(api, engine, namespace, name, timing, DELETION_TIMEOUT_SECONDS)
        current = None
    if current is None:
        if len(name) > (limit := engine.name_limit(manifest)):
            raise TrainingFailed(f"{resource.kind} name {name!r} has {len(name)} characters, and its pods' "
                                 f"names allow {limit}: submit the workflow with a shorter name")
        api.create_job(resource, namespace, manifest)
        say(f"created {what}")
    else:
        say(f"{what} is running from an earlier attempt; watching it")
    return False


def watch(api: JobApi, engine: TrainingEngine, namespace: str, name: str, timeout_seconds: float,
          timing: Timing, say: Callable[[str], None]) -> str:
    """Waits for the job's success condition; raises TrainingFailed on its Failed condition, on what
    says it will never start, on a pod that cannot start, when the job vanishes, or at the timeout (a
    wait in a queue included)."""
    what = engine.job_resource.what(namespace, name)
    deadline, last = timing.clock() + timeout_seconds, None
    while True:
        job = api.get_job(engine.job_resource, namespace, name)
        if job is None:
            raise TrainingNeverSucceeds(f"{what} was deleted while the step watched it")
        if found := condition(job, engine.succeeded):
            return f"{what} succeeded ({described(found)})"
        if found := condition(job, "Failed"):
            raise TrainingFailed(f"{what} failed: {described(found)}")
        if refused := engine.refusal(api, namespace, job):
            raise TrainingNeverSucceeds(f"{what} cannot start: {refused}")
        pods = api.list_pods(namespace, f"{engine.pod_label}={name}")
        for pod in pods:
            if failure := pod_failure(pod):
                raise TrainingNeverSucceeds(f"{what}: {failure}")
        now = engine.waiting(api, namespace, job) or engine.progress(job, pods)
        if timing.clock() >= deadline:
            raise TrainingFailed(f"{what}: not finished after {timeout_seconds:g} s ({now})")
        if now != last:
            say(f"{name}: {now}")
            last = now
        timing.sleep(timing.poll_seconds)


def run(api: JobApi, namespace: str, manifest: dict, timeout_seconds: float,
        timing: Timing = Timing(), say: Callable[[str], None] = print) -> str:
    """The step: the job created (or found) and watched to its end. A job this step gives up on is
    deleted, so that none of its pods keeps running or pending."""
    engine = engine_of_job(manifest["kind"])
    name, resource = manifest["metadata"]["name"], engine.job_resource
    if start(api, engine, namespace, manifest, timing, say):
        return f"{resource.what(namespace, name)} succeeded"
    try:
        return watch(api, engine, namespace, name, timeout_seconds, timing, say)
    except TrainingFailed:
        job = api.get_job(resource, namespace, name)
        if job is not None and not condition(job, "Failed"):  # a failed job is kept for its logs
            api.delete_job(resource, namespace, name)
            say(f"deleted {resource.what(namespace, name)}")
        raise


def job_arg(text: str) -> dict[str, Any]:
    def refused(detail: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"not a {JOB_KINDS} manifest ({detail})")

    try:
        manifest = json.loads(text)
        kind = manifest["kind"]
    except (ValueError, KeyError, TypeError) as error:
        raise refused(f"{type(error).__name__}: {error}") from None
    try:
        engine_of_job(kind)
    except KeyError:
        raise refused(f"kind {kind!r}") from None
    try:
        manifest["metadata"]["name"]
    except (KeyError, TypeError) as error:
        raise refused(f"{type(error).__name__}: {error}") from None
    return manifest


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="cluster_steps.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument(MANIFEST_FLAG, type=job_arg, required=True, help=f"the {JOB_KINDS}, as JSON")
    parser.add_argument("--timeout-seconds", type=cli.positive_float, default=DEFAULT_TIMEOUT_SECONDS,
                        help="longest the job may take, its wait in a queue and its restarts included")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        print(f"train: {run(TrainApi(), args.namespace, args.manifest, args.timeout_seconds, say=log)}")
    except (TrainingFailed, ClusterStepError) as error:  # the job failed, or a call the step could not make
        raise step_exit("train", error) from None


def log(line: str) -> None:
    print(f"train: {line}", flush=True)


if __name__ == "__main__":
    cli.run("cluster_steps.train", main)
