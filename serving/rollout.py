"""Roll an InferenceService out to one model version, and wait until every replica serves it.

    python -m serving.rollout --namespace NS --manifest JSON [--timeout-seconds 900]

The pipeline's serve step on a cluster runs this with the InferenceService of the version that the
run just published (its storageUri names that version, so every run changes the predictor's pods).
It creates or replaces the InferenceService, then succeeds only when the predictor's Deployment has
rolled out completely to pods of that version, and fails with the reason (a pod that cannot pull its
image, a storage initializer or server that crashes, a rollout past its deadline) or at the timeout.

KServe's own status cannot say which version is live in Standard mode: the InferenceService stays
Ready through a rolling update, and its observedGeneration is copied from the Deployment. So this
checks the Deployment as `kubectl rollout status` does, and that its pod template names the storage
URI. The kubernetes client is used directly: the kserve SDK's create/replace take its model classes,
and its readiness check relies on that observedGeneration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any, Callable, Iterator, Protocol, Sequence

from common import cli

ISVC_GROUP, ISVC_VERSION, ISVC_PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe labels the predictor's pods with it
# Every API call a rollout makes, as (API group, resource, verb): what its service account needs.
API_CALLS = (
    (ISVC_GROUP, ISVC_PLURAL, "get"), (ISVC_GROUP, ISVC_PLURAL, "create"),
    (ISVC_GROUP, ISVC_PLURAL, "update"),
    ("apps", "deployments", "get"),
    ("", "pods", "list"),
)
DEFAULT_TIMEOUT_SECONDS = 900.0  # an image pull, the storage initializer's copy and a model load
POLL_SECONDS = 5.0
MANIFEST_FLAG = "--manifest"  # the InferenceService, as JSON (the pipeline's serve step passes it)
# A container waiting for one of these will not start by itself: the rollout has failed.
FATAL_WAITING_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                         "CreateContainerConfigError", "CreateContainerError")


class RolloutError(RuntimeError):
    """The version did not roll out; the message says why."""


class Cluster(Protocol):
    """The few API calls a rollout makes (plain dicts, as the API server sends them)."""

    def get_inference_service(self, namespace: str, name: str) -> dict | None: ...
    def create_inference_service(self, namespace: str, manifest: dict) -> None: ...
    def replace_inference_service(self, namespace: str, name: str, manifest: dict) -> None: ...
    def get_deployment(self, namespace: str, name: str) -> dict | None: ...
    def list_pods(self, namespace: str, label_selector: str) -> list[dict]: ...


@dataclasses.dataclass(frozen=True)
class Observation:
    done: bool
    reason: str  # why it is not done yet, or what it reached


def predictor_deployment_name(isvc_name: str) -> str:
    return f"{isvc_name}-predictor"  # KServe's name in Standard mode


def storage_uri(manifest: dict) -> str:
    predictor = manifest["spec"]["predictor"]
    if "model" in predictor:
        return predictor["model"]["storageUri"]
    env = {item["name"]: item.get("value") for item in predictor["containers"][0].get("env", [])}
    return env["STORAGE_URI"]


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


def pod_failure(pod: dict) -> str | None:
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in FATAL_WAITING_REASONS:
                last = ((container.get("lastState") or {}).get("terminated") or {}).get("message")
                detail = waiting.get("message") or last or ""
                return (f"pod {pod['metadata']['name']}: container {container['name']}: "
                        f"{waiting['reason']}{': ' + detail.strip() if detail.strip() else ''}")
    return None


def observe(deployment: dict | None, pods: Sequence[dict], uri: str) -> Observation:
    """Where the rollout to `uri` stands; raises RolloutError when it cannot finish by itself."""
    for pod in pods:
        if names_uri(pod, uri):
            failure = pod_failure(pod)
            if failure:
                raise RolloutError(failure)
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
            raise RolloutError(f"Deployment {metadata['name']}: {message}")
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


def apply(cluster: Cluster, namespace: str, manifest: dict) -> None:
    """Creates the InferenceService, or replaces its spec with this one."""
    name = manifest["metadata"]["name"]
    current = cluster.get_inference_service(namespace, name)
    if current is None:
        cluster.create_inference_service(namespace, manifest)
        return
    metadata = {**manifest["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
    cluster.replace_inference_service(namespace, name, {**manifest, "metadata": metadata})


def roll_out(cluster: Cluster, namespace: str, manifest: dict, timeout_seconds: float,
             poll_seconds: float = POLL_SECONDS, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep, say: Callable[[str], None] = print) -> str:
    """Applies `manifest` and waits for its version; returns the final state or raises RolloutError."""
    name, uri = manifest["metadata"]["name"], storage_uri(manifest)
    apply(cluster, namespace, manifest)
    say(f"rollout: applied InferenceService {namespace}/{name} with {uri}")
    deadline, last = clock() + timeout_seconds, None
    while True:
        deployment = cluster.get_deployment(namespace, predictor_deployment_name(name))
        pods = cluster.list_pods(namespace, f"{ISVC_LABEL}={name}")
        state = observe(deployment, pods, uri)
        if state.done:
            return state.reason
        if state.reason != last:
            say(f"rollout: waiting: {state.reason}")
            last = state.reason
        if clock() >= deadline:
            raise RolloutError(f"not rolled out after {timeout_seconds:g} s: {state.reason}")
        sleep(poll_seconds)


class KubernetesCluster:
    """The Cluster of the pod's own service account (or the local kubeconfig outside a pod)."""

    def __init__(self) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self._api = client.ApiClient()
        self._objects = client.CustomObjectsApi(self._api)
        self._apps = client.AppsV1Api(self._api)
        self._core = client.CoreV1Api(self._api)
        self._not_found = client.ApiException

    def _or_none(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self._not_found as error:
            if error.status == 404:
                return None
            raise

    def get_inference_service(self, namespace: str, name: str) -> dict | None:
        return self._or_none(lambda: self._objects.get_namespaced_custom_object(
            ISVC_GROUP, ISVC_VERSION, namespace, ISVC_PLURAL, name))

    def create_inference_service(self, namespace: str, manifest: dict) -> None:
        self._objects.create_namespaced_custom_object(
            ISVC_GROUP, ISVC_VERSION, namespace, ISVC_PLURAL, manifest)

    def replace_inference_service(self, namespace: str, name: str, manifest: dict) -> None:
        self._objects.replace_namespaced_custom_object(
            ISVC_GROUP, ISVC_VERSION, namespace, ISVC_PLURAL, name, manifest)

    def get_deployment(self, namespace: str, name: str) -> dict | None:
        deployment = self._or_none(lambda: self._apps.read_namespaced_deployment(name, namespace))
        return None if deployment is None else self._api.sanitize_for_serialization(deployment)

    def list_pods(self, namespace: str, label_selector: str) -> list[dict]:
        pods = self._core.list_namespaced_pod(namespace, label_selector=label_selector)
        return self._api.sanitize_for_serialization(pods)["items"]


def manifest_arg(text: str) -> dict:
    try:
        manifest = json.loads(text)
        manifest["metadata"]["name"], storage_uri(manifest)
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise argparse.ArgumentTypeError(
            f"not an InferenceService manifest with a storage URI ({type(error).__name__}: {error})"
        ) from None
    return manifest


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="serving.rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument(MANIFEST_FLAG, type=manifest_arg, required=True, help="the InferenceService, as JSON")
    parser.add_argument("--timeout-seconds", type=cli.positive_float, default=DEFAULT_TIMEOUT_SECONDS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        reached = roll_out(KubernetesCluster(), args.namespace, args.manifest, args.timeout_seconds)
    except RolloutError as error:
        raise SystemExit(f"rollout: {storage_uri(args.manifest)}: {error}") from None
    print(f"rollout: {storage_uri(args.manifest)} is live: {reached}")


if __name__ == "__main__":
    cli.run("serving.rollout", main)
