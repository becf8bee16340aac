"""A k3d cluster (k3s in Docker) on this machine, and a Kubernetes provider bound to it."""

from __future__ import annotations

import dataclasses
import shlex

import pulumi
import pulumi_kubernetes as k8s
from pulumi_command import local


@dataclasses.dataclass(frozen=True)
class K3dClusterArgs:
    name: str
    servers: int
    agents: int
    k3s_image: str
    ports: tuple[tuple[int, int], ...]  # (host port, load balancer port)


def create_command(args: K3dClusterArgs) -> str:
    flags = [f"--servers={args.servers}", f"--agents={args.agents}", f"--image={args.k3s_image}",
             *(f"--port={host}:{container}@loadbalancer" for host, container in args.ports),
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
