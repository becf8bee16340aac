"""The cluster's platform, each piece pinned by a version and installed in the form its upstream repository
(and Go module) holds: the training engine's pieces (engines/: Kubeflow Trainer v2 with JobSet and
Kueue, or the training operator v1 for TFJobs), Argo Workflows (its cluster install, a kustomization),
cert-manager (its chart), KServe in Standard mode (its charts: Deployments and HPAs; no Knative), and
KEDA when serving scales on load (infra/keda.py, a kustomization).

Each comes from its upstream repository, or from the stack's artifact directory or OCI chart mirror
(common/installs.py says where in them), with every image from the stack's image mirror when it has
one; `platform.installCertManager: false` leaves cert-manager to the cluster's own.

Charts are helm.v4.Chart, which renders a chart and applies its objects but skips Helm hooks: the only
hooks of these charts are cert-manager's startupapicheck Job and its account, which its own release
YAML leaves out too (helm template --set startupapicheck.enabled=false). What that Job waited for, the
webhook's CA, this waits for through the provider's own await (`pulumi.com/waitFor`), so the platform
needs no command provider and `pulumi up` no kubectl. Everything goes through the provider's
server-side apply, which the large CRDs need.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from cluster_steps.inference_service import STANDARD_MODE
from common.installs import (
    ArtifactSources,
    ChartInstall,
    Install,
    KustomizeInstall,
    chart_source,
    kustomize_source,
    mirrored,
    with_images,
)
from common.pod_security import container_security_context
from common.yaml_text import to_yaml
from engines.base import TrainingEngine
from infra import keda as keda_install
from pipeline.argo import ARGO_NAMESPACE, CONTROLLER_CONFIG_MAP, executor_config
from pipeline.validation import quantity_value

# Argo's cluster install, as its release's install.yaml is made (its Makefile: `kustomize build
# manifests/cluster-install`, then every `:latest` image tagged with the release).
ARGO_REPOSITORY = "https://github.com/argoproj/argo-workflows"
ARGO_KUSTOMIZATION = "manifests/cluster-install"
ARGO_IMAGES = ("quay.io/argoproj/workflow-controller", "quay.io/argoproj/argocli")
CERT_MANAGER_CHARTS = "https://charts.jetstack.io"
CERT_MANAGER_NAMESPACE = "cert-manager"
# The chart's images, each with its own tag value (the chart's appVersion otherwise, which its
# repository's copy leaves a placeholder until its release tool packages it).
CERT_MANAGER_IMAGES = ("image", "webhook.image", "cainjector.image", "acmesolver.image",
                       "startupapicheck.image")
# cert-manager's webhook answers only once its CA is in its webhook configurations (cainjector copies it
# from the webhook's own CA secret): KServe's Certificate and Issuer are refused until then.
CERT_MANAGER_WEBHOOK = "cert-manager-webhook"
CA_INJECTED = "jsonpath={.webhooks[0].clientConfig.caBundle}"
WAIT_FOR = "pulumi.com/waitFor"
KSERVE_CHARTS = "oci://ghcr.io/kserve/charts"
KSERVE_NAMESPACE = "kserve"
# Images KServe's controller writes into the pods it makes (its inferenceservice-config): the chart's.
KSERVE_CONFIGURED_IMAGES = {"agent": "kserve/agent", "router": "kserve/router",
                            "storage": "kserve/storage-initializer"}
# KServe's controller looks for KEDA's ScaledObject CRD once, when it starts (v0.20.0
# pkg/controller/v1beta1/inferenceservice/controller.go SetupWithManager): KEDA is installed before it,
# and its pod template names the KEDA it started with, so that adding, removing or upgrading KEDA
# restarts it.
KEDA_ANNOTATION = "dist-ml/keda-version"


@dataclasses.dataclass(frozen=True)
class PlatformArgs:
    engine: TrainingEngine  # pipeline.engine's: what trains
    engine_versions: dict[str, str]  # the engine's platform keys (its stack_keys) and their versions
    namespace: str  # the pipeline's
    argo_version: str
    cert_manager_version: str | None  # None: the cluster runs cert-manager itself
    kserve_version: str
    provider: k8s.Provider | None  # None: only to list what it installs (platform_installs)
    sources: ArtifactSources = ArtifactSources()
    keda_version: str | None = None  # None: no KEDA (serving scales on CPU or memory)
    controller_requests: dict[str, str] = dataclasses.field(default_factory=dict)  # {}: upstream's


def argo_install(version: str) -> KustomizeInstall:
    return KustomizeInstall("argo", ARGO_REPOSITORY, version, ARGO_KUSTOMIZATION,
                            tags=tuple((image, version) for image in ARGO_IMAGES))


def cert_manager_install(version: str, image_mirror: str | None = None) -> ChartInstall:
    """cert-manager's chart as its release YAML renders it (make/manifests.mk: its CRDs, no
    startupapicheck), its images tagged with the release, from the mirror's registry if any."""
    values: dict[str, Any] = {"crds": {"enabled": True}, "startupapicheck": {"enabled": False}}
    for path in CERT_MANAGER_IMAGES:
        node = values
        for key in path.split("."):
            node = node.setdefault(key, {})
        node["tag"] = version
    if image_mirror is not None:
        values["imageRegistry"] = image_mirror  # also the ACME solver's image, an argument of the controller
    return ChartInstall("cert-manager", "cert-manager", CERT_MANAGER_CHARTS, version, CERT_MANAGER_NAMESPACE,
                        values, control_plane_ports=(10250,))  # its webhook (the chart's webhook.securePort)


