"""The names the stacks, the Argo workflow and the cluster steps (cluster_steps.release, .train) share: the
APIs they call, the objects' names and the flags between them. Standard library only, so that the Pulumi
program and the policy pack, each in its own environment, use them without the serving image's
packages.
"""

from __future__ import annotations

import re

from serving.metric_names import IN_FLIGHT_METRIC, REQUESTS_METRIC

ISVC_GROUP, ISVC_VERSION, ISVC_PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
ROUTE_GROUP, ROUTE_VERSION, ROUTE_PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"
TFJOB_GROUP, TFJOB_VERSION, TFJOB_PLURAL = "kubeflow.org", "v1", "tfjobs"
TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"
# The engines that train a variant on a cluster (pipeline.engine): Kubeflow Trainer v2's TrainJob, or
# the training operator v1's TFJob.
TRAINJOB_ENGINE, TFJOB_ENGINE = "trainjob", "tfjob"
# How each engine's pods are found: the training operator labels a TFJob's pods with the job's name;
# JobSet labels its pods with the JobSet's, which Trainer v2 names after the TrainJob.
TFJOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
# Kueue: the label that puts a job in a LocalQueue, and the one on the Workload it makes for a job.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOAD_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
TRAINING_QUEUE = "dist-ml-training"  # the LocalQueue of the pipeline's namespace (never `default`)
WORKFLOW_TEMPLATE_NAME = "dist-ml-pipeline"
# A submitted Workflow's name: the template's, `-` and the 5 characters generateName adds.
GENERATED_NAME_SUFFIX = 6
DNS_LABEL_LENGTH = 63
# Kubernetes ends a Job's pod names with 5 random characters; JobSet's webhook counts them in
# (jobset v0.12.0 pkg/webhooks/jobset_webhook.go: `<jobset>-<job>-<jobIndex>-<podIndex>-abcde`).
POD_NAME_SUFFIX = "-abcde"
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
)
# Every API call a train step makes (cluster_steps.train), per engine: its job, the job's pods' states,
# and for a TrainJob the Workload Kueue keeps for it (why it waits) and the warning events that say a
# controller could not create its objects.
TRAIN_STEP_CALLS = {
    TFJOB_ENGINE: (
        (TFJOB_GROUP, TFJOB_PLURAL, "get"), (TFJOB_GROUP, TFJOB_PLURAL, "create"),
        (TFJOB_GROUP, TFJOB_PLURAL, "delete"),
        ("", "pods", "list"),
    ),
    TRAINJOB_ENGINE: (
        (TRAINJOB_GROUP, TRAINJOB_PLURAL, "get"), (TRAINJOB_GROUP, TRAINJOB_PLURAL, "create"),
        (TRAINJOB_GROUP, TRAINJOB_PLURAL, "delete"),
        ("", "pods", "list"),
        (WORKLOAD_GROUP, WORKLOAD_PLURAL, "list"),
        ("", "events", "list"),  # the controllers' refusals
    ),
}


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


def trainjob_name_limit(replicated_jobs: dict[str, int]) -> int:
    """The longest TrainJob name JobSet's webhook accepts, given each replicated job's pod
    count: Trainer v2 names the JobSet after the TrainJob, and every pod `<name>-<job>-0-<index>`
    with Kubernetes' suffix must stay a DNS label (one Job per replicated job: index 0)."""
    return min(DNS_LABEL_LENGTH - len(f"-{job}-0-{pods - 1}{POD_NAME_SUFFIX}")
               for job, pods in replicated_jobs.items())


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
