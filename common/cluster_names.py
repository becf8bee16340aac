"""The names the cluster path shares across its layers: the stacks, the Argo workflow, the training
engines (engines/) and the cluster steps (cluster_steps.release, .train) — the APIs they call, the
objects' names, the paths and the flags between them. Standard library only (and the server's metric
names, common.metric_names), so that the Pulumi program, the policy pack and the serving image, each in
its own environment, use them. Each training engine's own names are its module's (engines/).
"""

from __future__ import annotations

import dataclasses
import re

from common.metric_names import IN_FLIGHT_METRIC, REQUESTS_METRIC

# The cluster DNS domain every stack's Service names assume: k3s's and GKE's default, and the tier's
# real node's (tools/control_plane/nodes/real.py).
CLUSTER_DOMAIN = "cluster.local"


@dataclasses.dataclass(frozen=True)
class CustomResource:
    """A kind of the API, as the kubernetes client's custom-object calls name it."""
    kind: str
    group: str
    version: str
    plural: str

    def what(self, namespace: str, name: str) -> str:
        """How an error names one object: `TFJob dist-ml/train-cnn`."""
        return f"{self.kind} {namespace}/{name}"


ISVC_GROUP, ISVC_VERSION, ISVC_PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
ROUTE_GROUP, ROUTE_VERSION, ROUTE_PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"
INFERENCE_SERVICE = CustomResource("InferenceService", ISVC_GROUP, ISVC_VERSION, ISVC_PLURAL)
HTTP_ROUTE = CustomResource("HTTPRoute", ROUTE_GROUP, ROUTE_VERSION, ROUTE_PLURAL)
# Where every pod mounts the storage volume, on every cluster: the steps' paths are under it.
CLUSTER_STORAGE_ROOT = "/mnt/dist-ml"
WORKFLOW_TEMPLATE_NAME = "dist-ml-pipeline"
# A submitted Workflow's name: the template's, `-` and the 5 characters generateName adds.
GENERATED_NAME_SUFFIX = 6
DNS_LABEL_LENGTH = 63
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe labels the predictor's pods with it
# The label of a predictor pod's series in Prometheus: the stacks' PodMonitor copies ISVC_LABEL onto
# them (podTargetLabels) under the name Prometheus Operator gives it (v0.87.1 pkg/prometheus/promcfg.go
# generatePodMonitorConfig, sanitizeLabelName: every character outside [a-zA-Z0-9_] becomes "_"), beside
# `namespace` and `pod`.
ISVC_METRIC_LABEL = re.sub(r"[^a-zA-Z0-9_]", "_", ISVC_LABEL)
# How far back the load queries look: a minute of scrapes, as Knative's stable window, so that one
# burst between two KEDA polls (every 30 s) neither adds nor removes replicas on its own.
LOAD_WINDOW = "1m"
# The predictor's load, summed over its pods: KEDA divides the total by the replicas (its Prometheus
# trigger's default metricType, AverageValue), so the target is per replica. {selector} picks one
# InferenceService's pods, the stable's or the canary's, so that each scales on its own traffic.
LOAD_QUERIES = {
    "inflight": f"sum(avg_over_time({IN_FLIGHT_METRIC}{{selector}}[{LOAD_WINDOW}]))",
    "rps": f"sum(rate({REQUESTS_METRIC}_total{{selector}}[{LOAD_WINDOW}]))",
}
MODEL_VERSION_ANNOTATION = "dist-ml/model-version"  # which published version an InferenceService serves
CANARY_SUFFIX = "-canary"
# Not `<model>`: KServe's own Gateway API mode (off in the stacks) names its top-level route so.
ROUTE_SUFFIX = "-split"
GATEWAY_NAME = "dist-ml"  # the Gateway the stacks declare in the system's namespace
# Its listener for the model (HTTP inside a cluster's network, HTTPS when public): the route attaches
# to it alone, never to another listener of the Gateway (a plain-HTTP one that redirects to HTTPS).
MODEL_LISTENER = "model"
PREDICTOR_SERVICE_PORT = 80  # KServe's port on the predictor's Service (constants.CommonDefaultHttpPort)
PREDICTOR_CONTAINER = "kserve-container"
RELEASE_MODULE = "cluster_steps.release"  # the serve and rollout steps' program, in the serving image
TRAIN_STEP_MODULE = "cluster_steps.train"  # the train steps' program, in the same image
MANIFEST_FLAG = "--manifest"  # the object a cluster step applies, as JSON (the serve step's)
# Every API call a rollout makes, as (API group, resource, verb): what its service account needs.
API_CALLS = (
    (ISVC_GROUP, ISVC_PLURAL, "get"), (ISVC_GROUP, ISVC_PLURAL, "create"),
    (ISVC_GROUP, ISVC_PLURAL, "update"), (ISVC_GROUP, ISVC_PLURAL, "delete"),
    (ROUTE_GROUP, ROUTE_PLURAL, "get"), (ROUTE_GROUP, ROUTE_PLURAL, "create"),
    (ROUTE_GROUP, ROUTE_PLURAL, "update"),
    ("apps", "deployments", "get"),
    ("", "pods", "list"),
    ("", "pods/proxy", "get"),  # each predictor pod's /metrics
    ("", "events", "list"),  # the kubelet's probe failures: a predictor that will never be Ready
)
def canary_name(model_name: str) -> str:
    return f"{model_name}{CANARY_SUFFIX}"


def route_name(model_name: str) -> str:
    return f"{model_name}{ROUTE_SUFFIX}"


def predictor_deployment_name(isvc_name: str) -> str:
    return f"{isvc_name}-predictor"  # KServe's name for its Deployment and Service in Standard mode


TRAIN_PREFIX = "train-"


def train_step_name(variant: str) -> str:
    """`train-cnn-dropout`: step, template and job names must be DNS labels (no underscores)."""
    return TRAIN_PREFIX + variant.replace("_", "-")


def isvc_matcher(isvc_name: str) -> str:
    return f'{ISVC_METRIC_LABEL}="{isvc_name}"'


def load_query(metric: str, namespace: str, isvc_name: str) -> str:
    """The PromQL of one InferenceService's load `metric` (a key of LOAD_QUERIES) in `namespace`."""
    selector = f'{{namespace="{namespace}",{isvc_matcher(isvc_name)}}}'
    return LOAD_QUERIES[metric].replace("{selector}", selector)


def retargeted_query(query: str, isvc_name: str, new_name: str) -> str | None:
    """`query` selecting the pods of InferenceService `new_name` instead of `isvc_name`'s; None when it
    does not select `isvc_name`'s by ISVC_METRIC_LABEL (so it could not follow the renaming)."""
    old = isvc_matcher(isvc_name)
    return query.replace(old, isvc_matcher(new_name)) if old in query else None
