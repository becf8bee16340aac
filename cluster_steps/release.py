"""Roll model versions out on the cluster: a canary beside the stable version, a weighted route between
them, and promotion or rollback on the predictors' own metrics.

    python -m cluster_steps.release deploy --namespace NS --manifest JSON [--canary-percent 10]
    python -m cluster_steps.release analyse --namespace NS --model-name fmnist [--version N] [policy flags]
    python -m cluster_steps.release decide --namespace NS --model-name fmnist [--version N] [policy flags]
    python -m cluster_steps.release promote --namespace NS --model-name fmnist
    python -m cluster_steps.release rollback --namespace NS --model-name fmnist

Two InferenceServices serve a model: `<model>` (stable) and, during a rollout, `<model>-canary`, each
on one release. Users reach them through the HTTPRoute `<model>-split` on the stacks' Gateway, whose
weighted backends are the two predictor Services (KServe v0.20's Standard-mode `spec.canary[]` routes
no traffic to a canary, so the split is ours). The pipeline's serve step runs `deploy`: the first
version, or any with --canary-percent 0, becomes the stable one; a later one becomes the canary and
takes its percentage. Its rollout step runs `decide`: it waits until the canary has answered
--min-requests requests or --max-wait-seconds have passed, compares the canary's error rate and mean
latency with the stable version's over the same window (each predictor pod's /metrics, read through
the API server's pod proxy, the same way in a pod and from a laptop), prints the decision with its
numbers and writes it to --decision-file, then promotes (the stable InferenceService takes the
canary's release and rolls out, the route sends everything to it, the canary is deleted) or rolls
back (the route sends everything to the stable version, the canary is deleted). Versions on storage
are never deleted. `analyse` is the decision alone; `promote` and `rollback` act by hand.

No test traffic is sent: a fixed synthetic request says nothing about the canary on real inputs, and
would be written to the request log as if a user had sent it. Without traffic the decision comes at
--max-wait-seconds on what little evidence there is (serving.canary.decide says what it does then).

Waiting for a rollout: KServe's status cannot say which version is live in Standard mode (the
InferenceService stays Ready through a rolling update, and its observedGeneration is copied from the
Deployment), so this checks the predictor's Deployment as `kubectl rollout status` does, and that its
pod template names the storage URI. The kubernetes client is used directly: the kserve SDK's
create/replace take its model classes, and its readiness check relies on that observedGeneration.

Argo retries a failed step, and others write the same objects, so each step may meet the remains of
its own earlier attempt or another writer's change: a version an earlier attempt wrote is still waited
for before it is routed to (a retry fails again while it does not serve); each write is made at the
resourceVersion just read, and read and made again when another writer changed the object between
(WRITE_ATTEMPTS times at most); a canary someone deleted loses its share of the route before the step
fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from cluster_steps.inference_service import ShapeError, metrics_port, model_version, renamed, storage_uri
from cluster_steps.kubernetes import (
    ClusterStepError,
    Conflict,
    NotFound,
    ReleaseApi,
    Timing,
    pod_failure,
)
from common import cli
from common.cli import NeverSucceeds, step_exit
from common.cluster_names import (
    GATEWAY_NAME,
    ISVC_LABEL,
    MANIFEST_FLAG,
    MODEL_LISTENER,
    PREDICTOR_SERVICE_PORT,
    ROUTE_GROUP,
    ROUTE_VERSION,
    canary_name,
    predictor_deployment_name,
    route_name,
)
from serving import canary
from trainer import tracking

DEFAULT_TIMEOUT_SECONDS = 900.0  # an image pull, the storage initializer's copy and a model load
DEFAULT_CANARY_PERCENT = 10
DEFAULT_MIN_REQUESTS = 100
DEFAULT_MAX_WAIT_SECONDS = 600.0
DEFAULT_MAX_ERROR_RATE_INCREASE = 0.01
DEFAULT_MAX_LATENCY_RATIO = 1.5
# Reads and writes of one object before other writers' changes fail the step (client-go's retry.DefaultRetry).
WRITE_ATTEMPTS = 5
EVIDENCE_POLL_SECONDS = 15.0  # between scrapes of every predictor pod while the canary gathers requests
RETIRE_SECONDS = 60.0  # for KServe's controller to release a deleted canary (its finalizer)


class RolloutFailed(ClusterStepError):
    """The version did not roll out, or a rollout step cannot go on; the message says why."""


class RolloutNeverSucceeds(RolloutFailed, NeverSucceeds):
    """The version will never roll out, in the cluster's words (its pods, probes or Deployment)."""


