"""The Gateway users reach the model through: the pipeline's rollout attaches its HTTPRoute to it and
splits requests between the stable and the canary predictor (cluster_steps.release).

The Gateway API's CRDs and controller come with the cluster: k3s's packaged Traefik (its traefik-crd
chart installs the standard Gateway API CRDs; its Kubernetes Gateway provider is off until a
HelmChartConfig turns it on) and GKE's Gateway controller (the cluster's `gateway_api_config`). The
CRDs may appear only after the cluster answers, so the Gateway waits for them (bounded, with kubectl).
The model's HTTPRoute is not declared here: the workflow owns it, as it owns the InferenceServices,
and a Pulumi-declared route would have its weights reset on every `up`. It attaches to the listener
MODEL_LISTENER only (its parentRef names that section), never to a plain-HTTP listener that a
Gateway serving HTTPS keeps for redirecting to HTTPS: that listener's one route, declared here,
redirects.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s
from pulumi_command import local

from common.cluster_names import GATEWAY_NAME, MODEL_LISTENER, ROUTE_GROUP
from common.cluster_target import PART_OF

GATEWAY_API_VERSION = f"{ROUTE_GROUP}/v1"
REDIRECT_LISTENER = "http-redirect"
REDIRECT_ROUTE = f"{GATEWAY_NAME}-https-redirect"
MOVED_PERMANENTLY = 301
# The kinds the Gateway and the pipeline's rollout create, whose CRDs must be established first.
GATEWAY_CRDS = ("gateways.gateway.networking.k8s.io", "httproutes.gateway.networking.k8s.io")
CRD_WAIT_SECONDS = 300


def crds_ready_script(crds: tuple[str, ...]) -> str:
    """Waits, bounded, until the cluster serves `crds`. `kubectl wait --for=create` (kubectl 1.31+)
    waits for an object that does not exist yet."""
    names = " ".join(f"crd/{crd}" for crd in crds)
    return f"""set -eu
config=$(mktemp); trap 'rm -f "$config"' EXIT
printf '%s' "$KUBECONFIG_CONTENT" > "$config"; export KUBECONFIG="$config"
kubectl wait --for=create --timeout={CRD_WAIT_SECONDS}s {names}
kubectl wait --for=condition=Established --timeout={CRD_WAIT_SECONDS}s \
  {names}
"""


@dataclasses.dataclass(frozen=True)
class GatewayPlacement:
    """What a cluster kind's Gateway API implementation needs of the Gateway."""
    class_name: str  # the GatewayClass its controller serves
    listener_port: int  # the port the controller listens on for this Gateway
    ready: list[pulumi.Resource] = dataclasses.field(default_factory=list)  # e.g. the controller's config
    url: pulumi.Input[str] = ""  # how a user reaches the listener, e.g. http://localhost:8088
    address_hint: str = ""  # when `url` is unknown until the Gateway has an address: how to read it
    https: bool = False  # the model's listener serves HTTPS, its certificate named by `annotations`
    redirect_port: int | None = None  # a plain-HTTP listener there, which only redirects to HTTPS
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)  # the controller's options
    addresses: tuple[dict, ...] = ()  # e.g. a reserved static address
    # Objects of the controller's own kinds that go with the Gateway (e.g. GKE's backend policies),
    # declared once the cluster serves their CRDs (`crds`).
    policies: tuple[dict, ...] = ()
    crds: tuple[str, ...] = ()
    # The cluster served the CRDs before the stack began (a cluster the user had): read, so that a
    # missing one is an error naming it, rather than waited for with kubectl.
    crds_served: bool = False


@dataclasses.dataclass(frozen=True)
class GatewayArgs:
    placement: GatewayPlacement
    namespace: str
    provider: k8s.Provider
    kubeconfig: pulumi.Input[str] | None  # for the wait for the CRDs (None where they are read)
    depends_on: list[pulumi.Resource]  # the namespace
    # The system's namespace: `pulumi destroy` deletes these with it (deleted_with), see stacks/compose.py.
    deleted_with: pulumi.Resource | None = None


def gateway_manifest(placement: GatewayPlacement, namespace: str) -> dict:
    """The model's listener (HTTP, or HTTPS), and the redirecting HTTP one if any, each for routes of
    the Gateway's own namespace only (the system's)."""
    same_namespace = {"namespaces": {"from": "Same"}}
    listeners = [{"name": MODEL_LISTENER, "protocol": "HTTPS" if placement.https else "HTTP",
                  "port": placement.listener_port, "allowedRoutes": same_namespace}]
    if placement.redirect_port is not None:
        listeners.append({"name": REDIRECT_LISTENER, "protocol": "HTTP", "port": placement.redirect_port,
                          "allowedRoutes": same_namespace})
    metadata = {"name": GATEWAY_NAME, "namespace": namespace, "labels": dict(PART_OF)}
    if placement.annotations:
        metadata["annotations"] = dict(placement.annotations)
    spec = {"gatewayClassName": placement.class_name, "listeners": listeners}
    if placement.addresses:
        spec["addresses"] = [dict(address) for address in placement.addresses]
    return {"apiVersion": GATEWAY_API_VERSION, "kind": "Gateway", "metadata": metadata, "spec": spec}


def redirect_route_manifest(namespace: str) -> dict:
    """The redirecting listener's only route: every request, permanently to the same URL on https."""
    return {"apiVersion": GATEWAY_API_VERSION, "kind": "HTTPRoute",
            "metadata": {"name": REDIRECT_ROUTE, "namespace": namespace, "labels": dict(PART_OF)},
            "spec": {"parentRefs": [{"name": GATEWAY_NAME, "sectionName": REDIRECT_LISTENER}],
                     "rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {
                         "scheme": "https", "statusCode": MOVED_PERMANENTLY}}]}]}}


def declared(name: str, manifest: dict, opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    return k8s.apiextensions.CustomResource(
        name, api_version=manifest["apiVersion"], kind=manifest["kind"], metadata=manifest["metadata"],
        spec=manifest["spec"], opts=opts)


class Gateway(pulumi.ComponentResource):
    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Gateway", name, None, opts)
        placement = args.placement
        crds = (*GATEWAY_CRDS, *placement.crds)
        if placement.crds_served:
            crds_ready = [k8s.apiextensions.v1.CustomResourceDefinition.get(
                f"{name}-crd-{crd.partition('.')[0]}", crd,
                opts=pulumi.ResourceOptions(parent=self, provider=args.provider)) for crd in crds]
        else:
            crds_ready = [local.Command(
                f"{name}-crds-ready", create=crds_ready_script(crds),
                environment={"KUBECONFIG_CONTENT": args.kubeconfig},
                opts=pulumi.ResourceOptions(parent=self, depends_on=placement.ready))]
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider,
                                            depends_on=[*args.depends_on, *placement.ready, *crds_ready],
                                            deleted_with=args.deleted_with)
        # Policies first: a backend the Gateway reaches before its policy would be open meanwhile.
        policies = [declared(f"{name}-{policy['kind'].lower()}-{policy['metadata']['name']}", policy,
                             on_cluster) for policy in placement.policies]
        after_policies = pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=policies))
        gateway = declared(f"{name}-gateway", gateway_manifest(placement, args.namespace), after_policies)
        if placement.redirect_port is not None:
            declared(f"{name}-https-redirect", redirect_route_manifest(args.namespace),
                     pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=[gateway])))
        self.register_outputs({"gateway": gateway.metadata["name"]})
