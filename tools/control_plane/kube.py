"""The tier's client of its API server: server-side apply (as Pulumi's provider and `kubectl apply
--server-side` do), reads and waits, on plain dicts, for any kind the server serves."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable

from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

FIELD_MANAGER = "dist-ml-tier"
ESTABLISHED_TIMEOUT_SECONDS = 60.0


class Refused(RuntimeError):
    """The API server (or a webhook it called) refused an object; the message is the server's."""

    def __init__(self, manifest: dict, status: int, message: str):
        self.status, self.message = status, message
        super().__init__(f"{what(manifest)}: HTTP {status}: {message}")


def what(manifest: dict) -> str:
    metadata = manifest.get("metadata") or {}
    namespace = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
    return f"{manifest.get('kind')} {namespace}{metadata.get('name')}"


def server_message(error: ApiException) -> str:
    import json

    try:
        return str(json.loads(error.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"{error.reason}"


class Api:
    def __init__(self, kubeconfig: Path):
        self.api_client = config.new_client_from_config(str(kubeconfig))
        self.dynamic = dynamic.DynamicClient(self.api_client)
        self.core = client.CoreV1Api(self.api_client)

    def resource(self, api_version: str, kind: str):
        try:
            return self.dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            self.dynamic.resources.invalidate_cache()  # a CRD established since the last discovery
            return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def apply(self, manifest: dict, dry_run: bool = False) -> dict:
        """Server-side apply of `manifest` (forcing conflicts, as Pulumi's provider does); Refused with
        the server's message when the API server or a webhook refuses it."""
        resource = self.resource(manifest["apiVersion"], manifest["kind"])
        options: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force_conflicts": True}
        if dry_run:
            options["dry_run"] = "All"
        try:
            return self.dynamic.server_side_apply(
                resource,
                body=manifest,
                namespace=(manifest["metadata"].get("namespace") if resource.namespaced else None),
                **options,
            ).to_dict()
        except ApiException as error:
            raise Refused(manifest, error.status, server_message(error)) from None

    def create(self, manifest: dict, dry_run: bool = False) -> dict:
        """POST of `manifest` (a generated name, a review); Refused with the server's message. With
        `dry_run`, admission runs (webhooks included) and nothing is stored."""
        resource = self.resource(manifest["apiVersion"], manifest["kind"])
        namespace = (manifest.get("metadata") or {}).get("namespace") if resource.namespaced else None
        options = {"dry_run": "All"} if dry_run else {}
        try:
            return self.dynamic.create(resource, body=manifest, namespace=namespace, **options).to_dict()
        except ApiException as error:
            raise Refused(manifest, error.status, server_message(error)) from None

    def apply_all(self, manifests: Iterable[dict], dry_run: bool = False) -> None:
        """In order; the CustomResourceDefinitions among them waited for until Established."""
        crds = []
        for manifest in manifests:
            self.apply(manifest, dry_run)
            if manifest["kind"] == "CustomResourceDefinition" and not dry_run:
                crds.append(manifest["metadata"]["name"])
        for name in crds:
            self.wait_established(name)

    def create_all(self, manifests: Iterable[dict]) -> None:
        """`kubectl create` of each, in order, the CustomResourceDefinitions waited for until Established:
        for an install's objects on a new cluster (a server-side apply of a CRD of megabytes costs
        seconds, for its managed fields)."""
        crds = []
        for manifest in manifests:
            self.create(manifest)
            if manifest["kind"] == "CustomResourceDefinition":
                crds.append(manifest["metadata"]["name"])
        for name in crds:
            self.wait_established(name)

    def wait_established(self, name: str) -> None:
        crds = self.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
        deadline = time.monotonic() + ESTABLISHED_TIMEOUT_SECONDS
        while not any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crds.get(name=name).to_dict().get("status") or {}).get("conditions") or []
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"CustomResourceDefinition {name}: not Established after "
                    f"{ESTABLISHED_TIMEOUT_SECONDS:g} s"
                )
            time.sleep(0.1)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        try:
            return self.resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None = None, **selectors: str) -> list[dict]:
        found = self.resource(api_version, kind).get(namespace=namespace, **selectors).to_dict()
        return found.get("items") or []

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        try:
            self.resource(api_version, kind).delete(name=name, namespace=namespace)
        except ApiException as error:
            if error.status != 404:
                raise

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: dict,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> dict:
        resource = self.resource(api_version, kind)
        if subresource:
            resource = resource.subresources[subresource]
        return self.dynamic.patch(
            resource, body=patch, name=name, namespace=namespace, content_type="application/merge-patch+json"
        ).to_dict()

    def wait(self, check: Callable[[], Any], what: str, timeout: float, poll: float = 0.5) -> Any:
        """Polls `check` until it returns something true, and returns it; TimeoutError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() >= deadline:
                raise TimeoutError(f"not {what} after {timeout:g} s")
            time.sleep(poll)
