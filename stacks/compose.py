"""The one composition of every stack: a cluster kind (stacks/kinds/) declares the cluster, images,
storage, identity and Gateway class; this declares the rest the same way on every kind — the system's
namespace, the platform, the pipeline's resources, serving, the Gateway, monitoring — and the stack
outputs that tell a user how to reach the system."""

from __future__ import annotations

import posixpath

import pulumi
import pulumi_kubernetes as k8s

from common.cluster_names import route_name
from common.cluster_target import (
    GPU_RESOURCE,
    PREDICTOR_SERVICE_ACCOUNT,
    TRAINER_SERVICE_ACCOUNT,
    ClusterStorage,
    ClusterTarget,
)
from common.pod_security import enforcing_labels
from common.tracking_names import server_uri
from engines import ENGINES
from engines.base import QueuePlacement
from infra.gateway import Gateway, GatewayArgs, GatewayPlacement
from infra.monitoring import NAMESPACE as MONITORING_NAMESPACE
from infra.monitoring import Monitoring, MonitoringArgs, prometheus_url, release_name
from infra.pipeline import PipelineArgs, PipelineResources
from infra.platform import Platform
from infra.queue import TrainingQueue, TrainingQueueArgs
from infra.serving import LOGGER_SERVICE_ACCOUNT, Serving, ServingArgs, logger_url
from infra.tracking import SERVER_ACCOUNT, TrackingServer, TrackingServerArgs
from pipeline.argo import ARGO_NAMESPACE
from pipeline.definition import Layout
from stacks.installs import MONITORING, REPO_ROOT, platform_args
from stacks.kinds import KINDS
from stacks.kinds.base import Cluster, ClusterKind, ImageSource
from stacks.settings import StackConfig


def storage_users(config: StackConfig) -> tuple[str, ...]:
    """Every service account whose pods read or write the storage: the workflow's pods (ingest,
    select), the training pods, the predictor's storage initializer and the request logger."""
    return (config.pipeline.service_account_name, TRAINER_SERVICE_ACCOUNT, PREDICTOR_SERVICE_ACCOUNT,
            LOGGER_SERVICE_ACCOUNT)


def define_stack(config: StackConfig) -> dict[str, pulumi.Input]:
    """Declares every resource of the stack; returns its outputs."""
    kind = KINDS[config.cluster_kind](config)
    cluster = kind.cluster()
    # Every pod of ours runs here (the workflow's steps, training, the predictors, the request logger,
    # the tracking server): the API server refuses any that does not meet `restricted`.
    platform = Platform("platform", platform_args(config, cluster.provider))
    # After the platform, so that `pulumi destroy` deletes it first: what the workflow made in it
    # (InferenceServices, TrainJobs, Workflows) carries finalizers the platform's controllers remove.
    # Every object of ours in it is deleted with it (deleted_with): the namespace controller deletes the
    # workflow's pods before the claims they mount, which one by one would wait on them for ever.
    namespace = k8s.core.v1.Namespace("namespace", metadata={
        "name": config.namespace, "labels": enforcing_labels(config.cluster.kubernetes_version)},
        opts=pulumi.ResourceOptions(provider=cluster.provider, depends_on=[platform]))
    images = kind.images(cluster)
    storage = kind.storage(cluster, namespace, storage_users(config))
    placement = kind.training_placement()
    engine = ENGINES[config.pipeline.engine]
    if engine.queued:
        TrainingQueue("training-queue", TrainingQueueArgs(
            engine=engine, placement=QueuePlacement(
                placement.pool, placement.node_selector, placement.tolerations, placement.quota,
                provisioning_class=placement.provisioning_class,
                provisioned_resources=(GPU_RESOURCE,) if placement.gpus else ()),
            namespace=config.namespace, provider=cluster.provider, depends_on=[*platform.ready, namespace],
            deleted_with=namespace))
    needs = [*platform.ready, *images.ready, *storage.ready, namespace]
    tracking_uri = declare_tracking(config, kind, cluster, images, namespace, images.ready)
    target = pulumi.Output.from_input(images.images).apply(lambda built: ClusterTarget(
        images=built, storage=storage.storage, argo_version=config.platform.argo_version,
        logger_url=logger_url(config.namespace), prometheus_url=cluster_prometheus(config),
        training_tolerations=placement.tolerations,
        training_node_selector=placement.node_selector, training_gpus=placement.gpus,
        tracking_uri=tracking_uri))
    PipelineResources("pipeline", PipelineArgs(
        config=config.pipeline, target=target, namespace=config.namespace, run_on_up=config.run_on_up,
        provider=cluster.provider, depends_on=needs, service_account_annotations=storage.account_annotations,
        deleted_with=namespace))
    Serving("serving", ServingArgs(
        target=target, namespace=config.namespace, provider=cluster.provider, depends_on=needs,
        service_account_annotations=storage.account_annotations, deleted_with=namespace))
    gateway = kind.gateway(cluster)
    Gateway("gateway", GatewayArgs(placement=gateway, namespace=config.namespace, provider=cluster.provider,
                                   kubeconfig=cluster.kubeconfig, depends_on=[namespace],
                                   deleted_with=namespace))
    return {**access_outputs(config, cluster.kubeconfig, storage.storage, gateway), **kind.outputs(images),
            **declare_monitoring(config, cluster.provider, platform, namespace)}


