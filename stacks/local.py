"""The local stack: a k3d cluster on this machine with the whole system on it."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from infra.images import LocalImages, LocalImagesArgs
from infra.k3d import K3dCluster, K3dClusterArgs
from infra.pipeline import PipelineArgs, PipelineResources
from infra.serving import Serving, ServingArgs, logger_url
from infra.storage import PvcStorage, PvcStorageArgs
from pipeline.manifests import ClusterTarget
from stacks.config import StackConfig
from stacks.shared import access_outputs, declare_monitoring, declare_platform


def define_local_stack(config: StackConfig) -> dict[str, pulumi.Input]:
    """Declares every resource; returns the stack outputs."""
    cluster_config, platform_config = config.cluster, config.platform
    cluster = K3dCluster("cluster", K3dClusterArgs(
        name=cluster_config.name, servers=cluster_config.servers, agents=cluster_config.agents,
        k3s_image=cluster_config.k3s_image,
        ports=tuple((port.host, port.container) for port in cluster_config.ports)))
    on_cluster = pulumi.ResourceOptions(provider=cluster.provider)
    namespace = k8s.core.v1.Namespace("namespace", metadata={"name": config.namespace}, opts=on_cluster)

    images = LocalImages("images", LocalImagesArgs(cluster_name=cluster_config.name, cluster=cluster,
                                                       cluster_id=cluster.cluster_id))
    platform = declare_platform(config, cluster.provider, cluster.kubeconfig)
    storage = PvcStorage("storage", PvcStorageArgs(
        namespace=config.namespace, size=config.storage.size, access_mode=config.storage.access_mode,
        storage_class=config.storage.storage_class, provider=cluster.provider, depends_on=[namespace]))

    target = ClusterTarget(images=images.images, storage=storage.storage,
                           argo_version=platform_config.argo_version, logger_url=logger_url(config.namespace))
    needs = [*platform.ready, *images.imported, storage, namespace]
    PipelineResources("pipeline", PipelineArgs(
        config=config.pipeline, target=target, namespace=config.namespace, run_on_up=config.run_on_up,
        provider=cluster.provider, depends_on=needs))
    Serving("serving", ServingArgs(target=target, namespace=config.namespace, provider=cluster.provider,
                                   depends_on=needs))
    monitoring_outputs = declare_monitoring(config, cluster.provider, platform, namespace)
    return {**access_outputs(config, cluster.kubeconfig, storage.storage),
            **monitoring_outputs}
