"""Kubernetes identities: a service account per actor, and a Role bound to one account."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from common.cluster_target import PART_OF


def service_account(resource_name: str, account: str, namespace: str,
                    annotations: dict[str, pulumi.Input[str]],
                    opts: pulumi.ResourceOptions) -> k8s.core.v1.ServiceAccount:
    """An account with no rights of its own; `annotations` may bind it to a cloud identity."""
    return k8s.core.v1.ServiceAccount(
        resource_name,
        metadata={"name": account, "namespace": namespace, "labels": PART_OF, "annotations": annotations},
        opts=opts)


def bound_role(resource_name: str, name: str, namespace: str, rules: list[dict], subject_namespace: str,
               subject_account: str, opts: pulumi.ResourceOptions) -> k8s.rbac.v1.RoleBinding:
    """A Role in `namespace` with `rules`, bound to one service account (of any namespace)."""
    metadata = {"name": name, "namespace": namespace, "labels": PART_OF}
    role = k8s.rbac.v1.Role(f"{resource_name}-role", metadata=metadata, rules=rules, opts=opts)
    return k8s.rbac.v1.RoleBinding(
        f"{resource_name}-role-binding", metadata=metadata,
        role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        subjects=[{"kind": "ServiceAccount", "name": subject_account, "namespace": subject_namespace}],
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[role])))
