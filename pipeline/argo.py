"""The Argo engine: the pipeline definition as a WorkflowTemplate, a Workflow that runs it, and the
ConfigMap that holds ingest's memo.

    python -m pipeline render --out DIR [--config FILE] [--argo-version v4.1.2]

Each training step is a resource template that creates a TFJob and waits on its replica counts
(Argo cannot query the conditions array). Select publishes the next version and outputs its number;
serve rolls the InferenceService out to that version (`serving.rollout`) and succeeds only once every
predictor replica serves it. `render_objects` is what the Pulumi programs declare; the workflow, not
Pulumi, owns the InferenceService, because only a run knows which version it serves.

Argo's controller keeps the memo cache in its own namespace (argoproj/argo-workflows#10012), so the
cache ConfigMap goes there, and the controller needs a Role there to write it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from common.yaml_text import to_yaml
from pipeline.config import PipelineConfig
from pipeline.definition import (
    CLUSTER_STORAGE_ROOT,
    INGEST,
    SELECT,
    SERVE,
    Step,
    build_steps,
    ingest_memo_key,
)
from pipeline.manifests import (
    PART_OF,
    ClusterTarget,
    Images,
    container,
    inference_service,
    tfjob,
)
from trainer.fashion_mnist import MANIFEST_NAME

WORKFLOW_TEMPLATE_NAME = "dist-ml-pipeline"
MEMO_CACHE_NAME = "dist-ml-memoize"
MEMO_CACHE_LABEL = "workflows.argoproj.io/configmap-type"
ENTRYPOINT = "pipeline"
API_VERSION = "argoproj.io/v1alpha1"
SUPPORTED_ARGO_VERSION = re.compile(r"^v[34]\.[0-9]+\.[0-9]+$")
MAIN_CONTAINER = "main"
# Argo's install: the controller's namespace and service account (manifests/cluster-install).
ARGO_NAMESPACE = "argo"
ARGO_CONTROLLER_ACCOUNT = "argo"
VERSION_PARAMETER = "version"
PUBLISHED_VERSION_FILE = "/tmp/published-version"  # select writes it; Argo reads it as an output
ROLLOUT_MODULE = "serving.rollout"
ROLLOUT_TIMEOUT_SECONDS = 900
ROLLOUT_MANIFEST_FLAG = "--manifest"


def retry_strategy(step: Step) -> dict:
    return {"limit": str(step.retries), "retryPolicy": "OnFailure"}


def memo_cache_ref(step: Step, argo_version: str) -> dict:
    """Argo v3's schema requires the ConfigMap key of the cache entry; v4's rejects it."""
    if argo_version.startswith("v3."):
        return {"name": MEMO_CACHE_NAME, "key": step.name}
    return {"name": MEMO_CACHE_NAME}


def ingest_template(config: PipelineConfig, step: Step, images: Images, argo_version: str) -> dict:
    return {
        "name": step.name,
        # Argo memoizes outputs: the manifest is ingest's, and a hit skips the pod.
        "memoize": {"key": ingest_memo_key(config), "maxAge": config.memoize_max_age,
                    "cache": {"configMap": memo_cache_ref(step, argo_version)}},
        "retryStrategy": retry_strategy(step),
        "container": container(step, MAIN_CONTAINER, images),
        "outputs": {"parameters": [
            {"name": "manifest", "valueFrom": {"path": f"{step.outputs[0]}/{MANIFEST_NAME}"}},
        ]},
    }


def select_template(step: Step, images: Images) -> dict:
    """Select, and the number of the version it published as an output."""
    main = container(step, MAIN_CONTAINER, images)
    main["command"] = [*main["command"], "--published-version-file", PUBLISHED_VERSION_FILE]
    return {"name": step.name, "retryStrategy": retry_strategy(step), "container": main,
            "outputs": {"parameters": [
                {"name": VERSION_PARAMETER, "valueFrom": {"path": PUBLISHED_VERSION_FILE}}]}}


def train_template(config: PipelineConfig, step: Step, target: ClusterTarget) -> dict:
    return {
        "name": step.name,
        "resource": {
            "action": "create",
            "setOwnerReference": True,  # deleting the workflow deletes its TFJobs and their pods
            "successCondition": f"status.replicaStatuses.Worker.succeeded = {step.replicas}",
            "failureCondition": "status.replicaStatuses.Worker.failed > 0",
            "manifest": to_yaml(tfjob(config, step, target)),
        },
    }


def serve_template(config: PipelineConfig, step: Step, target: ClusterTarget) -> dict:
    """Rolls the InferenceService out to the version select published, waiting a bounded time."""
    manifest = inference_service(config, target, f"{{{{inputs.parameters.{VERSION_PARAMETER}}}}}")
    return {
        "name": step.name,
        "inputs": {"parameters": [{"name": VERSION_PARAMETER}]},
        "retryStrategy": retry_strategy(step),
        "activeDeadlineSeconds": ROLLOUT_TIMEOUT_SECONDS * 2,  # a backstop: the step's own wait is bounded
        "container": {
            "name": MAIN_CONTAINER, "image": target.images.serving, "imagePullPolicy": "IfNotPresent",
            "command": ["python", "-m", ROLLOUT_MODULE],
            "args": ["--namespace", "{{workflow.namespace}}",
                     "--timeout-seconds", str(ROLLOUT_TIMEOUT_SECONDS),
                     ROLLOUT_MANIFEST_FLAG, json.dumps(manifest, sort_keys=True)],
            "resources": config.step_resources.as_manifest(),
        },
    }


def rollout_manifest(template: dict) -> dict:
    """The InferenceService a serve template rolls out (its placeholders left as they are)."""
    args = template["container"]["args"]
    return json.loads(args[args.index(ROLLOUT_MANIFEST_FLAG) + 1])


def dag(steps: list[Step]) -> dict:
    tasks = []
    for step in steps:
        task = {"name": step.name, "template": step.name}
        if step.depends:
            task["depends"] = " && ".join(step.depends)
        if step.name == SERVE:
            version = f"{{{{tasks.{SELECT}.outputs.parameters.{VERSION_PARAMETER}}}}}"
            task["arguments"] = {"parameters": [{"name": VERSION_PARAMETER, "value": version}]}
        tasks.append(task)
    return {"name": ENTRYPOINT, "dag": {"tasks": tasks}}


def workflow_template(config: PipelineConfig, target: ClusterTarget = ClusterTarget()) -> dict:
    steps = build_steps(config, CLUSTER_STORAGE_ROOT)
    templates = [dag(steps)]
    for step in steps:
        if step.name == INGEST:
            templates.append(ingest_template(config, step, target.images, target.argo_version))
        elif step.name == SELECT:
            templates.append(select_template(step, target.images))
        elif step.name == SERVE:
            templates.append(serve_template(config, step, target))
        else:
            templates.append(train_template(config, step, target))
    spec: dict = {
        "entrypoint": ENTRYPOINT,
        "serviceAccountName": config.service_account_name,
        # Pods of a failed run stay for `argo logs`; a successful run's go.
        "podGC": {"strategy": "OnWorkflowSuccess"},
        "volumes": [target.storage.volume()],
        "templates": templates,
    }
    if config.parallelism:
        spec["parallelism"] = config.parallelism
    if target.storage.pod_annotations:
        spec["podMetadata"] = {"annotations": dict(target.storage.pod_annotations)}
    return {"apiVersion": API_VERSION, "kind": "WorkflowTemplate",
            "metadata": {"name": WORKFLOW_TEMPLATE_NAME, "labels": dict(PART_OF)}, "spec": spec}


def workflow() -> dict:
    """A run of the template: `argo submit` it, or `kubectl create -f` it."""
    return {"apiVersion": API_VERSION, "kind": "Workflow",
            "metadata": {"generateName": f"{WORKFLOW_TEMPLATE_NAME}-", "labels": dict(PART_OF)},
            "spec": {"workflowTemplateRef": {"name": WORKFLOW_TEMPLATE_NAME}}}


def memo_cache() -> dict:
    """The ConfigMap Argo keeps memoized outputs in, in the controller's namespace; Argo refuses
    one that is not labelled as a cache."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": MEMO_CACHE_NAME, "namespace": ARGO_NAMESPACE,
                         "labels": {MEMO_CACHE_LABEL: "Cache", **PART_OF}}}


def render_objects(config: PipelineConfig, target: ClusterTarget = ClusterTarget()) -> dict[str, dict]:
    """File name -> object, for `render` and for the Pulumi programs."""
    return {
        "workflowtemplate.yaml": workflow_template(config, target),
        "workflow.yaml": workflow(),
        "memoize-cache.yaml": memo_cache(),
    }


def write(config: PipelineConfig, out: Path, target: ClusterTarget = ClusterTarget()) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, manifest in render_objects(config, target).items():
        path = out / name
        path.write_text(to_yaml(manifest))
        paths.append(path)
    return paths
