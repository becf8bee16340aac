"""The one composition of every stack: a cluster kind (stacks/kinds/) declares the cluster, images,
storage and identity; this declares the rest the same way on every kind — the system's namespace, the
platform, the pipeline's resources, serving, monitoring — and the stack outputs that tell a user how to
reach the system."""

from __future__ import annotations

import posixpath

import pulumi
import pulumi_kubernetes as k8s

from infra.monitoring import NAMESPACE as MONITORING_NAMESPACE
from infra.monitoring import Monitoring, MonitoringArgs
from infra.pipeline import PipelineArgs, PipelineResources
from infra.platform import Platform, PlatformArgs
from infra.serving import LOGGER_SERVICE_ACCOUNT, Serving, ServingArgs, logger_url
from pipeline.argo import ARGO_NAMESPACE
from pipeline.definition import Layout
from pipeline.manifests import (
    PREDICTOR_SERVICE_ACCOUNT,
    TRAINER_SERVICE_ACCOUNT,
    ClusterStorage,
    ClusterTarget,
)
from stacks.config import StackConfig
from stacks.kinds import KINDS


def storage_users(config: StackConfig) -> tuple[str, ...]:
    """Every service account whose pods read or write the storage: the workflow's pods (ingest,
    select), the TFJob pods, the predictor's storage initializer and the request logger."""
    return (config.pipeline.service_account_name, TRAINER_SERVICE_ACCOUNT, PREDICTOR_SERVICE_ACCOUNT,
            LOGGER_SERVICE_ACCOUNT)


def define_stack(config: StackConfig) -> dict[str, pulumi.Input]:
    """Declares every resource of the stack; returns its outputs."""
    kind = KINDS[config.cluster_kind](config)
    cluster = kind.cluster()
    namespace = k8s.core.v1.Namespace("namespace", metadata={"name": config.namespace},
                                      opts=pulumi.ResourceOptions(provider=cluster.provider))
    images = kind.images(cluster)
    platform = declare_platform(config, cluster.provider, cluster.kubeconfig)
    storage = kind.storage(cluster, namespace, storage_users(config))
    placement = kind.training_placement()
    target = pulumi.Output.from_input(images.images).apply(lambda built: ClusterTarget(
        images=built, storage=storage.storage, argo_version=config.platform.argo_version,
        logger_url=logger_url(config.namespace), training_tolerations=placement.tolerations,
        training_node_selector=placement.node_selector, training_gpus=placement.gpus))
    needs = [*platform.ready, *images.ready, *storage.ready, namespace]
    PipelineResources("pipeline", PipelineArgs(
        config=config.pipeline, target=target, namespace=config.namespace, run_on_up=config.run_on_up,
        provider=cluster.provider, depends_on=needs, service_account_annotations=storage.account_annotations))
    Serving("serving", ServingArgs(
        target=target, namespace=config.namespace, provider=cluster.provider, depends_on=needs,
        service_account_annotations=storage.account_annotations))
    return {**access_outputs(config, cluster.kubeconfig, storage.storage), **kind.outputs(images),
            **declare_monitoring(config, cluster.provider, platform, namespace)}


def declare_platform(config: StackConfig, provider: k8s.Provider, kubeconfig: pulumi.Input[str]) -> Platform:
    versions = config.platform
    return Platform("platform", PlatformArgs(
        training_operator_version=versions.training_operator_version,
        argo_version=versions.argo_version,
        cert_manager_version=versions.cert_manager_version,
        kserve_version=versions.kserve_version,
        provider=provider, kubeconfig=kubeconfig))


PORT_FORWARD_PORT = 8080


def declare_monitoring(config: StackConfig, provider: k8s.Provider, platform: Platform,
                       namespace: k8s.core.v1.Namespace) -> dict[str, str]:
    """Monitoring when config enables it (its monitors go in the platform's and the system's
    namespaces); returns its stack outputs (none when disabled)."""
    if not config.monitoring.enabled:
        return {}
    Monitoring("monitoring", MonitoringArgs(
        chart_version=config.monitoring.kube_prometheus_stack_version, namespace=config.namespace,
        model_name=config.pipeline.model_name, runtime=config.pipeline.serving.runtime, provider=provider,
        depends_on=[*platform.ready, namespace]))
    return {"grafana": f"kubectl -n {MONITORING_NAMESPACE} port-forward "
                       "service/monitoring-kube-prometheus-stack-grafana 3000:80"}


def access_outputs(config: StackConfig, kubeconfig: pulumi.Input[str],
                   storage: ClusterStorage) -> dict[str, pulumi.Input]:
    model = config.pipeline.model_name
    return {
        "kubeconfig": kubeconfig,
        # The pipeline's serve step creates it, with the version the run published.
        "inferenceService": f"{config.namespace}/{model}",
        "inferencePortForward": f"kubectl -n {config.namespace} port-forward "
                                f"service/{model}-predictor {PORT_FORWARD_PORT}:80",
        "inferenceUrl": f"http://localhost:{PORT_FORWARD_PORT}/v1/models/{model}:predict",
        "modelRepository": posixpath.join(Layout(storage.uri).models, model),
        "argoUi": f"kubectl -n {ARGO_NAMESPACE} port-forward service/argo-server 2746:2746 "
                  "# then open https://localhost:2746",
        "runPipeline": f"argo submit -n {config.namespace} --from workflowtemplate/dist-ml-pipeline --watch",
    }
