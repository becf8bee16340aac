"""Serving on the cluster: the InferenceService of the published model (rendered by
pipeline.manifests, as the pipeline's serve step applies it) and the sink of its request logger."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from infra.awaits import SKIP_AWAIT
from pipeline.config import PipelineConfig, Resources
from pipeline.definition import CLUSTER_STORAGE_ROOT
from pipeline.manifests import ISVC_API_VERSION, PART_OF, ClusterTarget, inference_service, storage_mount

LOGGER_NAME = "dist-ml-logger"
LOGGER_PORT = 8080
LOGGER_OUT = f"{CLUSTER_STORAGE_ROOT}/inference-log/events.jsonl"
LOGGER_RESOURCES = Resources(requests={"cpu": "50m", "memory": "128Mi"},
                             limits={"cpu": "250m", "memory": "256Mi"})


def logger_url(namespace: str) -> str:
    return f"http://{LOGGER_NAME}.{namespace}.svc.cluster.local"


@dataclasses.dataclass(frozen=True)
class ServingArgs:
    config: PipelineConfig
    target: pulumi.Input[ClusterTarget]  # its logger_url should be logger_url(namespace)
    namespace: str
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]
    # The predictor's own service account, created here when set (target.predictor_service_account).
    predictor_service_account: str | None = None
    predictor_service_account_annotations: dict[str, pulumi.Input[str]] = dataclasses.field(
        default_factory=dict)


def logger_deployment_spec(config: PipelineConfig, target: ClusterTarget, labels: dict) -> dict:
    """One replica of `serving.logger`, appending to the storage volume as the pipeline's account."""
    metadata: dict = {"labels": labels}
    if target.storage.pod_annotations:
        metadata["annotations"] = dict(target.storage.pod_annotations)
    return {
        "replicas": 1,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": metadata,
            "spec": {
                "serviceAccountName": config.service_account_name,
                "containers": [{
                    "name": "logger",
                    "image": target.images.serving,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-m", "serving.logger", "--host", "0.0.0.0",
                                "--port", str(LOGGER_PORT), "--out", LOGGER_OUT],
                    "ports": [{"containerPort": LOGGER_PORT, "protocol": "TCP"}],
                    "volumeMounts": [storage_mount()],
                    "resources": LOGGER_RESOURCES.as_manifest(),
                }],
                "volumes": [target.storage.volume()],
            },
        },
    }


class Serving(pulumi.ComponentResource):
    inference_service: k8s.apiextensions.CustomResource

    def __init__(self, name: str, args: ServingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Serving", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)
        labels = {"app.kubernetes.io/name": LOGGER_NAME, **PART_OF}
        target = pulumi.Output.from_input(args.target)
        logger = k8s.apps.v1.Deployment(
            f"{name}-logger",
            metadata={"name": LOGGER_NAME, "namespace": args.namespace, "labels": labels},
            spec=target.apply(lambda t: logger_deployment_spec(args.config, t, labels)),
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on))
        k8s.core.v1.Service(
            f"{name}-logger-service",
            metadata={"name": LOGGER_NAME, "namespace": args.namespace, "labels": labels},
            spec={"selector": labels,
                  "ports": [{"name": "http", "port": 80, "targetPort": LOGGER_PORT, "protocol": "TCP"}]},
            opts=on_cluster)

        needs = [*args.depends_on, logger]
        if args.predictor_service_account:
            needs.append(k8s.core.v1.ServiceAccount(
                f"{name}-predictor-service-account",
                metadata={"name": args.predictor_service_account, "namespace": args.namespace,
                          "labels": PART_OF, "annotations": args.predictor_service_account_annotations},
                opts=on_cluster))
        manifest = target.apply(lambda t: inference_service(args.config, t))
        self.inference_service = k8s.apiextensions.CustomResource(
            f"{name}-inference-service",
            api_version=ISVC_API_VERSION, kind="InferenceService",
            metadata=manifest["metadata"].apply(lambda metadata: {
                **metadata, "namespace": args.namespace,
                "annotations": {**metadata.get("annotations", {}), **SKIP_AWAIT}}),
            spec=manifest["spec"],
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=needs))
        self.register_outputs({"inferenceService": self.inference_service.metadata["name"]})