class RolloutApi(Protocol):
    """The few API calls a rollout makes (plain dicts, as the API server sends them). A get of a missing
    object answers None; a create of an existing one, or a replace at a stale resourceVersion, raises
    Conflict; a replace or delete of a missing one raises NotFound."""

    def get_inference_service(self, namespace: str, name: str) -> dict | None: ...
    def create_inference_service(self, namespace: str, manifest: dict) -> None: ...
    def replace_inference_service(self, namespace: str, name: str, manifest: dict) -> None: ...
    def delete_inference_service(self, namespace: str, name: str) -> None: ...
    def get_http_route(self, namespace: str, name: str) -> dict | None: ...
    def create_http_route(self, namespace: str, manifest: dict) -> None: ...
    def replace_http_route(self, namespace: str, name: str, manifest: dict) -> None: ...
    def get_deployment(self, namespace: str, name: str) -> dict | None: ...
    def list_pods(self, namespace: str, label_selector: str) -> list[dict]: ...
    def pod_metrics(self, namespace: str, pod: str, port: int) -> str | None: ...  # None: unreadable
    def list_warnings(self, namespace: str) -> list[dict]: ...  # the namespace's Warning events


@dataclasses.dataclass(frozen=True)
class Observation:
    done: bool
    reason: str  # why it is not done yet, or what it reached


def http_route(model_name: str, canary_percent: int, labels: Mapping[str, str] | None = None) -> dict:
    """The route users reach the model through: all to the stable predictor, or `canary_percent` of
    requests to the canary's. A canary with no share has no backend: a backendRef to a Service that
    does not exist would make the route unresolved."""
    stable = {"name": predictor_deployment_name(model_name), "port": PREDICTOR_SERVICE_PORT,
              "weight": 100 - canary_percent}
    backends = [stable]
    if canary_percent:
        backends.append({"name": predictor_deployment_name(canary_name(model_name)),
                         "port": PREDICTOR_SERVICE_PORT, "weight": canary_percent})
    return {"apiVersion": f"{ROUTE_GROUP}/{ROUTE_VERSION}", "kind": "HTTPRoute",
            "metadata": {"name": route_name(model_name), "labels": dict(labels or {})},
            "spec": {"parentRefs": [{"name": GATEWAY_NAME, "sectionName": MODEL_LISTENER}],
                     "rules": [{"backendRefs": backends}]}}


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def names_uri(node: Any, uri: str) -> bool:
    """KServe writes the storage URI into the pod template (an annotation, and the init container's
    or the custom container's arguments), so pods of this version are the ones naming it."""
    return any(value == uri for value in _strings(node))


# The kubelet's event for a failed HTTP probe (pkg/kubelet/prober/prober.go, v1.35: reason Unhealthy,
# "<Readiness|Startup> probe failed: HTTP probe failed with statuscode: <code>"). A 404 is the server
# saying the probe's path does not exist: retrying the same request will not make it Ready.
PROBE_PATH_MISSING = re.compile(
    r"^(Readiness|Startup) probe failed: HTTP probe failed with statuscode: 404\b")


def probe_never_passes(warnings: Sequence[dict], pods: Sequence[dict]) -> str | None:
    """The kubelet's words when a probe of one of `pods` asks for a path its server does not have."""
    names = {pod["metadata"]["name"] for pod in pods}
    for event in warnings:
        involved = event.get("involvedObject") or {}
        if (event.get("reason") == "Unhealthy" and involved.get("kind") == "Pod"
                and involved.get("name") in names and PROBE_PATH_MISSING.match(event.get("message") or "")):
            return (f"pod {involved['name']}: {event['message'].strip()} (the probe's path does not exist on "
                    "the server, so the predictor will never be Ready)")
    return None


