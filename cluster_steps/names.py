"""The names the stacks, the Argo workflow and the cluster steps (cluster_steps.release) share: the APIs they
call, the objects' names and the flags between them. Standard library only, so that the Pulumi
program and the policy pack, each in its own environment, use them without the serving image's
packages.
"""

from __future__ import annotations

ISVC_GROUP, ISVC_VERSION, ISVC_PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
ROUTE_GROUP, ROUTE_VERSION, ROUTE_PLURAL = "gateway.networking.k8s.io", "v1", "httproutes"
TFJOB_GROUP, TFJOB_VERSION, TFJOB_PLURAL = "kubeflow.org", "v1", "tfjobs"
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe labels the predictor's pods with it
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
# Every API call a train step makes (cluster_steps.train): its job, and the job's pods' states.
TFJOB_STEP_CALLS = (
    (TFJOB_GROUP, TFJOB_PLURAL, "get"), (TFJOB_GROUP, TFJOB_PLURAL, "create"),
    (TFJOB_GROUP, TFJOB_PLURAL, "delete"),
    ("", "pods", "list"),
)


def canary_name(model_name: str) -> str:
    return f"{model_name}{CANARY_SUFFIX}"


def route_name(model_name: str) -> str:
    return f"{model_name}{ROUTE_SUFFIX}"


def predictor_deployment_name(isvc_name: str) -> str:
    return f"{isvc_name}-predictor"  # KServe's name for its Deployment and Service in Standard mode