def declare_tracking(config: StackConfig, kind: ClusterKind, cluster: Cluster, images: ImageSource,
                     namespace: k8s.core.v1.Namespace, needs: list[pulumi.Resource]) -> str | None:
    """Where the pipeline's pods track (None: nowhere): `pipeline.tracking.uri` when the stack names a
    server of its own, else the tracking server this declares with the kind's backend."""
    tracking = config.pipeline.tracking
    if not tracking.enabled:
        return None
    if tracking.uri is not None:
        return tracking.uri
    placement = kind.tracking(cluster, SERVER_ACCOUNT)
    TrackingServer("tracking", TrackingServerArgs(
        image=pulumi.Output.from_input(images.images).apply(lambda built: built.tracking_server),
        namespace=config.namespace, backend=placement.backend, provider=cluster.provider,
        depends_on=[*needs, namespace, *placement.ready],
        service_account_annotations=placement.account_annotations, deleted_with=namespace))
    return server_uri(config.namespace)




def cluster_prometheus(config: StackConfig) -> str | None:
    """Where the predictor's load is read from: the stack's Prometheus (or the cluster's own), if it
    has monitoring."""
    if not config.monitoring.enabled:
        return None
    return config.monitoring.prometheus_url or prometheus_url(MONITORING)


def declare_monitoring(config: StackConfig, provider: k8s.Provider, platform: Platform,
                       namespace: k8s.core.v1.Namespace) -> dict[str, str]:
    """Monitoring when config enables it (its monitors go in the platform's and the system's
    namespaces); returns its stack outputs (none when disabled)."""
    if not config.monitoring.enabled:
        return {}
    own = config.monitoring.prometheus_url is None
    Monitoring(MONITORING, MonitoringArgs(
        chart_version=config.monitoring.kube_prometheus_stack_version, namespace=config.namespace,
        model_name=config.pipeline.model_name, runtime=config.pipeline.serving.runtime,
        engine=ENGINES[config.pipeline.engine], provider=provider,
        depends_on=[*platform.ready, namespace], sources=config.platform.sources(REPO_ROOT),
        own_prometheus=own, deleted_with=namespace))
    if not own:
        return {}
    return {"grafana": f"kubectl -n {MONITORING_NAMESPACE} port-forward "
                       f"service/{release_name(MONITORING)}-grafana 3000:80"}


def access_outputs(config: StackConfig, kubeconfig: pulumi.Input[str] | None, storage: ClusterStorage,
                   gateway: GatewayPlacement) -> dict[str, pulumi.Input]:
    """How a user reaches the system. Requests go through the Gateway, whose route splits them
    between the stable and the canary version: never straight to one predictor."""
    model = config.pipeline.model_name
    address = {"inferenceAddress": gateway.address_hint} if gateway.address_hint else {}
    return {
        **({"kubeconfig": kubeconfig} if kubeconfig is not None else {}),
        # The pipeline's serve step creates them, with the version the run published.
        "inferenceService": f"{config.namespace}/{model}",
        "inferenceRoute": f"{config.namespace}/{route_name(model)}",
        "inferenceUrl": pulumi.Output.concat(gateway.url, f"/v1/models/{model}:predict"),
        **address,
        "modelRepository": posixpath.join(Layout(storage.uri).models, model),
        "argoUi": f"kubectl -n {ARGO_NAMESPACE} port-forward service/argo-server 2746:2746 "
                  "# then open https://localhost:2746",
        "runPipeline": f"argo submit -n {config.namespace} --from workflowtemplate/dist-ml-pipeline --watch",
    }
