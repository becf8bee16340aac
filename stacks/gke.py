"""The GKE stack: the local stack's platform, pipeline and serving on a GKE cluster, with a GCS bucket
through Workload Identity instead of a PVC, images from Artifact Registry by digest, and monitoring."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from infra.gcs import GcsStorage, GcsStorageArgs
from infra.gke import GkeCluster, GkeClusterArgs, NodePoolArgs, node_selector, toleration
from infra.pipeline import PipelineArgs, PipelineResources
from infra.registry import RegistryImages, RegistryImagesArgs
from infra.serving import LOGGER_SERVICE_ACCOUNT, Serving, ServingArgs, logger_url
from pipeline.manifests import PREDICTOR_SERVICE_ACCOUNT, TRAINER_SERVICE_ACCOUNT, ClusterTarget
from stacks.config import GkeConfig, NodePoolConfig, StackConfig
from stacks.shared import access_outputs, declare_monitoring, declare_platform

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


def define_gke_stack(config: StackConfig) -> dict[str, pulumi.Input]:
    cluster_config, platform_config, gcp_config = config.cluster, config.platform, config.gcp
    pools = node_pools(cluster_config)
    # Before the cluster: its nodes are granted reading the repository before they start.
    images = RegistryImages("images", RegistryImagesArgs(project=gcp_config.project,
                                                         region=gcp_config.region))
    cluster = GkeCluster("cluster", GkeClusterArgs(
        project=gcp_config.project, name=cluster_config.name, location=cluster_config.location,
        release_channel=cluster_config.release_channel,
        deletion_protection=cluster_config.deletion_protection, node_pools=pools,
        image_repository=images.repository))
    namespace = k8s.core.v1.Namespace("namespace", metadata={"name": config.namespace},
                                      opts=pulumi.ResourceOptions(provider=cluster.provider))
    platform = declare_platform(config, cluster.provider, cluster.kubeconfig)
    # Every actor that reads or writes the bucket: the workflow's pods (ingest, select), the TFJob
    # pods, the predictor's storage initializer and the request logger.
    bucket_users = (config.pipeline.service_account_name, TRAINER_SERVICE_ACCOUNT,
                    PREDICTOR_SERVICE_ACCOUNT, LOGGER_SERVICE_ACCOUNT)
    storage = GcsStorage("storage", GcsStorageArgs(
        project=gcp_config.project, location=gcp_config.region, bucket_name=config.storage.bucket_name,
        checkpoint_retention_days=config.storage.checkpoint_retention_days, namespace=config.namespace,
        workload_pool=cluster.workload_pool,
        kubernetes_service_accounts=bucket_users))

    # Training pods go to the training pool only; nothing else tolerates the spot and gpu taints.
    training_pool = pools[cluster_config.training_pool]
    tolerations = tuple(toleration(taint) for taint in training_pool.taints)
    target = images.images.apply(lambda built: ClusterTarget(
        images=built, storage=storage.storage, argo_version=platform_config.argo_version,
        logger_url=logger_url(config.namespace),
        training_tolerations=tolerations, training_node_selector=node_selector(cluster_config.training_pool),
        training_gpus=training_pool.gpus))
    uses_bucket = {WORKLOAD_IDENTITY_ANNOTATION: storage.service_account_email}
    needs = [*platform.ready, namespace, storage]
    PipelineResources("pipeline", PipelineArgs(
        config=config.pipeline, target=target, namespace=config.namespace, run_on_up=config.run_on_up,
        provider=cluster.provider, depends_on=needs, service_account_annotations=uses_bucket))
    Serving("serving", ServingArgs(
        target=target, namespace=config.namespace, provider=cluster.provider, depends_on=needs,
        service_account_annotations=uses_bucket))
    monitoring_outputs = declare_monitoring(config, cluster.provider, platform, namespace)
    return {**access_outputs(config, cluster.kubeconfig, storage.storage),
            "images": images.images.apply(lambda built: {"trainer": built.trainer, "serving": built.serving}),
            **monitoring_outputs}