def observe(deployment: dict | None, pods: Sequence[dict], uri: str) -> Observation:
    """Where the rollout to `uri` stands; raises RolloutFailed when it cannot finish by itself."""
    for pod in pods:
        if names_uri(pod, uri):
            failure = pod_failure(pod)
            if failure:
                raise RolloutNeverSucceeds(failure)
    if deployment is None:
        return Observation(False, "the predictor's Deployment does not exist yet")
    metadata, spec, status = deployment["metadata"], deployment["spec"], deployment.get("status") or {}
    if not names_uri(spec["template"], uri):
        return Observation(False, "KServe has not yet updated the predictor's Deployment")
    if (status.get("observedGeneration") or 0) < metadata.get("generation", 0):
        return Observation(False, "the Deployment controller has not yet seen the new pod template")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            message = condition.get("message", "progress deadline exceeded")
            raise RolloutNeverSucceeds(f"Deployment {metadata['name']}: {message}")
    wanted = spec.get("replicas", 1)
    updated, total = status.get("updatedReplicas", 0), status.get("replicas", 0)
    available = status.get("availableReplicas", 0)
    if updated < wanted:
        return Observation(False, f"{updated} of {wanted} replicas run the new version")
    if total > updated:
        return Observation(False, f"{total - updated} replicas of an earlier version are still terminating")
    if available < updated:
        return Observation(False, f"{available} of {updated} new replicas are available")
    return Observation(True, f"{available} of {wanted} replicas serve it")


