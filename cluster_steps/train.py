"""The training step on a cluster: create a TFJob and watch it to its end.

    python -m cluster_steps.train --namespace NS --manifest JSON --timeout-seconds 21600

Argo's resource template cannot do this: its conditions cannot select an entry of
`status.conditions` by type (argoproj/argo-workflows#2288, #7143), and the training operator
(kubeflow/trainer v1.9.4) marks a job Failed by its backoff limit without counting a failed replica,
so a crashing job held the workflow for ever. This step fails as soon as the job's Failed condition
appears, with the operator's reason; at once when a pod waits on something that will not come by
itself (an image that cannot be pulled); and at --timeout-seconds otherwise, deleting the job so that
no pod is left running. It succeeds when the job's Succeeded condition appears.

Argo retries the step (retryStrategy): a retry finds the job it created, watches it if it still runs,
succeeds if it has succeeded, and creates it anew if it failed, so a run that lost a pod to a
preempted node trains again from the variant's last backup (BackupAndRestore).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable, Protocol, Sequence

from cluster_steps.kubernetes import ClusterStepError, Timing, TrainApi, pod_failure
from cluster_steps.names import MANIFEST_FLAG
from common import cli

JOB_NAME_LABEL = "training.kubeflow.org/job-name"  # the operator labels a job's pods with it
DEFAULT_TIMEOUT_SECONDS = 6 * 3600.0
DELETION_TIMEOUT_SECONDS = 300.0  # a failed job and its pods gone (foreground), before the retry


class TrainingFailed(ClusterStepError):
    """The TFJob failed, or cannot finish by itself; the message says why."""


class Cluster(Protocol):
    """The API calls the step makes (plain dicts, as the API server sends them)."""

    def get_tfjob(self, namespace: str, name: str) -> dict | None: ...
    def create_tfjob(self, namespace: str, manifest: dict) -> None: ...
    def delete_tfjob(self, namespace: str, name: str) -> None: ...
    def list_pods(self, namespace: str, label_selector: str) -> list[dict]: ...


def condition(job: dict, kind: str) -> dict | None:
    """The job's condition of type `kind` when its status is True."""
    for found in (job.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind and found.get("status") == "True":
            return found
    return None


def described(found: dict) -> str:
    return f"{found.get('reason', '')}: {found.get('message', '')}".strip(": ")


def wait_until_gone(cluster: Cluster, namespace: str, name: str, timing: Timing,
                    timeout_seconds: float) -> None:
    deadline = timing.clock() + timeout_seconds
    while cluster.get_tfjob(namespace, name) is not None:
        if timing.clock() >= deadline:
            raise TrainingFailed(f"TFJob {namespace}/{name}: still there {timeout_seconds:g} s after "
                                 "its deletion")
        timing.sleep(timing.poll_seconds)


def start(cluster: Cluster, namespace: str, manifest: dict, timing: Timing,
          say: Callable[[str], None]) -> bool:
    """Creates the job unless this step's earlier attempt did; a failed one is created anew.
    Returns whether the job has already succeeded."""
    name = manifest["metadata"]["name"]
    current = cluster.get_tfjob(namespace, name)
    if current is not None and condition(current, "Succeeded"):
        say(f"tfjob: {namespace}/{name} succeeded in an earlier attempt")
        return True
    if current is not None and (failed := condition(current, "Failed")):
        say(f"tfjob: {namespace}/{name} failed in an earlier attempt ({described(failed)}); creating it "
            "again: training resumes from its last backup")
        cluster.delete_tfjob(namespace, name)
        wait_until_gone(cluster, namespace, name, timing, DELETION_TIMEOUT_SECONDS)
        current = None
    if current is None:
        cluster.create_tfjob(namespace, manifest)
        say(f"tfjob: created {namespace}/{name}")
    else:
        say(f"tfjob: {namespace}/{name} is running from an earlier attempt; watching it")
    return False


def watch(cluster: Cluster, namespace: str, name: str, timeout_seconds: float, timing: Timing,
          say: Callable[[str], None]) -> str:
    """Waits for the job's Succeeded condition; raises TrainingFailed on its Failed condition, on a
    pod that cannot start, when the job vanishes, or at the timeout."""
    deadline, last = timing.clock() + timeout_seconds, None
    while True:
        job = cluster.get_tfjob(namespace, name)
        if job is None:
            raise TrainingFailed(f"TFJob {namespace}/{name} was deleted while the step watched it")
        if found := condition(job, "Succeeded"):
            return f"TFJob {namespace}/{name} succeeded ({described(found)})"
        if found := condition(job, "Failed"):
            raise TrainingFailed(f"TFJob {namespace}/{name} failed: {described(found)}")
        for pod in cluster.list_pods(namespace, f"{JOB_NAME_LABEL}={name}"):
            if failure := pod_failure(pod):
                raise TrainingFailed(f"TFJob {namespace}/{name}: {failure}")
        if timing.clock() >= deadline:
            raise TrainingFailed(f"TFJob {namespace}/{name}: not finished after {timeout_seconds:g} s "
                                 f"({progress(job)})")
        if (now := progress(job)) != last:
            say(f"tfjob: {name}: {now}")
            last = now
        timing.sleep(timing.poll_seconds)


def progress(job: dict) -> str:
    """Each replica type's counts, e.g. `Worker: 2 active`."""
    counts = []
    for kind, status in sorted(((job.get("status") or {}).get("replicaStatuses") or {}).items()):
        shown = [f"{status[key]} {key}" for key in ("active", "succeeded", "failed") if status.get(key)]
        counts.append(f"{kind}: {', '.join(shown) or 'none started'}")
    return "; ".join(counts) or "no replica started yet"


def run(cluster: Cluster, namespace: str, manifest: dict, timeout_seconds: float,
        timing: Timing = Timing(), say: Callable[[str], None] = print) -> str:
    """The step: the job created (or found) and watched to its end. A job this step gives up on is
    deleted, so that none of its pods keeps running or pending."""
    name = manifest["metadata"]["name"]
    if start(cluster, namespace, manifest, timing, say):
        return f"TFJob {namespace}/{name} succeeded"
    try:
        return watch(cluster, namespace, name, timeout_seconds, timing, say)
    except TrainingFailed:
        job = cluster.get_tfjob(namespace, name)
        if job is not None and not condition(job, "Failed"):  # a failed job is kept for its logs
            cluster.delete_tfjob(namespace, name)
            say(f"tfjob: deleted {namespace}/{name}")
        raise


def tfjob_arg(text: str) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
        if manifest["kind"] != "TFJob":
            raise ValueError(f"kind {manifest['kind']!r}")
        manifest["metadata"]["name"]
    except (ValueError, KeyError, TypeError) as error:
        raise argparse.ArgumentTypeError(f"not a TFJob manifest ({type(error).__name__}: {error})") from None
    return manifest


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="cluster_steps.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument(MANIFEST_FLAG, type=tfjob_arg, required=True, help="the TFJob, as JSON")
    parser.add_argument("--timeout-seconds", type=cli.positive_float, default=DEFAULT_TIMEOUT_SECONDS,
                        help="longest the job may take, its pods' restarts included")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        print(f"tfjob: {run(TrainApi(), args.namespace, args.manifest, args.timeout_seconds)}")
    except ClusterStepError as error:  # the job failed, or an API call the step could not make
        raise SystemExit(f"tfjob: {error}") from None


if __name__ == "__main__":
    cli.run("cluster_steps.train", main)
