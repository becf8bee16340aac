"""The Gateway users reach the model through: the pipeline's rollout attaches its HTTPRoute to it and
splits requests between the stable and the canary predictor (cluster_steps.release).

The Gateway API's CRDs and controller come with the cluster: k3s's packaged Traefik (its traefik-crd
chart installs the standard Gateway API CRDs; its Kubernetes Gateway provider is off until a
HelmChartConfig turns it on) and GKE's Gateway controller (the cluster's `gateway_api_config`). The
CRDs may appear only after the cluster answers, so the Gateway waits for them (bounded, with kubectl).
The HTTPRoute is not declared here: the workflow owns it, as it owns the InferenceServices, and a
Pulumi-declared route would have its weights reset on every `up`.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s
from pulumi_command import local

from cluster_steps.names import GATEWAY_NAME, ROUTE_GROUP
from pipeline.manifests import PART_OF

GATEWAY_API_VERSION = f"{ROUTE_GROUP}/v1"
LISTENER_NAME = "http"
# The kinds the Gateway and the pipeline's rollout create, whose CRDs must be established first.
GATEWAY_CRDS = ("gateways.gateway.networking.k8s.io", "httproutes.gateway.networking.k8s.io")
CRD_WAIT_SECONDS = 300
# `kubectl wait --for=create` (kubectl 1.31+) waits for an object that does not exist yet.
GATEWAY_CRDS_READY = f"""set -eu
config=$(mktemp); trap 'rm -f "$config"' EXIT
printf '%s' "$KUBECONFIG_CONTENT" > "$config"; export KUBECONFIG="$config"
kubectl wait --for=create --timeout={CRD_WAIT_SECONDS}s {' '.join(f'crd/{crd}' for crd in GATEWAY_CRDS)}
kubectl wait --for=condition=Established --timeout={CRD_WAIT_SECONDS}s \
  {' '.join(f'crd/{crd}' for crd in GATEWAY_CRDS)}
"""


@dataclasses.dataclass(frozen=True)
class GatewayPlacement:
    """What a cluster kind's Gateway API implementation needs of the Gateway."""
    class_name: str  # the GatewayClass its controller serves
    listener_port: int  # the port the controller listens on for this Gateway
    ready: list[pulumi.Resource] = dataclasses.field(default_factory=list)  # e.g. the controller's config
    url: pulumi.Input[str] = ""  # how a user reaches the listener, e.g. http://localhost:8088
    address_hint: str = ""  # when `url` is unknown until the Gateway has an address: how to read it


@dataclasses.dataclass(frozen=True)
class GatewayArgs:
    placement: GatewayPlacement
    namespace: str
    provider: k8s.Provider
    kubeconfig: pulumi.Input[str]
    depends_on: list[pulumi.Resource]  # the namespace


def gateway_manifest(placement: GatewayPlacement, namespace: str) -> dict:
    """One HTTP listener, for routes of its own namespace only (the system's)."""
    return {
        "apiVersion": GATEWAY_API_VERSION, "kind": "Gateway",
        "metadata": {"name": GATEWAY_NAME, "namespace": namespace, "labels": dict(PART_OF)},
        "spec": {"gatewayClassName": placement.class_name, "listeners": [{
            "name": LISTENER_NAME, "protocol": "HTTP", "port": placement.listener_port,
            "allowedRoutes": {"namespaces": {"from": "Same"}}}]},
    }


class Gateway(pulumi.ComponentResource):
    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Gateway", name, None, opts)
        crds_ready = local.Command(
            f"{name}-crds-ready", create=GATEWAY_CRDS_READY,
            environment={"KUBECONFIG_CONTENT": args.kubeconfig},
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.placement.ready))
        manifest = gateway_manifest(args.placement, args.namespace)
        gateway = k8s.apiextensions.CustomResource(
            f"{name}-gateway", api_version=manifest["apiVersion"], kind=manifest["kind"],
            metadata=manifest["metadata"], spec=manifest["spec"],
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider,
                                        depends_on=[*args.depends_on, *args.placement.ready, crds_ready]))
        self.register_outputs({"gateway": gateway.metadata["name"]})
