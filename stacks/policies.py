"""Policies over the Kubernetes objects a stack declares, as plain functions of the rendered objects
(each returns its violations), so that a CrossGuard policy pack can call them later.

Pods hide in many places: Deployments, TFJob replica templates, training runtimes' replicated jobs,
Argo container templates, the TrainJobs and TFJobs the train steps create (a TrainJob's `trainer` is its
node containers' image and resources), the InferenceService the serve step rolls out, predictors.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Sequence

import yaml

from cluster_steps.names import MANIFEST_FLAG as ROLLOUT_MANIFEST_FLAG

PRIVILEGED_ROLES = ("cluster-admin",)


def _walk(node: Any, where: str) -> Iterator[tuple[str, dict]]:
    """Every mapping under `node` with its path, descending into Argo's embedded manifests (resource
    templates' and the serve step's)."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            if key == "manifest" and isinstance(value, str):
                yield from _walk(yaml.safe_load(value), f"{where}.manifest")
            elif key == "args" and isinstance(value, list) and ROLLOUT_MANIFEST_FLAG in value:
                manifest = value[value.index(ROLLOUT_MANIFEST_FLAG) + 1]
                yield from _walk(json.loads(manifest), f"{where}.args.manifest")
            else:
                yield from _walk(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{where}[{index}]")


def name_of(manifest: dict) -> str:
    return f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"


def containers(manifest: dict) -> Iterator[tuple[str, dict]]:
    """(path, container) for every container, for KServe's built-in predictor `model`, and for a
    TrainJob's `trainer` (its image and resourcesPerNode go into its runtime's node containers)."""
    for where, node in _walk(manifest, name_of(manifest)):
        for key in ("containers", "initContainers"):
            for index, container in enumerate(node.get(key) or []):
                yield f"{where}.{key}[{index}]", container
        if isinstance(node.get("trainer"), dict) and "image" in node["trainer"]:
            trainer = node["trainer"]
            yield f"{where}.trainer", {"image": trainer["image"],
                                       "resources": trainer.get("resourcesPerNode")}
        if isinstance(node.get("container"), dict):
            yield f"{where}.container", node["container"]
        if isinstance(node.get("model"), dict) and "modelFormat" in node["model"]:
            yield f"{where}.model", node["model"]


def no_cluster_admin(objects: Sequence[dict]) -> list[str]:
    return [f"{name_of(o)} binds {o['roleRef']['name']}" for o in objects
            if o.get("kind") in ("RoleBinding", "ClusterRoleBinding")
            and o.get("roleRef", {}).get("name") in PRIVILEGED_ROLES]


def requests_and_limits(objects: Sequence[dict]) -> list[str]:
    violations = []
    for manifest in objects:
        for where, container in containers(manifest):
            resources = container.get("resources") or {}
            for kind in ("requests", "limits"):
                missing = [r for r in ("cpu", "memory") if r not in (resources.get(kind) or {})]
                if missing:
                    violations.append(f"{where}: no {kind} for {', '.join(missing)}")
    return violations


def pinned_images(objects: Sequence[dict]) -> list[str]:
    violations = []
    for manifest in objects:
        for where, container in containers(manifest):
            image = container.get("image")
            if image is None:
                continue
            name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
            if "@sha256:" not in image and tag in ("", "latest"):
                violations.append(f"{where}: image {image} is not pinned (no tag, or latest)")
    return violations


def secret_outputs(required: Sequence[str], secret: set[str]) -> list[str]:
    return [f"stack output {name} is not secret" for name in required if name not in secret]


OBJECT_POLICIES = (no_cluster_admin, requests_and_limits, pinned_images)


def violations(objects: Sequence[dict]) -> list[str]:
    return [violation for policy in OBJECT_POLICIES for violation in policy(objects)]


# Google Cloud resources, as declared (type token and inputs, camelCase as Pulumi sends them).
BUCKET = "gcp:storage/bucket:Bucket"
SERVICE_ACCOUNT_KEY = "gcp:serviceaccount/key:Key"


def private_buckets(resources: Sequence) -> list[str]:
    """Every bucket: public access prevention enforced, uniform bucket-level access, versioning."""
    violations = []
    for bucket in (r for r in resources if r.type == BUCKET):
        inputs = bucket.inputs
        if inputs.get("publicAccessPrevention") != "enforced":
            violations.append(f"bucket {bucket.name}: public access prevention is not enforced")
        if inputs.get("uniformBucketLevelAccess") is not True:
            violations.append(f"bucket {bucket.name}: uniform bucket-level access is off")
        if (inputs.get("versioning") or {}).get("enabled") is not True:
            violations.append(f"bucket {bucket.name}: versioning is off")
    return violations


def no_service_account_keys(resources: Sequence) -> list[str]:
    return [f"{r.name}: a service account key; use Workload Identity" for r in resources
            if r.type == SERVICE_ACCOUNT_KEY]


CLOUD_POLICIES = (private_buckets, no_service_account_keys)


def cloud_violations(resources: Sequence) -> list[str]:
    return [violation for policy in CLOUD_POLICIES for violation in policy(resources)]
