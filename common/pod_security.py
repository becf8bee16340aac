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
# admission/admission.go, v1.35): `violates PodSecurity "restricted:v1.35": ...`.
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
    `kubernetes_version` (`1.35`). The version is pinned to the cluster's minor, as Kubernetes advises
    (docs "Enforce Pod Security Standards with Namespace Labels"), rather than `latest`: a cluster
    upgrade then never tightens the rules under running workloads; a stack's version bump does."""
    if not KUBERNETES_MINOR.fullmatch(kubernetes_version):
        raise ValueError(f"kubernetes version {kubernetes_version!r}: expected a minor like 1.35")
    return {ENFORCE_LABEL: LEVEL, ENFORCE_VERSION_LABEL: f"v{kubernetes_version}"}


# What `restricted` allows beyond its security contexts (the standard's "Volume Types" and
# "Capabilities" rows).
ALLOWED_VOLUME_SOURCES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                    "persistentVolumeClaim", "projected", "secret"})
ALLOWED_ADDED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


def _on_pod_or_each(pod: dict, containers: list[dict], holds) -> bool:
    """`holds(context)` of the pod's security context, or else of every container's."""
    return holds(pod.get("securityContext") or {}) or all(
        holds(container.get("securityContext") or {}) for container in containers)


def violations(pod: dict, containers: dict[str, dict]) -> list[str]:
    """Why a pod (its spec's pod-level fields, and its containers by where they are) does not meet
    `restricted` as this project declares it: the user left to the image (no runAsUser anywhere) and
    runAsNonRoot, the seccomp profile, each container's privilege escalation and capabilities, no host
    namespace, no volume of a type the standard forbids. Empty when it does."""
    found = []
    listed = list(containers.values())
    if not _on_pod_or_each(pod, listed, lambda context: context.get("runAsNonRoot") is True):
        found.append("runAsNonRoot is not true (on the pod, or on every container)")
    if not _on_pod_or_each(pod, listed, lambda context: (context.get("seccompProfile") or {}).get("type")
                           in ("RuntimeDefault", "Localhost")):
        found.append("no seccompProfile RuntimeDefault (on the pod, or on every container)")
    if "runAsUser" in (pod.get("securityContext") or {}):
        found.append("names a user (runAsUser): the image's USER runs")
    found.extend(f"{field} is true" for field in HOST_NAMESPACES if pod.get(field))
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUME_SOURCES:
            found.append(f"volume {volume.get('name')}: {', '.join(sorted(kinds))} is not allowed")
    for where, container in containers.items():
        context = container.get("securityContext") or {}
        capabilities = context.get("capabilities") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation is not false")
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{where}: capabilities do not drop ALL")
        if set(capabilities.get("add") or []) - ALLOWED_ADDED_CAPABILITIES:
            found.append(f"{where}: adds capabilities beyond NET_BIND_SERVICE")
        if context.get("privileged"):
            found.append(f"{where}: privileged")
        if "runAsUser" in context:
            found.append(f"{where}: names a user (runAsUser): the image's USER runs")
    return found
