"""What the end-to-end tests share about the stack `pulumi up` installs (conftest.py): its namespace, the
references of the images the tier pushes, the cluster's own Prometheus, the platform's namespaces, and
the image the first `pulumi up` runs without."""

from __future__ import annotations

from stack_checks import STACK_NAMESPACE

from common.installs import mirrored
from infra.images import image_ref
from tools.control_plane.registry import ADDRESS as REGISTRY

NAMESPACE = STACK_NAMESPACE  # the e2e stack's: the local stack's, kept (conftest.stack_file)
# The cluster's own Prometheus, which KEDA reads (the stack's monitoring.prometheusUrl; the scaling test
# starts it).
PROMETHEUS_URL = "http://prometheus.monitoring.svc:9090"
# Where the platform's controllers run (Trainer's overlay and JobSet's, Kueue's, KServe's, KEDA's and
# Argo's installs), cert-manager being the cluster's own.
PLATFORM_NAMESPACES = ("kubeflow-system", "kueue-system", "kserve", "keda", "argo")
# Left out of the registry for the first `pulumi up`, as a mirror that misses one image would.
WITHHELD = "registry.k8s.io/kueue/kueue"
NEVER_STARTS_SECONDS = 300.0  # the first `pulumi up` must fail within this, in the kubelet's words


def project_reference(image: str) -> str:
    """Where the tier pushes the project's `image` (trainer, serving, tracking-server), as CI pushes it:
    what the stack's images section names."""
    return mirrored(image_ref(image), REGISTRY)
