"""The stacks' Kubernetes objects as `pulumi up` would create them on the tier: rendered under Pulumi's
mocks (stacks.render), in the program's dependency order (each after what it depends on and after
its parent component), as server-side applies.

Some kinds are served by what the tier does not run; their objects are left out, each kind with the
reason, and every other kind must be one the API server serves.
"""

from __future__ import annotations

import contextlib
import functools
import graphlib
from typing import Iterator

from kubernetes.dynamic.exceptions import ResourceNotFoundError

from stacks import render
from stacks.config import from_pulumi_values, parse_stack_config
from stacks.declared import kubernetes_objects
from stacks.settings import StackConfig
from tools.control_plane.build import ROOT
from tools.control_plane.kube import Api

# Kinds whose API the tier does not serve, and who serves them on the stacks' clusters: judged by
# hand-written checks (tests/test_cluster_contracts.py, tests/test_infra_gke.py).
UNSERVED_KINDS = {
    "HelmChartConfig": "k3s's helm controller (the local stack's Traefik settings)",
    "PodMonitor": "the Prometheus Operator of the monitoring chart",
    "ServiceMonitor": "the Prometheus Operator of the monitoring chart",
    "GCPBackendPolicy": "GKE's Gateway controller",
    "HealthCheckPolicy": "GKE's Gateway controller",
}


# The gke stack's project as a user sets it (Pulumi.gke.yaml has none); its region is the file's.
GKE_PROJECT = "dist-ml-tier-4821"
# What decides where a training pod runs: the objects the tier puts in place of the local stack's to
# judge another stack's placement, and puts back after. (The workflow's account stays the local
# stack's: the tier's tokens are bound to it; both stacks declare it from one program.)
PLACEMENT_KINDS = frozenset({"ResourceFlavor", "ProvisioningRequestConfig", "AdmissionCheck", "ClusterQueue",
                             "LocalQueue", "ClusterTrainingRuntime"})
SWAP_SECONDS = 60.0


def stack_values(stack: str, **sections: dict) -> dict[str, str]:
    """Pulumi.<stack>.yaml's values with `sections` changed (stacks.render.stack_values)."""
    return render.stack_values(ROOT / f"Pulumi.{stack}.yaml", **sections)


@functools.cache
def local_config() -> StackConfig:
    """Pulumi.local.yaml as the stack program reads it: the local stack's names, which the tier and its
    tests use (its namespace, its k3d cluster, whose nodes the tier plays, the workflow's account)."""
    return parse_stack_config(from_pulumi_values(stack_values("local")))


def local_stack() -> render.Rendered:
    """Pulumi.local.yaml rendered."""
    return render.render("local", stack_values("local"))


def gke_stack(**sections: dict) -> render.Rendered:
    """Pulumi.gke.yaml rendered for GKE_PROJECT (with `sections` changed, stack_values)."""
    return render.render("gke", {**stack_values("gke", **sections), "gcp:project": GKE_PROJECT})


def in_dependency_order(rendered: render.Rendered) -> list[dict]:
    """Every Kubernetes object of the render, none before a resource it depends on or its parent."""
    by_name = {resource.name: resource for resource in rendered.resources}
    graph = graphlib.TopologicalSorter()
    for resource in rendered.resources:
        needs = {name for name in resource.depends_on | {resource.parent} if name in by_name}
        graph.add(resource.name, *needs)
    ordered = [by_name[name] for name in graph.static_order()]
    return kubernetes_objects(ordered)


def served(api: Api, objects: list[dict]) -> tuple[list[dict], set[str]]:
    """The objects whose kind the API server serves, and the kinds it does not."""
    kept, unserved = [], set()
    for manifest in objects:
        try:
            api.resource(manifest["apiVersion"], manifest["kind"])
            kept.append(manifest)
        except ResourceNotFoundError:
            unserved.add(manifest["kind"])
    return kept, unserved


@contextlib.contextmanager
def placement_of(api: Api, rendered: render.Rendered, applied: list[dict]) -> Iterator[list[dict]]:
    """The tier with `rendered`'s placement objects (PLACEMENT_KINDS) in place of those of `applied`
    (what the tier has), yielded; after, `applied`'s back. Each swap deletes one set and creates the
    other, so that no field of one is left in the other. The caller deletes its jobs first: Kueue's
    and Trainer's finalizers keep a queue, flavor or runtime that a job still uses."""
    placed = [obj for obj in in_dependency_order(rendered) if obj["kind"] in PLACEMENT_KINDS]
    before = [obj for obj in applied if obj["kind"] in PLACEMENT_KINDS]
    swap(api, before, placed)
    try:
        yield placed
    finally:
        swap(api, placed, before)


def swap(api: Api, gone: list[dict], coming: list[dict]) -> None:
    """Deletes `gone` (in reverse order of creation), waits until the controllers' finalizers let them
    go, and applies `coming`."""
    for obj in reversed(gone):
        api.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
    api.wait(
        lambda: not any(api.get(obj["apiVersion"], obj["kind"], obj["metadata"]["name"],
                                obj["metadata"].get("namespace")) for obj in gone),
        f"{len(gone)} placement objects deleted", SWAP_SECONDS)
    api.apply_all(coming)
