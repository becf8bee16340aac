"""The local stack: a k3d cluster on this machine with the whole system on it."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from infra.images import LocalImages, LocalImagesArgs
from infra.k3d import K3dCluster, K3dClusterArgs
from infra.monitoring import Monitoring, MonitoringArgs
from infra.pipeline import PipelineArgs, PipelineResources
from infra.platform import ARGO_NAMESPACE, Platform, PlatformArgs
from infra.serving import Serving, ServingArgs, logger_url
from infra.storage import PvcStorage, PvcStorageArgs
from pipeline.manifests import KSERVE_MODEL_DIR, ClusterTarget
from stacks.config import StackConfig

PORT_FORWARD_PORT = 8080


def define_local_stack(config: StackConfig) -> dict[str, pulumi.Input]:
    """Declares every resource; returns the stack outputs."""
    cluster_config, platform_config = config.cluster, config.platform
    cluster = K3dCluster("cluster", K3dClusterArgs(
        name=cluster_config.name, servers=cluster_config.servers, agents=cluster_config.agents,
        k3s_image=cluster_config.k3s_image,
        ports=tuple((port.host, port.container) for port in cluster_config.ports)))
    on_cluster = pulumi.ResourceOptions(provider=cluster.provider)
    namespace = k8s.core.v1.Namespace("namespace", metadata={"name": config.namespace}, opts=on_cluster)

    images = LocalImages("images", LocalImagesArgs(cluster_name=cluster_config.name, cluster=cluster))
    platform = Platform("platform", PlatformArgs(
        training_operator_version=platform_config.training_operator_version,
        argo_version=platform_config.argo_version,
        cert_manager_version=platform_config.cert_manager_version,
        kserve_version=platform_config.kserve_version,
        kserve_deployment_mode=platform_config.kserve_deployment_mode,
        knative_version=platform_config.knative_version,
        provider=cluster.provider, kubeconfig=cluster.kubeconfig))
    storage = PvcStorage("storage", PvcStorageArgs(
        namespace=config.namespace, size=config.storage.size, access_mode=config.storage.access_mode,
        storage_class=config.storage.storage_class, provider=cluster.provider),
        opts=pulumi.ResourceOptions(depends_on=[namespace]))

    target = ClusterTarget(images=images.images, storage=storage.storage,
                           argo_version=platform_config.argo_version,
                           kserve_deployment_mode=platform_config.kserve_deployment_mode,
                           logger_url=logger_url(config.namespace))
    needs = [*platform.ready, *images.imported, storage, namespace]
    pipeline = PipelineResources("pipeline", PipelineArgs(
        config=config.pipeline, target=target, namespace=config.namespace, run_on_up=config.run_on_up,
        provider=cluster.provider, depends_on=needs))
    serving = Serving("serving", ServingArgs(
        config=config.pipeline, target=target, namespace=config.namespace, provider=cluster.provider,
        depends_on=[*needs, pipeline]))
    if config.monitoring.enabled:
        Monitoring("monitoring", MonitoringArgs(
            chart_version=config.monitoring.kube_prometheus_stack_version, namespace=config.namespace,
            model_name=config.pipeline.model_name, provider=cluster.provider, depends_on=platform.ready))

    model = config.pipeline.model_name
    return {
        "kubeconfig": cluster.kubeconfig,
        "inferenceService": serving.inference_service.metadata["name"],
        "inferencePortForward": f"kubectl -n {config.namespace} port-forward "
                                f"service/{model}-predictor {PORT_FORWARD_PORT}:80",
        "inferenceUrl": f"http://localhost:{PORT_FORWARD_PORT}/v1/models/{model}:predict",
        "modelRepository": storage.storage.model_uri("models", model),
        "modelRepositoryInPredictor": f"{KSERVE_MODEL_DIR}/{model}",
        "argoUi": f"kubectl -n {ARGO_NAMESPACE} port-forward service/argo-server 2746:2746 "
                  "# then open https://localhost:2746",
        "runPipeline": f"argo submit -n {config.namespace} --from workflowtemplate/dist-ml-pipeline --watch",
    }
