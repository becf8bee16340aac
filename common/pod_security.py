"""The Pod Security Standard every pod of ours meets, `restricted`
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), in one home: the security
contexts the stacks, the workflow's steps, the training engines and the predictor give their pods and
containers, and the namespace labels by which the API server's PodSecurity admission enforces it.
Standard library only, so that every floor may import it.

No context names a user: the image's USER runs (uid 1000 in ours, common.cluster_target.IMAGE_USER),
and runAsNonRoot makes the kubelet refuse an image that would run as root rather than remap it.
"""

from __future__ import annotations

import re

LEVEL = "restricted"
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
# What the API server says when PodSecurity refuses a pod (k8s.io/pod-security-admission
# admission/admission.go, v1.33): `violates PodSecurity "restricted:v1.33": ...`.
REFUSAL = f'violates PodSecurity "{LEVEL}:'
KUBERNETES_MINOR = re.compile(r"^1\.[0-9]+$")
RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}


def container_security_context() -> dict:
    """What `restricted` asks of every container, init containers and sidecars included. runAsNonRoot
    and the seccomp profile are the pod's too: a container an operator copies this from (KServe's
    agent, from the predictor's) keeps them wherever it lands."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP),
    }


def pod_security_context(fs_group: int | None = None) -> dict:
    """What `restricted` asks of a pod, and `fs_group` (the images' user) where the pod writes to a
    volume that the kubelet must make its group's."""
    context: dict = {"runAsNonRoot": True, "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP)}
    if fs_group is not None:
        context["fsGroup"] = fs_group
    return context


def enforcing_labels(kubernetes_version: str) -> dict[str, str]:
    """The labels of a namespace whose pods must meet `restricted`, on a cluster of
    `kubernetes_version` (`1.33`). The version is pinned to the cluster's minor, as Kubernetes advises
    (docs "Enforce Pod Security Standards with Namespace Labels"), rather than `latest`: a cluster
    upgrade then never tightens the rules under running workloads; a stack's version bump does."""
    if not KUBERNETES_MINOR.fullmatch(kubernetes_version):
        raise ValueError(f"kubernetes version {kubernetes_version!r}: expected a minor like 1.33")
    return {ENFORCE_LABEL: LEVEL, ENFORCE_VERSION_LABEL: f"v{kubernetes_version}"}
