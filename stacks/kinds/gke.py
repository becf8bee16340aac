"""GKE: node pools (training on its own pool), images in Artifact Registry by digest, and a GCS
bucket mounted with GCS FUSE, reached through Workload Identity."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from common.cluster_names import GATEWAY_NAME
from infra.gateway import GatewayPlacement
from infra.gcp_apis import GcpApis, GcpApisArgs
from infra.gcs import GcsStorage, GcsStorageArgs
from infra.gke import (
    GATEWAY_CLASS,
    GATEWAY_LISTENER_PORT,
    GkeCluster,
    GkeClusterArgs,
    NodePoolArgs,
    node_selector,
    toleration,
)
from infra.registry import RegistryImages, RegistryImagesArgs
from stacks.config import GkeConfig, GkeStack, NodePoolConfig
from stacks.kinds.base import Cluster, ClusterKind, ImageSource, Storage, TrainingPlacement

WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"


def node_pool(pool: NodePoolConfig, spot: bool = False) -> NodePoolArgs:
    return NodePoolArgs(machine_type=pool.machine_type, min_nodes=pool.min_nodes, max_nodes=pool.max_nodes,
                        spot=spot, accelerator_type=pool.accelerator_type,
                        accelerator_count=pool.accelerator_count)


def node_pools(cluster: GkeConfig) -> dict[str, NodePoolArgs]:
    pools = {"cpu": node_pool(cluster.cpu_pool)}
    if cluster.spot_pool:
        pools["spot"] = node_pool(cluster.spot_pool, spot=True)
    if cluster.gpu_pool:
        pools["gpu"] = node_pool(cluster.gpu_pool)
    return pools


class GkeKind(ClusterKind):
    settings = GkeStack

    def cluster(self) -> Cluster:
        config, gcp = self.config.cluster, self.config.gcp
        self._pools = node_pools(config)
        # First of all: on a fresh project, every other Google resource fails until its API is on.
        self._apis = GcpApis("apis", GcpApisArgs(project=gcp.project))
        # Before the cluster: its nodes are granted reading the repository before they start.
        self._registry = RegistryImages("images", RegistryImagesArgs(project=gcp.project, region=gcp.region),
                                        opts=self._after_apis())
        self._cluster = GkeCluster("cluster", GkeClusterArgs(
            project=gcp.project, name=config.name, location=config.location,
            release_channel=config.release_channel, deletion_protection=config.deletion_protection,
            node_pools=self._pools, image_repository=self._registry.repository), opts=self._after_apis())
        return Cluster(provider=self._cluster.provider, kubeconfig=self._cluster.kubeconfig)

    def images(self, cluster: Cluster) -> ImageSource:
        return ImageSource(images=self._registry.images)

    def storage(self, cluster: Cluster, namespace: k8s.core.v1.Namespace, users: tuple[str, ...]) -> Storage:
        gcp, config = self.config.gcp, self.config.storage
        storage = GcsStorage("storage", GcsStorageArgs(
            project=gcp.project, location=gcp.region, bucket_name=config.bucket_name,
            checkpoint_retention_days=config.checkpoint_retention_days, namespace=self.config.namespace,
            workload_pool=self._cluster.workload_pool, kubernetes_service_accounts=users),
            opts=self._after_apis())
        return Storage(storage=storage.storage, ready=[storage],
                       account_annotations={WORKLOAD_IDENTITY_ANNOTATION: storage.service_account_email})

    def _after_apis(self) -> pulumi.ResourceOptions:
        """The options of a component of Google resources: it registers once the APIs are on, and its
        children, which register after it, wait with it."""
        return pulumi.ResourceOptions(depends_on=[self._apis])

    def training_placement(self) -> TrainingPlacement:
        # Training pods go to the training pool only; nothing else tolerates the spot and gpu taints.
        name = self.config.cluster.training_pool
        pool = self._pools[name]
        return TrainingPlacement(tolerations=tuple(toleration(taint) for taint in pool.taints),
                                 node_selector=node_selector(name), gpus=pool.gpus)

    def gateway(self, cluster: Cluster) -> GatewayPlacement:
        # GKE gives the Gateway a load balancer's address once it has programmed it (minutes).
        address = (f"kubectl -n {self.config.namespace} get gateway {GATEWAY_NAME} "
                   "-o jsonpath='{.status.addresses[0].value}'")
        return GatewayPlacement(GATEWAY_CLASS, GATEWAY_LISTENER_PORT, url="http://<inferenceAddress>",
                                address_hint=address)

    def outputs(self, images: ImageSource) -> dict[str, pulumi.Input]:
        return {"images": pulumi.Output.from_input(images.images).apply(
            lambda built: {"trainer": built.trainer, "serving": built.serving})}
