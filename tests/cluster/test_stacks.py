"""Both stacks' Kubernetes objects, as `pulumi up` would apply them (server-side, in the program's
dependency order), accepted by the real API server and the webhooks of the controllers the stacks
install: namespaces, RBAC, our ClusterTrainingRuntimes, Kueue's flavor and queues, the
WorkflowTemplate, the serving pieces."""

from __future__ import annotations

from tools.control_plane import stacks


def test_the_local_stacks_objects_are_all_accepted_and_stored(tier, rendered, local_stack_objects):
    _, unserved = stacks.served(tier.api, stacks.in_dependency_order(rendered))
    assert unserved <= set(stacks.UNSERVED_KINDS), unserved
    kinds = {obj["kind"] for obj in local_stack_objects}
    assert {
        "ClusterTrainingRuntime",
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
        "WorkflowTemplate",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "Namespace",
    } <= kinds
    for manifest in local_stack_objects:
        metadata = manifest["metadata"]
        assert (
            tier.api.get(
                manifest["apiVersion"], manifest["kind"], metadata["name"], metadata.get("namespace")
            )
            is not None
        ), manifest["kind"]


def test_the_gke_stacks_objects_are_accepted_by_the_api_server_and_every_webhook(tier, local_stack_objects):
    """Applied with dryRun=All (admission runs, webhooks included, nothing is stored), over the local
    stack's objects of the same names; the namespaces it adds are created first, for real."""
    rendered = stacks.gke_stack()
    objects, unserved = stacks.served(tier.api, stacks.in_dependency_order(rendered))
    assert unserved <= set(stacks.UNSERVED_KINDS), unserved
    tier.api.apply_all(obj for obj in objects if obj["kind"] == "Namespace")
    tier.api.apply_all((obj for obj in objects if obj["kind"] != "Namespace"), dry_run=True)
    assert {"ClusterTrainingRuntime", "ResourceFlavor", "WorkflowTemplate"} <= {
        obj["kind"] for obj in objects
    }
