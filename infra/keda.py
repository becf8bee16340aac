"""KEDA: the autoscaler KServe hands a predictor to when it scales on load (autoscalerClass keda).

KServe's controller writes a ScaledObject `<isvc>-predictor` with a Prometheus trigger from the
InferenceService's autoScaling; KEDA's operator polls the query and drives an HPA `keda-hpa-<name>`
through its external-metrics API server (KServe pins 2.18.0, tested up to Kubernetes 1.33, the stacks
2.21.0: docs/reference/kubernetes.md).

Installed as KEDA's own release YAML is made (its Makefile's `release` target: `kustomize build
config/default` with the images set to the release's tag, `:main` in the repository), from its git
repository at the tag, or an artifact directory's copy of it: what KEDA's module holds, unlike its Helm
chart (another repository), so an air-gapped install takes the same form as a connected one. Its
namespace comes with it; its webhooks' and metrics API's certificates are made by its operator, not by
cert-manager. The release YAML pulls its images Always: a mirror or registry must serve them.
"""

from __future__ import annotations

from common.installs import KustomizeInstall

NAMESPACE = "keda"  # config/default's (every object of its bases names it)
REPOSITORY = "https://github.com/kedacore/keda"
KUSTOMIZATION = "config/default"
IMAGES = ("ghcr.io/kedacore/keda", "ghcr.io/kedacore/keda-metrics-apiserver",
          "ghcr.io/kedacore/keda-admission-webhooks")


def install(version: str) -> KustomizeInstall:
    """KEDA `version` (2.21.0, its chart's and images' tags; the git tag has a v)."""
    bare = version.removeprefix("v")
    return KustomizeInstall("keda", REPOSITORY, f"v{bare}", KUSTOMIZATION,
                            tags=tuple((image, bare) for image in IMAGES),
                            # the metrics API server (aggregated: external.metrics.k8s.io), the webhooks
                            control_plane_ports=(6443, 9443))
