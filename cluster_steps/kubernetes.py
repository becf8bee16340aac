"""The cluster steps' side of the Kubernetes API: the client set up as the pod's service account (or
the local kubeconfig outside a pod), each step's calls on it, and the client's 409 and 404 made this
package's Conflict and NotFound, so that the steps' logic never sees the client's types. Also what
both steps read of pods, and how they poll.

The kubernetes client is used directly: the kserve SDK's create/replace take its model classes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from typing import Any, Callable

from common.cluster_names import HTTP_ROUTE, INFERENCE_SERVICE, CustomResource

POLL_SECONDS = 5.0
HTTP_CONFLICT, HTTP_NOT_FOUND = 409, 404
# What the API server's pod proxy answers for a pod that is going away or not answering (gone,
# bad gateway, unavailable, gateway timeout): skipped for that look, not a failed rollout.
UNREADABLE_POD_STATUSES = (404, 502, 503, 504)
# A container waiting for one of these will not start by itself: the rollout has failed.
FATAL_WAITING_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                         "CreateContainerConfigError", "CreateContainerError")


class ClusterStepError(RuntimeError):
    """A cluster step cannot go on; the message says why, in one line."""


class Conflict(ClusterStepError):
    """HTTP 409: the object changed since it was read (its resourceVersion moved on), or a create found
    it already there. Reading it again and retrying resolves it; the message names the object."""


class NotFound(ClusterStepError):
    """HTTP 404: the object is not there (someone deleted it); the message names the object."""


@dataclasses.dataclass(frozen=True)
class Timing:
    """How a wait polls and reads the time (tests pass a fake clock)."""
    poll_seconds: float = POLL_SECONDS
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def pod_failure(pod: dict) -> str | None:
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in FATAL_WAITING_REASONS:
                last = (container.get("lastState") or {}).get("terminated") or {}
                detail = (waiting.get("message") or last.get("message") or "").strip()
                # A crash loop's message is the back-off; why the last run ended (OOMKilled, its exit
                # code) is the kubelet's answer to what went wrong.
                ended = (f" (last run: {last.get('reason') or 'ended'}, exit code {last['exitCode']})"
                         if "exitCode" in last else "")
                return (f"pod {pod['metadata']['name']}: container {container['name']}: "
                        f"{waiting['reason']}{': ' + detail if detail else ''}{ended}")
    return None


class KubernetesApi:
    """The API as the pod's own service account (or the local kubeconfig outside a pod) reaches it,
    with the client's errors the cluster steps handle made theirs."""

    def __init__(self) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            try:
                config.load_kube_config()
            except (config.ConfigException, FileNotFoundError) as error:
                raise ClusterStepError(
                    f"no cluster to reach: not in a pod, and no kubeconfig ({error})") from None
        self._api = client.ApiClient()
        self._objects = client.CustomObjectsApi(self._api)
        self._apps = client.AppsV1Api(self._api)
        self._core = client.CoreV1Api(self._api)
        self._api_error = client.ApiException

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        """Makes the API call; a 409 or a 404 becomes Conflict or NotFound naming `what`, so that the
        rollout's logic never sees the client's exception type. Any other error is not the logic's to
        handle (a missing right is the operator's to fix): it goes through as it is."""
        try:
            return call()
        except self._api_error as error:
            if error.status == HTTP_CONFLICT:
                raise Conflict(f"{what}: {server_message(error)}") from None
            if error.status == HTTP_NOT_FOUND:
                raise NotFound(f"{what}: {server_message(error)}") from None
            raise

    def _or_none(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return self._call(what, call)
        except NotFound:
            return None

    def list_pods(self, namespace: str, label_selector: str) -> list[dict]:
        pods = self._core.list_namespaced_pod(namespace, label_selector=label_selector)
        return self._api.sanitize_for_serialization(pods)["items"]

    def list_warnings(self, namespace: str) -> list[dict]:
        """The namespace's warning events (core/v1, which also shows those written as events.k8s.io)."""
        events = self._core.list_namespaced_event(namespace, field_selector="type=Warning")
        return self._api.sanitize_for_serialization(events)["items"]

    # One custom resource's calls, with the kind and name in any error: each step's adapter below
    # names the resources and calls it makes.
    def _get_custom(self, resource: CustomResource, namespace: str, name: str) -> dict | None:
        return self._or_none(resource.what(namespace, name),
                             lambda: self._objects.get_namespaced_custom_object(
                                 resource.group, resource.version, namespace, resource.plural, name))

    def _create_custom(self, resource: CustomResource, namespace: str, manifest: dict) -> None:
        self._call(resource.what(namespace, manifest["metadata"]["name"]),
                   lambda: self._objects.create_namespaced_custom_object(
                       resource.group, resource.version, namespace, resource.plural, manifest))

    def _replace_custom(self, resource: CustomResource, namespace: str, name: str, manifest: dict) -> None:
        self._call(resource.what(namespace, name), lambda: self._objects.replace_namespaced_custom_object(
            resource.group, resource.version, namespace, resource.plural, name, manifest))

    def _delete_custom(self, resource: CustomResource, namespace: str, name: str, **options: str) -> None:
        self._call(resource.what(namespace, name), lambda: self._objects.delete_namespaced_custom_object(
            resource.group, resource.version, namespace, resource.plural, name, **options))


class ReleaseApi(KubernetesApi):
    """cluster_steps.release's RolloutApi: InferenceServices, the route, the predictor's Deployment,
    pods and their /metrics."""

    def get_inference_service(self, namespace: str, name: str) -> dict | None:
        return self._get_custom(INFERENCE_SERVICE, namespace, name)

    def create_inference_service(self, namespace: str, manifest: dict) -> None:
        self._create_custom(INFERENCE_SERVICE, namespace, manifest)

    def replace_inference_service(self, namespace: str, name: str, manifest: dict) -> None:
        self._replace_custom(INFERENCE_SERVICE, namespace, name, manifest)

    def delete_inference_service(self, namespace: str, name: str) -> None:
        self._delete_custom(INFERENCE_SERVICE, namespace, name)

    def get_http_route(self, namespace: str, name: str) -> dict | None:
        return self._get_custom(HTTP_ROUTE, namespace, name)

    def create_http_route(self, namespace: str, manifest: dict) -> None:
        self._create_custom(HTTP_ROUTE, namespace, manifest)

    def replace_http_route(self, namespace: str, name: str, manifest: dict) -> None:
        self._replace_custom(HTTP_ROUTE, namespace, name, manifest)

    def get_deployment(self, namespace: str, name: str) -> dict | None:
        deployment = self._or_none(f"Deployment {namespace}/{name}",
                                   lambda: self._apps.read_namespaced_deployment(name, namespace))
        return None if deployment is None else self._api.sanitize_for_serialization(deployment)

    def pod_metrics(self, namespace: str, pod: str, port: int) -> str | None:
        try:
            return self._core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod}:{port}", namespace, "metrics")
        except self._api_error as error:
            if error.status in UNREADABLE_POD_STATUSES:
                return None
            raise


def server_message(error: Any) -> str:
    """What the API server said (its Status object's message), else the HTTP status and reason."""
    try:
        return str(json.loads(error.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"HTTP {error.status} {error.reason}"


class TrainApi(KubernetesApi):
    """cluster_steps.train's API (engines.base.JobApi): the step's job, its pods, what its engine reads
    beside them (Kueue's Workload for a TrainJob), and the namespace's warning events."""

    def get_job(self, resource: CustomResource, namespace: str, name: str) -> dict | None:
        return self._get_custom(resource, namespace, name)

    def create_job(self, resource: CustomResource, namespace: str, manifest: dict) -> None:
        self._create_custom(resource, namespace, manifest)

    def delete_job(self, resource: CustomResource, namespace: str, name: str) -> None:
        """Deletes the job and, before it is gone, its pods (foreground); one already gone is fine."""
        with contextlib.suppress(NotFound):
            self._delete_custom(resource, namespace, name, propagation_policy="Foreground")

    def list_objects(self, resource: CustomResource, namespace: str, label_selector: str) -> list[dict]:
        found = self._objects.list_namespaced_custom_object(
            resource.group, resource.version, namespace, resource.plural, label_selector=label_selector)
        return found["items"]