def write(namespace: str, manifest: dict, get: Callable[[str, str], dict | None],
          create: Callable[[str, dict], None], replace: Callable[[str, str, dict], None]) -> None:
    """Creates the object, or replaces it with `manifest` at the resourceVersion just read. Another
    writer may change it in between (KServe's controller writes an InferenceService's status as it
    reconciles), create it, or delete it: then it is read and written again, WRITE_ATTEMPTS times at
    most. One deleted in between is created again, as it would have been had it gone before the read:
    the step declares what should be served, as `kubectl apply` does."""
    name, kind = manifest["metadata"]["name"], manifest["kind"]
    for _attempt in range(WRITE_ATTEMPTS):
        current = get(namespace, name)
        if current is None:
            try:
                create(namespace, manifest)
                return
            except Conflict:  # created by another writer since the read
                continue
        metadata = {**manifest["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
        try:
            replace(namespace, name, {**manifest, "metadata": metadata})
            return
        except (Conflict, NotFound):  # changed or deleted by another writer since the read
            continue
    raise RolloutFailed(f"{kind} {namespace}/{name}: not written in {WRITE_ATTEMPTS} attempts: "
                        "another writer changed it between each read and write")


def wait_for(cluster: RolloutApi, namespace: str, name: str, uri: str, timeout_seconds: float,
             timing: Timing = Timing(), say: Callable[[str], None] = print) -> str:
    """Waits until the InferenceService `name` serves `uri` on every replica; returns the final state
    or raises RolloutFailed."""
    deadline, last = timing.clock() + timeout_seconds, None
    while True:
        deployment = cluster.get_deployment(namespace, predictor_deployment_name(name))
        if deployment is None and cluster.get_inference_service(namespace, name) is None:
            # Someone deleted it after the step wrote it: it will never roll out, and creating it again
            # would overrule them.
            raise RolloutNeverSucceeds(f"InferenceService {namespace}/{name} was deleted while it rolled out")
        pods = cluster.list_pods(namespace, f"{ISVC_LABEL}={name}")
        state = observe(deployment, pods, uri)
        if state.done:
            return state.reason
        never = probe_never_passes(cluster.list_warnings(namespace), [p for p in pods if names_uri(p, uri)])
        if never:
            raise RolloutNeverSucceeds(never)
        if state.reason != last:
            say(f"rollout: waiting: {state.reason}")
            last = state.reason
        if timing.clock() >= deadline:
            raise RolloutFailed(f"{name}: not rolled out after {timeout_seconds:g} s: {state.reason}")
        timing.sleep(timing.poll_seconds)


def roll_out(cluster: RolloutApi, namespace: str, manifest: dict, timeout_seconds: float,
             timing: Timing = Timing(), say: Callable[[str], None] = print) -> str:
    """Applies `manifest` and waits for its version; returns the final state or raises RolloutFailed."""
    name, uri = manifest["metadata"]["name"], storage_uri(manifest)
    write(namespace, manifest, cluster.get_inference_service, cluster.create_inference_service,
          cluster.replace_inference_service)
    say(f"rollout: applied InferenceService {namespace}/{name} with {uri}")
    return wait_for(cluster, namespace, name, uri, timeout_seconds, timing, say)


def route_to(cluster: RolloutApi, namespace: str, model_name: str, canary_percent: int,
             labels: Mapping[str, str]) -> None:
    """Creates the route, or sets its weights."""
    write(namespace, http_route(model_name, canary_percent, labels), cluster.get_http_route,
          cluster.create_http_route, cluster.replace_http_route)


def routes_to_canary(cluster: RolloutApi, namespace: str, model_name: str) -> bool:
    """Whether the route has a backend for the canary's predictor Service."""
    route = cluster.get_http_route(namespace, route_name(model_name))
    service = predictor_deployment_name(canary_name(model_name))
    return route is not None and any(backend["name"] == service for rule in route["spec"]["rules"]
                                     for backend in rule.get("backendRefs", []))


def deploy(cluster: RolloutApi, namespace: str, manifest: dict, canary_percent: int, timeout_seconds: float,
           timing: Timing = Timing(), say: Callable[[str], None] = print) -> str:
    """The serve step: the version of `manifest` (named `<model>`) becomes the stable version when
    there is none yet or `canary_percent` is 0, and otherwise the canary with that share of requests.
    Returns what it did, in one line."""
    model_name, version = manifest["metadata"]["name"], model_version(manifest)
    labels = manifest["metadata"].get("labels", {})
    stable = cluster.get_inference_service(namespace, model_name)
    if stable is None or canary_percent == 0:
        # Also when the stable InferenceService names the version already: Argo retrying an attempt
        # that failed half way, this one finishes its work (waited for, routed to, canary retired).
        reached = roll_out(cluster, namespace, manifest, timeout_seconds, timing, say)
        route_to(cluster, namespace, model_name, 0, labels)
        retire_canary(cluster, namespace, model_name, say, timing)
        return f"version {version} is the stable version ({reached}); the route sends it every request"
    if model_version(stable) == version:
        # The promotion gate kept it, or an earlier attempt of this step created it and failed: either
        # way it is waited for, so that a retry fails again while it does not serve, and routed to
        # only once it serves.
        reached = wait_for(cluster, namespace, model_name, storage_uri(stable), timeout_seconds, timing, say)
        if cluster.get_http_route(namespace, route_name(model_name)) is None:
            route_to(cluster, namespace, model_name, 0, labels)
        return f"version {version} is already the stable version ({reached}): nothing to roll out"
    metrics_port(manifest)  # refused now, before a canary that could never be judged is deployed
    reached = roll_out(cluster, namespace, renamed(manifest, canary_name(model_name)), timeout_seconds,
                       timing, say)
    route_to(cluster, namespace, model_name, canary_percent, labels)
    return (f"version {version} is the canary ({reached}), taking {canary_percent}% of requests; "
            f"version {model_version(stable)} stays stable")


def retire_canary(cluster: RolloutApi, namespace: str, model_name: str, say: Callable[[str], None],
                  timing: Timing = Timing()) -> None:
    """Deletes the canary InferenceService, if any (its release stays on storage), and waits until it
    is gone, as `kubectl delete` does: KServe's finalizer keeps it until its controller has cleaned up,
    and the next serve step would otherwise write its canary into an object on its way out."""
    name = canary_name(model_name)
    try:
        cluster.delete_inference_service(namespace, name)
    except NotFound:  # there was none, or someone deleted it first: gone either way, as wanted
        return
    say(f"rollout: deleted InferenceService {namespace}/{name}")
    deadline = timing.clock() + RETIRE_SECONDS
    while (left := cluster.get_inference_service(namespace, name)) is not None:
        if timing.clock() >= deadline:
            finalizers = ", ".join(left["metadata"].get("finalizers") or []) or "none"
            raise RolloutFailed(f"InferenceService {namespace}/{name} is still there {RETIRE_SECONDS:g} "
                                f"s after its deletion (finalizers: {finalizers}): "
                                "is KServe's controller running?")
        timing.sleep(timing.poll_seconds)


def canary_gone(cluster: RolloutApi, namespace: str, model_name: str, reason: str,
                say: Callable[[str], None]) -> RolloutFailed:
    """What a step fails with when the canary InferenceService is gone (someone deleted it): first
    every request goes to the stable version, as a rollback does it, since a backend whose Service is
    gone would fail its share of requests; then the step fails, having judged and promoted nothing."""
    return RolloutFailed(f"{reason}; {rollback(cluster, namespace, model_name, say)}")


def promote(cluster: RolloutApi, namespace: str, model_name: str, timeout_seconds: float,
            timing: Timing = Timing(), say: Callable[[str], None] = print) -> str:
    """The stable InferenceService takes the canary's release and rolls out to it (the split stays
    as it is meanwhile: both backends serve the canary's version by the end); then every request goes
    to it and the canary is deleted."""
    current = cluster.get_inference_service(namespace, canary_name(model_name))
    if current is None:
        raise canary_gone(cluster, namespace, model_name,
                          f"no canary InferenceService {namespace}/{canary_name(model_name)} to promote", say)
    version = model_version(current)
    reached = roll_out(cluster, namespace, renamed(current, model_name), timeout_seconds, timing, say)
    route_to(cluster, namespace, model_name, 0, current["metadata"].get("labels", {}))
    retire_canary(cluster, namespace, model_name, say, timing)
    return f"promoted version {version}: {reached}; the route sends it every request"


def rollback(cluster: RolloutApi, namespace: str, model_name: str, say: Callable[[str], None] = print,
             timing: Timing = Timing()) -> str:
    """Every request to the stable version, then the canary deleted; no version leaves storage."""
    stable = cluster.get_inference_service(namespace, model_name)
    if stable is None:
        raise RolloutFailed(f"no stable InferenceService {namespace}/{model_name} to roll back to")
    route_to(cluster, namespace, model_name, 0, stable["metadata"].get("labels", {}))
    retire_canary(cluster, namespace, model_name, say, timing)
    return f"rolled back: version {model_version(stable)} serves every request"


# --- Evidence ---------------------------------------------------------------------------------------

def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions") or [])


def scrape(cluster: RolloutApi, namespace: str, isvc: dict) -> dict[str, canary.Evidence]:
    """Pod name -> what that predictor pod has served, over its life (its counters restart with it).
    A pod that is not ready, or whose /metrics cannot be read this time (it is going away), is left
    out of this look; what it served before stays in the earlier looks' totals only."""
    name, port, version = isvc["metadata"]["name"], metrics_port(isvc), model_version(isvc)
    found = {}
    for pod in cluster.list_pods(namespace, f"{ISVC_LABEL}={name}"):
        text = cluster.pod_metrics(namespace, pod["metadata"]["name"], port) if _ready(pod) else None
        if text is not None:
            found[pod["metadata"]["name"]] = canary.evidence_by_version(text).get(version, canary.Evidence())
    return found


def window(now: Mapping[str, canary.Evidence], start: Mapping[str, canary.Evidence]) -> canary.Evidence:
    """What the pods served since `start`: a pod that was not there then, or whose counters went
    back (it restarted), counts from zero."""
    total = canary.Evidence()
    for pod, evidence in now.items():
        before = start.get(pod)
        if before is not None and evidence.requests >= before.requests:
            evidence = evidence.since(before)
        total = canary.Evidence(total.requests + evidence.requests, total.errors + evidence.errors,
                                total.latency_seconds_sum + evidence.latency_seconds_sum)
    return total


@dataclasses.dataclass(frozen=True)
class Analysis:
    stable_version: str
    canary_version: str
    decision: canary.Decision
    waited_seconds: float

    def record(self) -> dict:
        """The decision and its numbers, as the rollout step prints and outputs them."""
        record = self.decision.as_record()
        return {**record, "stable": {"version": self.stable_version, **record["stable"]},
                "canary": {"version": self.canary_version, **record["canary"]},
                "waitedSeconds": round(self.waited_seconds, 1)}


def analyse(cluster: RolloutApi, namespace: str, model_name: str, policy: canary.Policy,
            max_wait_seconds: float, version: str | None = None, timing: Timing = Timing(),
            say: Callable[[str], None] = print) -> Analysis | None:
    """Waits until the canary has answered policy.min_requests requests (since it started) or
    `max_wait_seconds` have passed, then decides on the canary's and the stable version's evidence
    (the stable version's since this call began). None when there is no canary (of `version`); raises
    NotFound when the canary is gone yet the route sends it requests, or is deleted while it is judged."""
    name = canary_name(model_name)
    current = cluster.get_inference_service(namespace, name)
    if current is None and routes_to_canary(cluster, namespace, model_name):
        raise NotFound(f"InferenceService {namespace}/{name} does not exist, yet the route sends it requests")
    if current is None or (version is not None and model_version(current) != version):
        return None
    stable = cluster.get_inference_service(namespace, model_name)
    if stable is None:
        raise RolloutFailed(f"a canary but no stable InferenceService {namespace}/{model_name}")
    started, stable_start = timing.clock(), scrape(cluster, namespace, stable)
    say(f"rollout: judging version {model_version(current)} against {model_version(stable)}: "
        f"until {policy.min_requests} canary requests or {max_wait_seconds:g} s")
    while True:
        canary_evidence = window(scrape(cluster, namespace, current), {})
        stable_evidence = window(scrape(cluster, namespace, stable), stable_start)
        waited = timing.clock() - started
        if canary_evidence.requests >= policy.min_requests or waited >= max_wait_seconds:
            decision = canary.decide(stable_evidence, canary_evidence, policy)
            return Analysis(model_version(stable), model_version(current), decision, waited)
        timing.sleep(min(timing.poll_seconds, max(max_wait_seconds - waited, 0.0)))
        if cluster.get_inference_service(namespace, name) is None:
            raise NotFound(f"InferenceService {namespace}/{name} was deleted while it was judged")


# --- Command line -----------------------------------------------------------------------------------

def manifest_arg(text: str) -> dict:
    try:
        manifest = json.loads(text)
        manifest["metadata"]["name"], storage_uri(manifest)
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise argparse.ArgumentTypeError(
            f"not an InferenceService manifest with a storage URI ({type(error).__name__}: {error})"
        ) from None
    return manifest


percent = cli.checked("percent", int, lambda value: 0 <= value <= 99, "a whole percentage from 0 to 99")
ratio = cli.checked("ratio", float, lambda value: value >= 1, "a number >= 1")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="cluster_steps.release", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=cli.OneLineParser)
    helps = {"deploy": "the serve step: a version becomes the stable version or the canary",
             "analyse": "wait for evidence and print the decision, changing nothing",
             "decide": "the rollout step: analyse, then promote or roll back",
             "promote": "the canary becomes the stable version, by hand",
             "rollback": "the canary is removed, by hand"}
    sub = {name: commands.add_parser(name, help=text, description=text) for name, text in helps.items()}
    for command in sub.values():
        command.add_argument("--namespace", required=True)
    sub["deploy"].add_argument(MANIFEST_FLAG, type=manifest_arg, required=True,
                               help="the stable InferenceService of the version, as JSON")
    sub["deploy"].add_argument("--canary-percent", type=percent, default=DEFAULT_CANARY_PERCENT,
                               help="share of requests for a new version; 0: it becomes stable at once")
    sub["deploy"].add_argument("--version-file", type=Path,
                               help="where to write the version deployed (the step's output)")
    for name in ("analyse", "decide", "promote", "rollback"):
        sub[name].add_argument("--model-name", required=True)
    for name in ("analyse", "decide"):
        command = sub[name]
        command.add_argument("--version", help="judge the canary only if it serves this version")
        command.add_argument("--min-requests", type=cli.positive_int, default=DEFAULT_MIN_REQUESTS)
        command.add_argument("--max-wait-seconds", type=cli.positive_float, default=DEFAULT_MAX_WAIT_SECONDS)
        command.add_argument("--max-error-rate-increase", type=cli.fraction,
                             default=DEFAULT_MAX_ERROR_RATE_INCREASE)
        command.add_argument("--max-latency-ratio", type=ratio, default=DEFAULT_MAX_LATENCY_RATIO)
        command.add_argument("--decision-file", type=Path, help="where to write the decision as JSON")
    for name in ("deploy", "decide", "promote"):
        sub[name].add_argument("--timeout-seconds", type=cli.positive_float, default=DEFAULT_TIMEOUT_SECONDS,
                               help="longest wait for one InferenceService to roll out")
    return parser.parse_args(argv)


def policy_of(args: argparse.Namespace) -> canary.Policy:
    return canary.Policy(min_requests=args.min_requests, max_error_rate_increase=args.max_error_rate_increase,
                         max_latency_ratio=args.max_latency_ratio)


def run_command(cluster: RolloutApi, args: argparse.Namespace, timing: Timing = Timing(),
                say: Callable[[str], None] = print) -> None:
    namespace = args.namespace
    if args.command == "deploy":
        done = deploy(cluster, namespace, args.manifest, args.canary_percent, args.timeout_seconds,
                      timing, say)
        say(f"rollout: {done}")
        if args.version_file:
            args.version_file.write_text(model_version(args.manifest))
        return
    if args.command == "promote":
        say(f"rollout: {promote(cluster, namespace, args.model_name, args.timeout_seconds, timing, say)}")
        return
    if args.command == "rollback":
        say(f"rollout: {rollback(cluster, namespace, args.model_name, say, timing)}")
        return
    try:
        analysis = analyse(cluster, namespace, args.model_name, policy_of(args), args.max_wait_seconds,
                           args.version, Timing(EVIDENCE_POLL_SECONDS, timing.clock, timing.sleep), say)
    except NotFound as gone:
        if args.command == "analyse":  # changes nothing
            raise
        raise canary_gone(cluster, namespace, args.model_name, str(gone), say) from None
    if analysis is None:
        of_version = f" of version {args.version}" if args.version else ""
        record = {"decision": "none", "reason": f"no canary{of_version} in {namespace}: nothing to decide"}
    else:
        record = analysis.record()
    say(f"rollout: decision: {json.dumps(record, sort_keys=True)}")
    if args.decision_file:
        args.decision_file.write_text(json.dumps(record, sort_keys=True))
    if analysis is None or args.command == "analyse":
        return
    if analysis.decision.promote:
        say(f"rollout: {promote(cluster, namespace, args.model_name, args.timeout_seconds, timing, say)}")
    else:
        say(f"rollout: {rollback(cluster, namespace, args.model_name, say, timing)}")


def numbered_version(isvc: dict | None) -> int | None:
    """The version an InferenceService serves (None: no InferenceService, or one naming no version)."""
    return int(model_version(isvc)) if isvc and model_version(isvc).isdigit() else None


def track_rollout(cluster: RolloutApi, namespace: str, model_name: str, tracked: tracking.Tracking) -> None:
    """MLflow's aliases moved to what is served now (trainer.tracking), when the step tracks: the stable
    InferenceService's version, in the repository its storage URI names, and the canary's."""
    if not tracked.on:
        return
    stable = cluster.get_inference_service(namespace, model_name)
    if (stable_version := numbered_version(stable)) is not None:
        canary_version = numbered_version(cluster.get_inference_service(namespace, canary_name(model_name)))
        tracking.follow_rollout(tracked, model_name, tracking.repository_of(storage_uri(stable)),
                                stable_version, canary_version)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        cluster = ReleaseApi()
        run_command(cluster, args)
        model_name = args.manifest["metadata"]["name"] if args.command == "deploy" else args.model_name
        track_rollout(cluster, args.namespace, model_name, tracking.Tracking.from_environment("rollout"))
    except (ClusterStepError, ShapeError) as error:
        raise step_exit(f"rollout: {args.command}", error) from None


if __name__ == "__main__":
    cli.run("cluster_steps.release", main)
