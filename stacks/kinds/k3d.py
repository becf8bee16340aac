"""k3d: k3s in Docker on this machine, images built here and imported, a local-path PVC, and k3s's
packaged Traefik as the Gateway. Its stack config is K3dStack: the `cluster` section (K3dConfig) and
the `storage` section (StorageConfig, a PVC)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, get_args

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field, model_validator

from common.cluster_target import K3S_IMAGE as DEFAULT_K3S_IMAGE
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
from infra.tracking import VolumeBackend
from pipeline.validation import DnsLabel, Quantity, Section, Text, WholeNumber, fail, matching
from stacks.kinds.base import (
    Cluster,
    ClusterKind,
    ImageSource,
    Storage,
    TrackingPlacement,
    TrainingPlacement,
    volume_storage,
)
from stacks.settings import StackSettings, TrainingQuota

K3S_IMAGE_PATTERN = r"^rancher/k3s:v(?P<major>[0-9]+)\.(?P<minor>[0-9]+)\.[0-9]+-k3s[0-9]+$"
Port = Annotated[WholeNumber, Field(ge=1, le=65535)]
K3sImage = matching(K3S_IMAGE_PATTERN, f"a rancher/k3s image like {DEFAULT_K3S_IMAGE}")
OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
Ipv4Address = matching(rf"^{OCTET}(\.{OCTET}){{3}}$", "an IPv4 address like 127.0.0.1")
# Docker publishes a port on this address of the host: loopback keeps the model to this machine;
# 0.0.0.0 (every interface) would publish it to whoever reaches the machine's network.
LOOPBACK = "127.0.0.1"
# The Docker VM (Docker Desktop's, or the machine itself) the local defaults are sized for: the
# platform, serving and two training steps (tests/test_cluster_contracts.py; the control-plane tier's
# node has this capacity).
DOCKER_VM = {"cpu": "4", "memory": "8Gi"}
EVERY_INTERFACE = "0.0.0.0"
AccessMode = Literal["ReadWriteOnce", "ReadWriteMany"]
ACCESS_MODES = get_args(AccessMode)


# --- The stack config -------------------------------------------------------------------------------

class PortMapping(Section):
    host: Port = Field(description="port on this machine")
    host_address: Ipv4Address = Field(
        LOOPBACK, description="address of this machine the port binds to; 0.0.0.0: every interface, "
                              "reachable from the network")
    container: Port = Field(description="port of k3d's load balancer (k3s's Traefik ingress: 80)")


# Asked for GPUs, a k3d stack says why not rather than only that the keys are another kind's.
NO_NODE_POOLS = ("does not apply to cluster.kind k3d: node pools, and with them GPUs, are the gke stack's; "
                 "k3d's nodes are containers on this machine, which train on the CPU trainer image")


class K3dConfig(Section):
    """The `cluster` section of a k3d cluster on this machine."""
    NOT_HERE: ClassVar[dict[str, str]] = {"nodePools": NO_NODE_POOLS, "trainingPool": NO_NODE_POOLS}
    kind: Literal["k3d"] = Field(description="the stack's cluster")
    name: DnsLabel = Field("dist-ml", description="k3d cluster name (kubectl context k3d-<name>)")
    # One server, no agents: local-path volumes are ReadWriteOnce on one node, and every
    # pipeline pod shares the one storage volume, so all of them must run on that node.
    servers: WholeNumber = Field(1, ge=1, description="k3s servers")
    agents: WholeNumber = Field(0, ge=0, description="k3s agents; > 0 needs storage.accessMode ReadWriteMany")
    k3s_image: K3sImage = Field(
        DEFAULT_K3S_IMAGE, alias="k3sImage", description="k3s image; sets the Kubernetes version")
    ports: tuple[PortMapping, ...] = Field((PortMapping(host=8088, container=80),),
                                           description="host port -> k3d load balancer port")
    # Two training steps of Pulumi.local.yaml at a time (2 x 2 workers x 500m CPU, 1Gi) beside serving
    # and the platform, in the Docker VM of DOCKER_VM (tests/test_cluster_contracts.py checks the sum).
    training_quota: TrainingQuota = Field(
        TrainingQuota(cpu="2", memory="4Gi"),
        description="what the cluster holds for training, Kueue's quota (pipeline.engine trainjob)")

    @property
    def kubernetes_version(self) -> str:
        major, minor = self.k3s_image.removeprefix("rancher/k3s:v").split(".")[:2]
        return f"{major}.{minor}"


class StorageConfig(Section):
    """The `storage` section of a k3d cluster: its PVC."""
    size: Quantity = Field("10Gi", description="the PVC holding data, checkpoints, exports and models")
    access_mode: AccessMode = Field("ReadWriteOnce", description="ReadWriteOnce or ReadWriteMany")
    storage_class: Text = Field("local-path", description="storage class (k3s's local-path provisioner)")


class K3dStack(StackSettings):
    """A stack on a k3d cluster."""
    cluster: K3dConfig = Field(description="the k3d cluster")
    storage: StorageConfig = Field(StorageConfig(), description="the PVC every pipeline pod mounts")

    def training_quota(self) -> tuple[dict[str, str], int]:
        return self.cluster.training_quota.as_quota(), 0

    @model_validator(mode="after")
    def _one_node_or_shared_storage(self) -> K3dStack:
        if self.cluster.agents > 0 and self.storage.access_mode != "ReadWriteMany":
            raise fail("pods on several nodes share the storage volume, which needs storage.accessMode "
                       "ReadWriteMany and a storage.storageClass that provides it (k3s's local-path is "
                       "ReadWriteOnce); keep agents 0 otherwise", "cluster.agents")
        return self


# --- The kind ---------------------------------------------------------------------------------------

FORWARDED_PORT = 8080  # where a port-forward to Traefik listens when no cluster.ports maps to it


def host_name(address: str) -> str:
    """How a user on this machine names a host address in a URL."""
    return "localhost" if address in (LOOPBACK, EVERY_INTERFACE) else address


class K3dKind(ClusterKind):
    settings = K3dStack

    def cluster(self) -> Cluster:
        config = self.config.cluster
        self._cluster = K3dCluster("cluster", K3dClusterArgs(
            name=config.name, servers=config.servers, agents=config.agents, k3s_image=config.k3s_image,
            ports=tuple((port.host_address, port.host, port.container) for port in config.ports)))
        return Cluster(provider=self._cluster.provider, kubeconfig=self._cluster.kubeconfig)

    def images(self, cluster: Cluster) -> ImageSource:
        cluster_id = self._cluster.cluster_id
        images = LocalImages("images", LocalImagesArgs(
            cluster_name=self.config.cluster.name, cluster=self._cluster, cluster_id=cluster_id,
            base_image=self.config.images.base_image))
        return ImageSource(images=images.images, ready=images.imported)

    def storage(self, cluster: Cluster, namespace: k8s.core.v1.Namespace, users: tuple[str, ...]) -> Storage:
        return volume_storage(self.config, cluster.provider, namespace)

    def tracking(self, cluster: Cluster, service_account: str) -> TrackingPlacement:
        # SQLite and artifacts on a volume of the server's own, of the stack's storage class.
        return TrackingPlacement(VolumeBackend(storage_class=self.config.storage.storage_class))

    def training_placement(self) -> TrainingPlacement:
        return TrainingPlacement(pool="k3d", quota=self.config.cluster.training_quota.as_quota())

    def gateway(self, cluster: Cluster) -> GatewayPlacement:
        traefik = traefik_gateway_provider("traefik-gateway-provider", cluster.provider,
                                           pulumi.ResourceOptions(depends_on=[self._cluster]))
        mapped = [port for port in self.config.cluster.ports if port.container == TRAEFIK_WEB_SERVICE_PORT]
        if mapped:  # k3d's load balancer forwards that host port to Traefik's web entry point
            return GatewayPlacement(TRAEFIK_GATEWAY_CLASS, TRAEFIK_WEB_PORT, [traefik],
                                    url=f"http://{host_name(mapped[0].host_address)}:{mapped[0].host}")
        return GatewayPlacement(
            TRAEFIK_GATEWAY_CLASS, TRAEFIK_WEB_PORT, [traefik], url=f"http://localhost:{FORWARDED_PORT}",
            address_hint=f"kubectl -n {TRAEFIK_NAMESPACE} port-forward service/traefik "
                         f"{FORWARDED_PORT}:{TRAEFIK_WEB_SERVICE_PORT}")