def kserve_installs(version: str, controller: dict, image_mirror: str | None) -> list[ChartInstall]:
    """KServe's three charts: its CRDs, its controller (with `controller` values), its serving runtimes."""
    configured = {key: {"image": mirrored(image, image_mirror)} if image_mirror else {}
                  for key, image in KSERVE_CONFIGURED_IMAGES.items()}
    # The storage initializer KServe adds to a predictor whose model it downloads (gs://): its default
    # ClusterStorageContainer takes this context (v0.20.0 charts/kserve-resources
    # storagecontainer-patch.yaml), and our predictor pods must meet `restricted` with it.
    configured["storage"]["containerSecurityContext"] = container_security_context()
    return [
        ChartInstall("kserve-crd", "kserve-crd", KSERVE_CHARTS, version, KSERVE_NAMESPACE, {}),
        ChartInstall("kserve-resources", "kserve-resources", KSERVE_CHARTS, version, KSERVE_NAMESPACE,
                     {"kserve": {"controller": controller, **{key: value for key, value in configured.items()
                                                              if value}}},
                     control_plane_ports=(9443,)),  # the controller's webhook server
        # The ClusterServingRuntimes (TF Serving among them; off by default), after KServe's webhooks.
        ChartInstall("kserve-runtime-configs", "kserve-runtime-configs", KSERVE_CHARTS, version,
                     KSERVE_NAMESPACE, {"kserve": {"servingruntime": {"enabled": True}}}),
    ]


# The Secrets an install makes hold what its controllers write (Trainer's webhook certificate: an empty
# Secret its rotator fills). Their data is the controllers', not the stack's: Pulumi's provider (4.25)
# diffs the install's empty `data` against a live Secret the provider last read without it as a change,
# and a change of a Secret's data replaces it (provider/pkg/provider/diff.go forceNewProperties): on every
# `up` (found by the tier's third `up`).
SECRET = "kubernetes:core/v1:Secret"
CONTROLLERS_DATA = ["data"]


def install_transform(tags: dict[str, str], mirror: str | None, requests: dict[str, str]
                      ) -> pulumi.ResourceTransform:
    """Every object of an install as the stack applies it: the images it names tagged as its release tags
    them and from the mirror if any, its controllers asking for `requests` (platform.controllerRequests),
    its Secrets' data left to its controllers."""

    def transform(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        if not args.type_.startswith("kubernetes:"):
            return None
        props = with_requests(with_images(args.props, tags, mirror), requests)
        opts = args.opts
        if args.type_ == SECRET:
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(ignore_changes=CONTROLLERS_DATA))
        return pulumi.ResourceTransformResult(props, opts)

    return transform


POD_TEMPLATE_KINDS = ("Deployment", "StatefulSet", "DaemonSet")


def with_requests(obj: dict, requests: dict[str, str]) -> dict:
    """A workload of an install (its pod template's containers) asking for `requests` instead of what its
    manifest asks, its limits kept (a request above its limit is the limit); any other object as it was."""
    template = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    if obj.get("kind") not in POD_TEMPLATE_KINDS or not requests or not isinstance(
            template.get("containers"), list):
        return obj
    containers = []
    for container in template["containers"]:
        resources = dict(container.get("resources") or {})
        limits = resources.get("limits") or {}
        asked = {**(resources.get("requests") or {}), **requests}
        resources["requests"] = {
            name: limits[name] if name in limits and quantity_value(limits[name]) < quantity_value(value)
            else value for name, value in asked.items()}
        containers.append({**container, "resources": resources})
    pod = {**obj["spec"]["template"], "spec": {**template, "containers": containers}}
    return {**obj, "spec": {**obj["spec"], "template": pod}}


