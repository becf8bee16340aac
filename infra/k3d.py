"""A k3d cluster (k3s in Docker) on this machine, a Kubernetes provider bound to it, and its packaged
Traefik's Gateway API provider turned on."""

from __future__ import annotations

import dataclasses
import shlex

import pulumi
import pulumi_kubernetes as k8s
from pulumi_command import local

from common.yaml_text import to_yaml

# k3s installs Traefik with its helm-controller from the HelmChart kube-system/traefik; a
# HelmChartConfig of the same name and namespace adds values to it (docs.k3s.io, "Customizing Packaged
# Components with HelmChartConfig"). k3s v1.35.8 packages Traefik's chart 40.1 (Traefik 3.7), whose
# Kubernetes Gateway provider is off by default (providers.kubernetesGateway.enabled); turned on, the
# chart creates the GatewayClass `traefik` (gatewayClass.enabled) and, unless gateway.enabled is false,
# a Gateway of its own in kube-system, which nothing here uses. These values mean the same since chart
# 34.x (k3s v1.33). The Gateway API CRDs (v1.5.1, standard channel) come with k3s's traefik-crd chart.
TRAEFIK_CHART = "traefik"
TRAEFIK_NAMESPACE = "kube-system"
TRAEFIK_GATEWAY_CLASS = "traefik"
# A Gateway listener must name the port of one of Traefik's entry points: `web` listens on 8000 in the
# pod and is exposed on 80 by its LoadBalancer Service, which k3d's load balancer forwards (cluster.ports).
TRAEFIK_WEB_PORT = 8000
TRAEFIK_WEB_SERVICE_PORT = 80
TRAEFIK_GATEWAY_VALUES = {"providers": {"kubernetesGateway": {"enabled": True}},
                          "gateway": {"enabled": False}}


@dataclasses.dataclass(frozen=True)
class K3dClusterArgs:
    name: str
    servers: int
    agents: int
    k3s_image: str
    ports: tuple[tuple[str, int, int], ...]  # (host address, host port, load balancer port)


def create_command(args: K3dClusterArgs) -> str:
    flags = [f"--servers={args.servers}", f"--agents={args.agents}", f"--image={args.k3s_image}",
             # k3d's `[HOST:][HOSTPORT:]CONTAINERPORT@NODEFILTER`: without HOST, Docker binds every interface.
             *(f"--port={address}:{host}:{container}@loadbalancer"
               for address, host, container in args.ports),
             "--kubeconfig-update-default=false", "--wait"]
    return shlex.join(["k3d", "cluster", "create", args.name, *flags])


class K3dCluster(pulumi.ComponentResource):
    """`k3d cluster create` on up and `k3d cluster delete` on destroy; the kubeconfig is a secret."""

    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider
    cluster_id: pulumi.Output[str]  # changes whenever the cluster is created anew

    def __init__(self, name: str, args: K3dClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:K3dCluster", name, None, opts)
        cluster = local.Command(
            f"{name}-cluster",
            create=create_command(args),
            delete=shlex.join(["k3d", "cluster", "delete", args.name]),
            # Any change to the cluster's shape recreates it: k3d cannot change a running cluster, and
            # the new one has the old one's name, so the old one must be deleted first.
            triggers=[create_command(args)],
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )
        kubeconfig = local.Command(
            f"{name}-kubeconfig",
            create=shlex.join(["k3d", "kubeconfig", "get", args.name]),
            logging=local.Logging.NONE,
            triggers=[cluster.id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[cluster],
                                        additional_secret_outputs=["stdout"]),
        )
        self.cluster_id = cluster.id
        self.kubeconfig = pulumi.Output.secret(kubeconfig.stdout)
        self.provider = k8s.Provider(f"{name}-provider", kubeconfig=self.kubeconfig,
                                     opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({"kubeconfig": self.kubeconfig})


def traefik_gateway_provider(name: str, provider: k8s.Provider,
                             opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    """The HelmChartConfig that turns on the packaged Traefik's Gateway API provider."""
    return k8s.apiextensions.CustomResource(
        name, api_version="helm.cattle.io/v1", kind="HelmChartConfig",
        metadata={"name": TRAEFIK_CHART, "namespace": TRAEFIK_NAMESPACE},
        spec={"valuesContent": to_yaml(TRAEFIK_GATEWAY_VALUES)},
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(provider=provider)))
