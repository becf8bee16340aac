"""k3d: k3s in Docker on this machine, images built here and imported, a local-path PVC, and k3s's
packaged Traefik as the Gateway."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from infra.gateway import GatewayPlacement
from infra.images import LocalImages, LocalImagesArgs
from infra.k3d import (
    TRAEFIK_GATEWAY_CLASS,
    TRAEFIK_NAMESPACE,
    TRAEFIK_WEB_PORT,
    TRAEFIK_WEB_SERVICE_PORT,
    K3dCluster,
    K3dClusterArgs,
    traefik_gateway_provider,
)
from infra.storage import PvcStorage, PvcStorageArgs
from stacks.config import K3dStack
from stacks.kinds.base import Cluster, ClusterKind, ImageSource, Storage

FORWARDED_PORT = 8080  # where a port-forward to Traefik listens when no cluster.ports maps to it


class K3dKind(ClusterKind):
    settings = K3dStack

    def cluster(self) -> Cluster:
        config = self.config.cluster
        self._cluster = K3dCluster("cluster", K3dClusterArgs(
            name=config.name, servers=config.servers, agents=config.agents, k3s_image=config.k3s_image,
            ports=tuple((port.host, port.container) for port in config.ports)))
        return Cluster(provider=self._cluster.provider, kubeconfig=self._cluster.kubeconfig)

    def images(self, cluster: Cluster) -> ImageSource:
        cluster_id = self._cluster.cluster_id
        images = LocalImages("images", LocalImagesArgs(
            cluster_name=self.config.cluster.name, cluster=self._cluster, cluster_id=cluster_id))
        return ImageSource(images=images.images, ready=images.imported)

    def storage(self, cluster: Cluster, namespace: k8s.core.v1.Namespace, users: tuple[str, ...]) -> Storage:
        # Any pod in the namespace may mount the claim: no identity to bind.
        config = self.config.storage
        storage = PvcStorage("storage", PvcStorageArgs(
            namespace=self.config.namespace, size=config.size, access_mode=config.access_mode,
            storage_class=config.storage_class, provider=cluster.provider, depends_on=[namespace]))
        return Storage(storage=storage.storage, ready=[storage])

    def gateway(self, cluster: Cluster) -> GatewayPlacement:
        traefik = traefik_gateway_provider("traefik-gateway-provider", cluster.provider,
                                           pulumi.ResourceOptions(depends_on=[self._cluster]))
        host_ports = [port.host for port in self.config.cluster.ports
                      if port.container == TRAEFIK_WEB_SERVICE_PORT]
        if host_ports:  # k3d's load balancer forwards that host port to Traefik's web entry point
            return GatewayPlacement(TRAEFIK_GATEWAY_CLASS, TRAEFIK_WEB_PORT, [traefik],
                                    url=f"http://localhost:{host_ports[0]}")
        return GatewayPlacement(
            TRAEFIK_GATEWAY_CLASS, TRAEFIK_WEB_PORT, [traefik], url=f"http://localhost:{FORWARDED_PORT}",
            address_hint=f"kubectl -n {TRAEFIK_NAMESPACE} port-forward service/traefik "
                         f"{FORWARDED_PORT}:{TRAEFIK_WEB_SERVICE_PORT}")
