"""The cluster's platform, each piece pinned by a version and installed from its upstream release:
the Kubeflow training operator (TFJob), Argo Workflows, cert-manager and KServe (with Knative when
KServe runs in Knative mode).

Charts are helm.v4.Chart, which renders a chart and applies its objects but skips Helm hooks. The
KServe charts' generator and the templates we read have no hooks, and KServe's docs install them
with plain `helm install`; we could not read the packaged v0.20.0 charts offline, so check
`helm template` of a new version for `helm.sh/hook` before bumping it.
Everything goes through the provider's server-side apply, which the large CRDs need.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

TRAINING_OPERATOR = ("https://github.com/kubeflow/trainer.git/manifests/overlays/standalone"
                     "?ref={version}")
ARGO_INSTALL = "https://github.com/argoproj/argo-workflows/releases/download/{version}/install.yaml"
ARGO_NAMESPACE = "argo"
CERT_MANAGER = "https://github.com/cert-manager/cert-manager/releases/download/{version}/cert-manager.yaml"
KSERVE_CHARTS = "oci://ghcr.io/kserve/charts/{chart}"
KSERVE_NAMESPACE = "kserve"
KNATIVE_SERVING = "https://github.com/knative/serving/releases/download/knative-{version}/{file}"
KNATIVE_KOURIER = "https://github.com/knative/net-kourier/releases/download/knative-{version}/kourier.yaml"


@dataclasses.dataclass(frozen=True)
class PlatformArgs:
    training_operator_version: str
    argo_version: str
    cert_manager_version: str
    kserve_version: str
    kserve_deployment_mode: str  # Standard or Knative
    knative_version: str
    provider: k8s.Provider
    kubeconfig: pulumi.Input[str]  # Argo's objects need a provider whose default namespace is argo


class Platform(pulumi.ComponentResource):
    """Installs the platform; `ready` is what custom resources of its kinds must depend on."""

    ready: list[pulumi.Resource]

    def __init__(self, name: str, args: PlatformArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Platform", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)

        training_operator = k8s.kustomize.v2.Directory(
            f"{name}-training-operator",
            directory=TRAINING_OPERATOR.format(version=args.training_operator_version),
            opts=on_cluster,
        )

        argo_namespace = k8s.core.v1.Namespace(
            f"{name}-argo-namespace", metadata={"name": ARGO_NAMESPACE}, opts=on_cluster)
        # install.yaml leaves namespaced objects without a namespace (`kubectl apply -n argo`).
        argo_provider = k8s.Provider(f"{name}-argo-provider", kubeconfig=args.kubeconfig,
                                     namespace=ARGO_NAMESPACE, opts=pulumi.ResourceOptions(parent=self))
        argo = k8s.yaml.v2.ConfigFile(
            f"{name}-argo",
            file=ARGO_INSTALL.format(version=args.argo_version),
            opts=pulumi.ResourceOptions(parent=self, provider=argo_provider, depends_on=[argo_namespace]),
        )

        cert_manager = k8s.yaml.v2.ConfigFile(
            f"{name}-cert-manager",
            file=CERT_MANAGER.format(version=args.cert_manager_version),
            opts=on_cluster,
        )
        kserve_needs = [cert_manager]
        if args.kserve_deployment_mode == "Knative":
            kserve_needs.append(self._knative(name, args, on_cluster))

        kserve_namespace = k8s.core.v1.Namespace(
            f"{name}-kserve-namespace", metadata={"name": KSERVE_NAMESPACE}, opts=on_cluster)
        kserve_crds = self._kserve_chart(name, "kserve-crd", args, {}, [kserve_namespace])
        kserve = self._kserve_chart(
            name, "kserve-resources", args,
            {"kserve": {"controller": {"deploymentMode": args.kserve_deployment_mode}}},
            [kserve_crds, *kserve_needs])
        # The ClusterServingRuntimes (TF Serving among them), after KServe's webhooks are up.
        runtimes = self._kserve_chart(name, "kserve-runtime-configs", args,
                                      {"kserve": {"servingruntime": {"enabled": True}}}, [kserve])

        self.ready = [training_operator, argo, kserve, runtimes]
        self.register_outputs({})

    def _kserve_chart(self, name: str, chart: str, args: PlatformArgs, values: dict,
                      depends_on: list[pulumi.Resource]) -> k8s.helm.v4.Chart:
        return k8s.helm.v4.Chart(
            f"{name}-{chart}",
            chart=KSERVE_CHARTS.format(chart=chart),
            version=args.kserve_version,
            namespace=KSERVE_NAMESPACE,
            values=values,
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=depends_on),
        )

    def _knative(self, name: str, args: PlatformArgs, on_cluster: pulumi.ResourceOptions) -> pulumi.Resource:
        """Knative Serving with Kourier as its ingress: what KServe's Knative mode runs on."""
        crds = k8s.yaml.v2.ConfigFile(
            f"{name}-knative-crds",
            file=KNATIVE_SERVING.format(version=args.knative_version, file="serving-crds.yaml"),
            opts=on_cluster)
        core = k8s.yaml.v2.ConfigFile(
            f"{name}-knative-core",
            file=KNATIVE_SERVING.format(version=args.knative_version, file="serving-core.yaml"),
            opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=[crds])))
        kourier = k8s.yaml.v2.ConfigFile(
            f"{name}-knative-kourier", file=KNATIVE_KOURIER.format(version=args.knative_version),
            opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=[core])))
        return k8s.core.v1.ConfigMapPatch(
            f"{name}-knative-network",
            metadata={"name": "config-network", "namespace": "knative-serving"},
            data={"ingress-class": "kourier.ingress.networking.knative.dev"},
            opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=[kourier])))
