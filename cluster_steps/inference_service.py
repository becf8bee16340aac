"""The InferenceService's shape, in one home: how one is written (the Argo renderer's serve step gives
it a PredictorSpec, pipeline/argo.py) and how the rollout steps read it back (cluster_steps.release):
its version, its release's URI, the port its /metrics are on, and the same service under the canary's
name. No field path of it is written anywhere else.

The predictor runs KServe's TF Serving or our server (the serving image) in Standard mode (Deployments;
no Knative), scaled by KServe's HPA on cpu or memory, or by KEDA on its own load in Prometheus.
"""

from __future__ import annotations

import copy
import dataclasses

from common.cluster_names import (
    ISVC_GROUP,
    ISVC_METRIC_LABEL,
    ISVC_VERSION,
    MODEL_VERSION_ANNOTATION,
    PREDICTOR_CONTAINER,
    load_query,
    retargeted_query,
)
from common.cluster_target import PART_OF, PREDICTOR_SERVICE_ACCOUNT
from common.pod_security import container_security_context, pod_security_context

ISVC_API_VERSION = f"{ISVC_GROUP}/{ISVC_VERSION}"
KSERVE_MODEL_DIR = "/mnt/models"  # where KServe puts what storageUri points at
SERVING_HTTP_PORT = 8080  # KServe routes to this port of the predictor
# The HTTP port's name in the InferenceService: KServe names the predictor's Service port after it
# (Standard mode), and Prometheus scrapes /metrics there.
PREDICTOR_PORT_NAME = "http1"
# gRPC v2 (ModelInfer) on a second container port. In Standard mode KServe v0.20 exposes every
# container port after the first on the predictor's Service at its own number, with appProtocol
# kubernetes.io/h2c when its name contains "grpc" or "h2c" (service_reconciler.go, createDefaultSvc
# and isGrpcPort); only the first port goes through the agent, and so its logger
# (agent_injector.go: componentPort = Ports[0]).
SERVING_GRPC_PORT = 8081
GRPC_PORT_NAME = "h2c"
DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
STANDARD_MODE = "Standard"  # Deployments and HPAs; the stacks install no Knative
# Who scales the predictor (KServe v0.20 pkg/constants/constants.go AutoscalerClass): KServe's HPA on
# cpu or memory, or a KEDA ScaledObject on the load, which KServe writes from spec.predictor.autoScaling
# (reconcilers/keda/keda_reconciler.go). Named even for hpa, KServe's default, as KServe's webhook
# checks a component's scaling fields only when the class is named (inference_service_validation.go
# validateAutoScalingCompExtension).
AUTOSCALER_CLASS_ANNOTATION = "serving.kserve.io/autoscalerClass"
HPA_CLASS, KEDA_CLASS = "hpa", "keda"
# KEDA's Prometheus scaler reads the query's one value against target.value per replica (KServe
# writes no metricType, and KEDA's default is AverageValue); KServe requires target.value set, whatever
# the type (validateScalingKedaCompExtension), and copies it as the trigger's threshold string.
PROMETHEUS_BACKEND = "prometheus"
# A version change rolls the predictor's Deployment without dropping a request. KServe
# v0.20 (raw mode) takes spec.predictor.deploymentStrategy over its default 25%/25% RollingUpdate.
MAX_UNAVAILABLE = 0  # no old pod stops before a new one is ready: serving capacity never dips
MAX_SURGE = 1  # one new pod at a time: the cluster needs room for one extra predictor only
# Our server answers KServe's v2 model-ready route with 200 only once the model is loaded (503
# before); KServe's default probe (TCP on the first port) would pass as soon as the port listens.
READINESS_PERIOD_SECONDS = 5
READINESS_FAILURE_THRESHOLD = 3  # 15 s of failed checks before a pod leaves the endpoints
# Endpoints, kube-proxy and the Gateway's Envoy learn a terminating pod is gone within seconds:
# the server keeps answering this long before it gets SIGTERM, so nothing is sent to a closed port.
PRESTOP_SLEEP_SECONDS = 10
# The longest request: the client's timeout (serving/client.py TIMEOUT_SECONDS); the server sets none
# of its own, so a request still running after it has no one waiting for it.
LONGEST_REQUEST_SECONDS = 30
# Kubernetes counts the preStop hook in the grace period: after the sleep, SIGTERM, then the
# in-flight requests finish within LONGEST_REQUEST_SECONDS (and a margin) before SIGKILL.
TERMINATION_GRACE_SECONDS = PRESTOP_SLEEP_SECONDS + LONGEST_REQUEST_SECONDS + 5
# KServe v0.20's TF Serving runtime defaults to 2.6.2, years older than the TensorFlow that exports
# our SavedModel; serving is no older than the exporter (trainer.serving_contract.EXPORTER_TENSORFLOW).
TF_SERVING_VERSION = "2.21.0"
CUSTOM_RUNTIME = "custom"  # serving.runtime: our server; else KServe's TF Serving
NO_METRICS = (
    "serves no /metrics (runtime tensorflow?): a canary cannot be judged; deploy with --canary-percent 0"
)


