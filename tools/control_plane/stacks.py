"""The stacks' Kubernetes objects as `pulumi up` would create them on the tier: rendered under Pulumi's
mocks (stacks.render), in the program's dependency order (each after what it depends on and after
its parent component), as server-side applies.

Some kinds are served by what the tier does not run; their objects are left out, each kind with the
reason, and every other kind must be one the API server serves.
"""

from __future__ import annotations

import graphlib
import json

from kubernetes.dynamic.exceptions import ResourceNotFoundError

from stacks import render
from stacks.declared import kubernetes_objects
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


def local_stack(**sections: dict) -> tuple[render.Rendered, str]:
    """Pulumi.local.yaml rendered (each of its sections named in `sections`, `pipeline=...`,
    `serving=...`, updated with the keys given, as a user edits it), and its k3d cluster's name (whose
    node the tier simulates)."""
    from stacks.config import from_pulumi_values, parse_stack_config

    values = render.pulumi_values(ROOT / "Pulumi.local.yaml")
    for section, changes in sections.items():
        key = f"dist-ml:{section}"
        values[key] = json.dumps({**json.loads(values[key]), **changes})
    return render.render("local", values), parse_stack_config(from_pulumi_values(values)).cluster.name


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
