"""The cluster's platform, each piece pinned by a version and installed from its upstream release:
the training engine's pieces (engines/: Kubeflow Trainer v2 with JobSet and Kueue, or the training
operator v1 for TFJobs), Argo Workflows, cert-manager and KServe in Standard mode (Deployments and
HPAs; no Knative), and KEDA when serving scales on load (infra/keda.py).

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
from pulumi_command import local

from cluster_steps.inference_service import STANDARD_MODE
from common.pod_security import container_security_context
from common.yaml_text import to_yaml
from engines.base import ChartInstall, Install, KustomizeInstall, TrainingEngine
from infra.keda import Keda, KedaArgs
from pipeline.argo import ARGO_NAMESPACE, CONTROLLER_CONFIG_MAP, executor_config

ARGO_INSTALL = "https://github.com/argoproj/argo-workflows/releases/download/{version}/install.yaml"
CERT_MANAGER = "https://github.com/cert-manager/cert-manager/releases/download/{version}/cert-manager.yaml"
KSERVE_CHARTS = "oci://ghcr.io/kserve/charts/{chart}"
KSERVE_NAMESPACE = "kserve"
# KServe's controller looks for KEDA's ScaledObject CRD once, when it starts (v0.20.0
# pkg/controller/v1beta1/inferenceservice/controller.go SetupWithManager): KEDA is installed before it,
# and its pod template names the KEDA it started with, so that adding, removing or upgrading KEDA
# restarts it.
KEDA_ANNOTATION = "dist-ml/keda-version"
# KServe's chart creates a cert-manager Certificate for its webhooks: cert-manager's own webhook must
# answer first, and it answers only once cainjector has written its CA into the webhook configuration.
# Applying cert-manager's YAML does not wait for that, so this does (bounded), with kubectl.
CERT_MANAGER_READY = """set -eu
config=$(mktemp); trap 'rm -f "$config"' EXIT
printf '%s' "$KUBECONFIG_CONTENT" > "$config"; export KUBECONFIG="$config"
kubectl wait --for=condition=Available --timeout=300s --namespace cert-manager deployment --all
for attempt in $(seq 60); do
  ca=$(kubectl get validatingwebhookconfiguration cert-manager-webhook \
       -o jsonpath='{.webhooks[0].clientConfig.caBundle}')
  if [ -n "$ca" ]; then exit 0; fi
  sleep 5
done
echo "cert-manager's webhook has no CA bundle after 5 minutes" >&2
exit 1
"""


@dataclasses.dataclass(frozen=True)
class PlatformArgs:
    engine: TrainingEngine  # pipeline.engine's: what trains
    engine_versions: dict[str, str]  # the engine's platform keys (its stack_keys) and their versions
    namespace: str  # the pipeline's
    argo_version: str
    cert_manager_version: str
    kserve_version: str
    provider: k8s.Provider
    kubeconfig: pulumi.Input[str]  # Argo's objects need a provider whose default namespace is argo
    keda_version: str | None = None  # None: no KEDA (serving scales on CPU or memory)


class Platform(pulumi.ComponentResource):
    """Installs the platform; `ready` is what custom resources of its kinds, and objects in its
    namespaces (argo), must depend on."""

    ready: list[pulumi.Resource]

    def __init__(self, name: str, args: PlatformArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Platform", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)

        training = [self._install(name, install, args.provider)
                    for install in args.engine.installs(args.engine_versions, args.namespace)]

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
        # The executor's containers in our step pods: a patch of the config map install.yaml brings
        # (server-side apply of this one key; the controller reloads its config when it changes).
        executor = k8s.core.v1.ConfigMapPatch(
            f"{name}-argo-executor",
            metadata={"name": CONTROLLER_CONFIG_MAP, "namespace": ARGO_NAMESPACE},
            data={"executor": to_yaml(executor_config(args.argo_version))},
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[argo]))

        cert_manager = k8s.yaml.v2.ConfigFile(
            f"{name}-cert-manager",
            file=CERT_MANAGER.format(version=args.cert_manager_version),
            opts=on_cluster,
        )
        cert_manager_ready = local.Command(
            f"{name}-cert-manager-ready", create=CERT_MANAGER_READY,
            environment={"KUBECONFIG_CONTENT": args.kubeconfig},
            triggers=[args.cert_manager_version],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[cert_manager]))

        kserve_namespace = k8s.core.v1.Namespace(
            f"{name}-kserve-namespace", metadata={"name": KSERVE_NAMESPACE}, opts=on_cluster)
        kserve_crds = self._kserve_chart(name, "kserve-crd", args, {}, [kserve_namespace])
        controller, keda = {"deploymentMode": STANDARD_MODE}, []
        if args.keda_version:
            keda = [Keda(f"{name}-keda", KedaArgs(args.keda_version, args.provider),
                         opts=pulumi.ResourceOptions(parent=self)).chart]
            controller["podAnnotations"] = {KEDA_ANNOTATION: args.keda_version}
        # The storage initializer KServe adds to a predictor whose model it downloads (gs://): its
        # default ClusterStorageContainer takes this context (v0.20.0 charts/kserve-resources
        # storagecontainer-patch.yaml), and our predictor pods must meet `restricted` with it.
        storage = {"containerSecurityContext": container_security_context()}
        kserve = self._kserve_chart(name, "kserve-resources", args,
                                    {"kserve": {"controller": controller, "storage": storage}},
                                    [kserve_crds, cert_manager_ready, *keda])
        # The ClusterServingRuntimes (TF Serving among them; off by default), after KServe's webhooks.
        runtimes = self._kserve_chart(name, "kserve-runtime-configs", args,
                                      {"kserve": {"servingruntime": {"enabled": True}}}, [kserve])

        self.ready = [*training, argo_namespace, argo, executor, kserve, runtimes]
        self.register_outputs({})

    def _install(self, name: str, install: Install, provider: k8s.Provider) -> pulumi.Resource:
        """One of the engine's pieces: a kustomize directory, or a chart in its own namespace."""
        if isinstance(install, KustomizeInstall):
            return k8s.kustomize.v2.Directory(f"{name}-{install.name}", directory=install.directory,
                                              opts=pulumi.ResourceOptions(parent=self, provider=provider))
        assert isinstance(install, ChartInstall)
        namespace = k8s.core.v1.Namespace(
            f"{name}-{install.name}-namespace", metadata={"name": install.namespace},
            opts=pulumi.ResourceOptions(parent=self, provider=provider))
        return k8s.helm.v4.Chart(
            f"{name}-{install.name}", chart=install.chart, version=install.version,
            namespace=install.namespace, values=install.values,
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace]))

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