class ShapeError(ValueError):
    """An InferenceService lacks what a rollout reads of it; the message names it."""


@dataclasses.dataclass(frozen=True)
class Scaling:
    """How the predictor scales: on cpu or memory (KServe's HPA), or on a load metric (KEDA)."""

    metric: str
    target: int
    on_load: bool  # a load metric (requests in flight or per second), read from Prometheus
    scale_down_stabilization_seconds: int


@dataclasses.dataclass(frozen=True)
class PredictorSpec:
    """Everything an InferenceService is made of: one published `version` (a number, or Argo's
    placeholder for it) of `model_name`, in `namespace` (a name, or Argo's placeholder)."""

    model_name: str
    version: str
    namespace: str
    storage_uri: str  # the release's: a directory holding only `<version>/`
    runtime: str  # CUSTOM_RUNTIME, or tensorflow (KServe's TF Serving)
    runtime_version: str | None
    image: str  # our server's (the serving image)
    server_args: tuple[str, ...]  # our server's flags, but its ports and model directory
    resources: dict
    min_replicas: int
    max_replicas: int
    scaling: Scaling
    prometheus_url: str | None  # where KEDA reads the load; required for a load metric
    logger_url: str | None = None  # where KServe's logger posts CloudEvents, and ours the gRPC ones


def grpc_flags(logger_url: str | None) -> list[str]:
    """The server's gRPC port, and with a logger the server's own log of gRPC requests to the same
    URL: KServe's logger sees only HTTP, so each request is logged once whatever its protocol."""
    flags = ["--grpc-port", str(SERVING_GRPC_PORT)]
    if logger_url:
        flags += ["--log-url", logger_url, "--log-grpc-only"]
    return flags


def model_ready_path(model_name: str) -> str:
    """KServe's v2 model-ready route (kserve/protocol/rest/v2_endpoints.py): 200 once the model is
    loaded, 503 before. /v2/health/ready is not it: without a transformer it answers 200 always."""
    return f"/v2/models/{model_name}/ready"


def scaling_fields(spec: PredictorSpec) -> tuple[str, dict]:
    """The autoscaler class and the predictor's scaling fields: KServe's HPA (scaleMetric, scaleTarget),
    or KEDA on the InferenceService's own load in Prometheus (autoScaling, whose query selects its pods
    only: `renamed` retargets it with the canary)."""
    scaling = spec.scaling
    replicas = {"minReplicas": spec.min_replicas, "maxReplicas": spec.max_replicas}
    if not scaling.on_load:
        return HPA_CLASS, {**replicas, "scaleMetric": scaling.metric, "scaleTarget": scaling.target}
    external = {
        "metric": {
            "backend": PROMETHEUS_BACKEND,
            "serverAddress": spec.prometheus_url,
            "query": load_query(scaling.metric, spec.namespace, spec.model_name),
        },
        "target": {"type": "Value", "value": str(scaling.target)},
    }
    behavior = {"scaleDown": {"stabilizationWindowSeconds": scaling.scale_down_stabilization_seconds}}
    return KEDA_CLASS, {
        **replicas,
        "autoScaling": {"metrics": [{"type": "External", "external": external}], "behavior": behavior},
    }


