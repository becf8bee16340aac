"""Serving on the cluster: what the InferenceService needs before a run rolls it out — the predictor's
service account, and the sink of its request logger (a Deployment and Service of `serving.logger`).

The InferenceService itself belongs to the pipeline: its serve step (pipeline.argo) creates it with
the version the run published, so Pulumi never declares one that points at no model or at an older
version than the one serving.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from common.cluster_names import CLUSTER_DOMAIN, CLUSTER_STORAGE_ROOT
from common.cluster_target import IMAGE_USER, PART_OF, PREDICTOR_SERVICE_ACCOUNT, ClusterTarget, storage_mount
from common.pod_security import container_security_context, pod_security_context
from infra.accounts import service_account
from pipeline.config import Resources

LOGGER_NAME = "dist-ml-logger"
LOGGER_SERVICE_ACCOUNT = LOGGER_NAME
LOGGER_PORT = 8080
LOGGER_OUT_DIR = f"{CLUSTER_STORAGE_ROOT}/inference-log"
LOGGER_RESOURCES = Resources(requests={"cpu": "50m", "memory": "128Mi"},
                             limits={"cpu": "250m", "memory": "256Mi"})


def logger_url(namespace: str) -> str:
    return f"http://{LOGGER_NAME}.{namespace}.svc.{CLUSTER_DOMAIN}"


@dataclasses.dataclass(frozen=True)
class ServingArgs:
    target: pulumi.Input[ClusterTarget]  # its logger_url should be logger_url(namespace)
    namespace: str
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]
    # What lets the predictor and the logger use the storage (e.g. a Workload Identity binding).
    service_account_annotations: dict[str, pulumi.Input[str]] = dataclasses.field(default_factory=dict)
    # The system's namespace: `pulumi destroy` deletes these with it (deleted_with), see stacks/compose.py.
    deleted_with: pulumi.Resource | None = None


def logger_deployment_spec(target: ClusterTarget, labels: dict) -> dict:
    """One replica of `serving.logger`, writing closed, rotated files to the storage volume."""
    metadata: dict = {"labels": labels}
    if target.storage.pod_annotations:
        metadata["annotations"] = dict(target.storage.pod_annotations)
    return {
        "replicas": 1,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": metadata,
            "spec": {
                "serviceAccountName": LOGGER_SERVICE_ACCOUNT,
                "securityContext": pod_security_context(IMAGE_USER),  # it writes to the storage volume
                "containers": [{
                    "name": "logger",
                    "image": target.images.serving,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-m", "serving.logger", "--host", "0.0.0.0",
                                "--port", str(LOGGER_PORT), "--out-dir", LOGGER_OUT_DIR],
                    "ports": [{"name": "http", "containerPort": LOGGER_PORT, "protocol": "TCP"}],
                    "volumeMounts": [storage_mount()],
                    "resources": LOGGER_RESOURCES.as_manifest(),
                    "securityContext": container_security_context(),
                }],
                "volumes": [target.storage.volume()],
            },
        },
    }


class Serving(pulumi.ComponentResource):
    def __init__(self, name: str, args: ServingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Serving", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on,
                                            deleted_with=args.deleted_with)
        labels = {"app.kubernetes.io/name": LOGGER_NAME, **PART_OF}
        service_account(f"{name}-predictor-service-account", PREDICTOR_SERVICE_ACCOUNT, args.namespace,
                        args.service_account_annotations, on_cluster)
        logger_account = service_account(f"{name}-logger-service-account", LOGGER_SERVICE_ACCOUNT,
                                         args.namespace, args.service_account_annotations, on_cluster)
        target = pulumi.Output.from_input(args.target)
        logger = k8s.apps.v1.Deployment(
            f"{name}-logger",
            metadata={"name": LOGGER_NAME, "namespace": args.namespace, "labels": labels},
            spec=target.apply(lambda t: logger_deployment_spec(t, labels)),
            opts=pulumi.ResourceOptions.merge(on_cluster,
                                              pulumi.ResourceOptions(depends_on=[logger_account])))
        k8s.core.v1.Service(
            f"{name}-logger-service",
            metadata={"name": LOGGER_NAME, "namespace": args.namespace, "labels": labels},
            spec={"selector": labels,
                  "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]},
            opts=on_cluster)
        self.register_outputs({"logger": logger.metadata["name"]})
