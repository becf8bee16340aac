"""Serving on the cluster: the InferenceService of the published model (rendered by
pipeline.manifests, as the pipeline's serve step applies it) and the sink of its request logger."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from pipeline.config import PipelineConfig, Resources
from pipeline.definition import CLUSTER_STORAGE_ROOT
from pipeline.manifests import PART_OF, ClusterTarget, inference_service, storage_mount

LOGGER_NAME = "dist-ml-logger"
LOGGER_PORT = 8080
LOGGER_OUT = f"{CLUSTER_STORAGE_ROOT}/inference-log/events.jsonl"
LOGGER_RESOURCES = Resources(requests={"cpu": "50m", "memory": "128Mi"},
                             limits={"cpu": "250m", "memory": "256Mi"})
# A new InferenceService has no model to load until the pipeline publishes one: `pulumi up`
# must not wait for it to become Ready.
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}


def logger_url(namespace: str) -> str:
    return f"http://{LOGGER_NAME}.{namespace}.svc.cluster.local"


@dataclasses.dataclass(frozen=True)
class ServingArgs:
    config: PipelineConfig
    target: ClusterTarget  # its logger_url should be logger_url(namespace)
    namespace: str
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]


class Serving(pulumi.ComponentResource):
    inference_service: k8s.apiextensions.CustomResource

    def __init__(self, name: str, args: ServingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Serving", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)
        labels = {"app.kubernetes.io/name": LOGGER_NAME, **PART_OF}
        logger = k8s.apps.v1.Deployment(
            f"{name}-logger",
            metadata={"name": LOGGER_NAME, "namespace": args.namespace, "labels": labels},
            spec={
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [{
                            "name": "logger",
                            "image": args.target.images.serving,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python", "-m", "serving.logger", "--host", "0.0.0.0",
                                        "--port", str(LOGGER_PORT), "--out", LOGGER_OUT],
                            "ports": [{"containerPort": LOGGER_PORT, "protocol": "TCP"}],
                            "volumeMounts": [storage_mount()],
                            "resources": LOGGER_RESOURCES.as_manifest(),
                        }],
                        "volumes": [args.target.storage.volume()],
                    },
                },
            },
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on))
        k8s.core.v1.Service(
            f"{name}-logger-service",
            metadata={"name": LOGGER_NAME, "namespace": args.namespace, "labels": labels},
            spec={"selector": labels,
                  "ports": [{"name": "http", "port": 80, "targetPort": LOGGER_PORT, "protocol": "TCP"}]},
            opts=on_cluster)

        manifest = inference_service(args.config, args.target)
        metadata = manifest["metadata"]
        self.inference_service = k8s.apiextensions.CustomResource(
            f"{name}-inference-service",
            api_version=manifest["apiVersion"], kind=manifest["kind"],
            metadata={**metadata, "namespace": args.namespace,
                      "annotations": {**metadata.get("annotations", {}), **SKIP_AWAIT}},
            spec=manifest["spec"],
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider,
                                        depends_on=[*args.depends_on, logger]))
        self.register_outputs({"inferenceService": self.inference_service.metadata["name"]})