def inference_service(spec: PredictorSpec) -> dict:
    """The InferenceService serving `spec`'s version. A new version changes the predictor's pods, so
    every replica rolls to it."""
    autoscaler_class, scaling = scaling_fields(spec)
    predictor: dict = {
        **scaling,
        "serviceAccountName": PREDICTOR_SERVICE_ACCOUNT,
        # Both runtimes: these are the predictor's (the Deployment's and its PodSpec's), not the container's.
        "deploymentStrategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": MAX_UNAVAILABLE, "maxSurge": MAX_SURGE},
        },
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        # The predictor reads its model: no volume of it needs the images' group.
        "securityContext": pod_security_context(),
    }
    if spec.logger_url:
        predictor["logger"] = {"mode": "all", "url": spec.logger_url}
    if spec.runtime != CUSTOM_RUNTIME:
        predictor["model"] = {
            "modelFormat": {"name": "tensorflow"},
            "storageUri": spec.storage_uri,
            "runtimeVersion": spec.runtime_version or TF_SERVING_VERSION,
            "resources": spec.resources,
            # Merged over the runtime's container, whose runAsUser (TF Serving's image names no user)
            # stays (v0.20.0 config/runtimes/kserve-tensorflow-serving.yaml).
            "securityContext": container_security_context(),
        }
    else:
        predictor["containers"] = [
            {
                "name": PREDICTOR_CONTAINER,
                "image": spec.image,
                "imagePullPolicy": "IfNotPresent",
                "args": [
                    "--model-base-path",
                    KSERVE_MODEL_DIR,
                    *spec.server_args,
                    "--http-port",
                    str(SERVING_HTTP_PORT),
                    *grpc_flags(spec.logger_url),
                ],
                # A custom container gets its model through the storage initializer, as built-in ones do.
                "env": [{"name": "STORAGE_URI", "value": spec.storage_uri}],
                "ports": [
                    {"name": PREDICTOR_PORT_NAME, "containerPort": SERVING_HTTP_PORT, "protocol": "TCP"},
                    {"name": GRPC_PORT_NAME, "containerPort": SERVING_GRPC_PORT, "protocol": "TCP"},
                ],
                "resources": spec.resources,
                "readinessProbe": {
                    "httpGet": {"path": model_ready_path(spec.model_name), "port": SERVING_HTTP_PORT},
                    "periodSeconds": READINESS_PERIOD_SECONDS,
                    "failureThreshold": READINESS_FAILURE_THRESHOLD,
                },
                "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
                # KServe's agent (the request logger's sidecar) copies it (v0.20.0
                # pkg/webhook/admission/pod/agent_injector.go).
                "securityContext": container_security_context(),
            }
        ]
    return {
        "apiVersion": ISVC_API_VERSION,
        "kind": "InferenceService",
        "metadata": {
            "name": spec.model_name,
            "labels": dict(PART_OF),
            "annotations": {
                DEPLOYMENT_MODE_ANNOTATION: STANDARD_MODE,
                AUTOSCALER_CLASS_ANNOTATION: autoscaler_class,
                MODEL_VERSION_ANNOTATION: spec.version,
            },
        },
        "spec": {"predictor": predictor},
    }


# --- Reading one back ------------------------------------------------------------------------------


def storage_uri(manifest: dict) -> str:
    """The release the InferenceService serves."""
    predictor = manifest["spec"]["predictor"]
    if "model" in predictor:
        return predictor["model"]["storageUri"]
    env = {item["name"]: item.get("value") for item in predictor["containers"][0].get("env", [])}
    return env["STORAGE_URI"]


def model_version(manifest: dict) -> str:
    return manifest["metadata"].get("annotations", {}).get(MODEL_VERSION_ANNOTATION, "?")


def metrics_port(manifest: dict) -> int:
    """The predictor container's HTTP port, where our server serves /metrics."""
    for container in manifest["spec"]["predictor"].get("containers", []):
        if container["name"] == PREDICTOR_CONTAINER and container.get("ports"):
            return int(container["ports"][0]["containerPort"])
    raise ShapeError(f"InferenceService {manifest['metadata']['name']} {NO_METRICS}")


def renamed(manifest: dict, name: str) -> dict:
    """The same InferenceService under another name: only what a manifest declares, none of the
    server's bookkeeping (resourceVersion, uid, status), its load queries selecting its own pods (the
    canary scales on the canary's traffic, the stable version on its own)."""
    metadata = manifest["metadata"]
    kept = {key: copy.deepcopy(metadata[key]) for key in ("labels", "annotations") if key in metadata}
    spec = copy.deepcopy(manifest["spec"])
    for metric in spec["predictor"].get("autoScaling", {}).get("metrics", []):
        source = metric.get("external", {}).get("metric", {})
        if "query" in source:
            query = retargeted_query(source["query"], metadata["name"], name)
            if query is None:
                raise ShapeError(
                    f"InferenceService {metadata['name']}: its autoscaling query does not "
                    f"select its own pods ({ISVC_METRIC_LABEL}), so {name} could not scale "
                    f"on its own traffic: {source['query']}"
                )
            source["query"] = query
    return {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "metadata": {"name": name, **kept},
        "spec": spec,
    }