def ca_injected_transform(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
    """cert-manager's webhook configurations, awaited until cainjector has written their CA."""
    if args.type_ not in ("kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration",
                          "kubernetes:admissionregistration.k8s.io/v1:MutatingWebhookConfiguration"):
        return None
    metadata = dict(args.props.get("metadata") or {})
    if metadata.get("name") != CERT_MANAGER_WEBHOOK:
        return None
    metadata["annotations"] = {**(metadata.get("annotations") or {}), WAIT_FOR: CA_INJECTED}
    return pulumi.ResourceTransformResult({**args.props, "metadata": metadata}, args.opts)


@dataclasses.dataclass(frozen=True)
class PlatformInstalls:
    """What the platform installs, in the order it waits for one another."""
    training: list[Install]  # the training engine's
    argo: KustomizeInstall
    cert_manager: ChartInstall | None  # None: the cluster's own
    keda: KustomizeInstall | None  # None: serving does not scale on load
    kserve: list[ChartInstall]  # its CRDs, its controller, its serving runtimes

    def all(self) -> list[Install]:
        return [*self.training, self.argo, *filter(None, [self.cert_manager, self.keda]), *self.kserve]


def platform_installs(args: PlatformArgs) -> PlatformInstalls:
    controller = {"deploymentMode": STANDARD_MODE}
    if args.keda_version:
        controller["podAnnotations"] = {KEDA_ANNOTATION: args.keda_version}
    mirror = args.sources.image_mirror
    return PlatformInstalls(
        training=args.engine.installs(args.engine_versions, args.namespace),
        argo=argo_install(args.argo_version),
        cert_manager=(cert_manager_install(args.cert_manager_version, mirror)
                      if args.cert_manager_version else None),
        keda=keda_install.install(args.keda_version) if args.keda_version else None,
        kserve=kserve_installs(args.kserve_version, controller, mirror))


class Platform(pulumi.ComponentResource):
    """Installs the platform; `ready` is what custom resources of its kinds, and objects in its
    namespaces (argo), must depend on."""

    ready: list[pulumi.Resource]

    def __init__(self, name: str, args: PlatformArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Platform", name, None, opts)
        self._name, self._args = name, args
        installs = platform_installs(args)
        # Each of the engine's installs after the one before: Kueue's TrainJob integration reads
        # Trainer's runtimes when Kueue starts (kueue v0.19.2 pkg/controller/jobs/trainjob NewReconciler,
        # through Trainer's runtime core); started before Trainer's and JobSet's CRDs are served, its
        # webhook refuses every TrainJob with "unsupported runtime" until it restarts.
        training: list[pulumi.Resource] = []
        for install in installs.training:
            training.append(self._install(install, training[-1:]))

        argo_namespace = self._namespace("argo", ARGO_NAMESPACE)
        argo = self._install(installs.argo, [argo_namespace])
        # The executor's containers in our step pods: a patch of the config map the install brings
        # (server-side apply of this one key; the controller reloads its config when it changes).
        executor = executor_config(args.argo_version)
        executor["image"] = mirrored(executor["image"], args.sources.image_mirror)
        argo_executor = k8s.core.v1.ConfigMapPatch(
            f"{name}-argo-executor",
            metadata={"name": CONTROLLER_CONFIG_MAP, "namespace": ARGO_NAMESPACE},
            data={"executor": to_yaml(executor)},
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[argo]))

        cert_manager = [self._install(installs.cert_manager, transforms=[ca_injected_transform])
                        ] if installs.cert_manager else []
        keda = [self._install(installs.keda)] if installs.keda else []
        crds, resources, runtimes = installs.kserve
        kserve_namespace = self._namespace("kserve", KSERVE_NAMESPACE)
        kserve_crds = self._install(crds, [kserve_namespace], namespace=False)
        kserve = self._install(resources, [kserve_crds, *cert_manager, *keda], namespace=False)
        kserve_runtimes = self._install(runtimes, [kserve], namespace=False)

        self.ready = [*training, argo_namespace, argo, argo_executor, kserve, kserve_runtimes]
        self.register_outputs({})

    def _namespace(self, name: str, namespace: str) -> k8s.core.v1.Namespace:
        return k8s.core.v1.Namespace(f"{self._name}-{name}-namespace", metadata={"name": namespace},
                                     opts=pulumi.ResourceOptions(parent=self, provider=self._args.provider))

    def _install(self, install: Install, depends_on: list[pulumi.Resource] | None = None,
                 namespace: bool = True, transforms: list[pulumi.ResourceTransform] | None = None,
                 ) -> pulumi.Resource:
        """One upstream install from where the stack's sources say: a kustomize directory, or a chart in
        its own namespace (made first unless `namespace` is False: another install's)."""
        args, name = self._args, f"{self._name}-{install.name}"
        sources = args.sources
        opts = pulumi.ResourceOptions(
            parent=self, provider=args.provider, depends_on=depends_on or [],
            transforms=[install_transform(dict(install.tags) if isinstance(install, KustomizeInstall) else {},
                                          sources.image_mirror, args.controller_requests),
                        *(transforms or [])])
        if isinstance(install, KustomizeInstall):
            return k8s.kustomize.v2.Directory(name, directory=kustomize_source(install, sources), opts=opts)
        if namespace:
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                depends_on=[self._namespace(install.name, install.namespace)]))
        source = chart_source(install, sources)
        return k8s.helm.v4.Chart(
            name, chart=source.chart, version=source.version,
            repository_opts={"repo": source.repository} if source.repository else None,
            name=install.release, namespace=install.namespace, values=install.values, opts=opts)
