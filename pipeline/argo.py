"""The Argo engine: the pipeline definition as a WorkflowTemplate, a Workflow that runs it, and the
ConfigMap that holds ingest's memo.

    python -m pipeline render --out DIR [--config FILE] [--argo-version v4.1.2]

Each training step is a resource template that creates a TFJob and waits on its replica counts
(Argo cannot query the conditions array); serve applies the InferenceService and waits until the
model is up to date. `render_objects` is what the Pulumi programs declare.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

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


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-objects out in full: no YAML anchors in what people read."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def to_yaml(manifest: dict) -> str:
    return yaml.dump(manifest, Dumper=_PlainDumper, sort_keys=False)


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


def container_template(step: Step, images: Images) -> dict:
    return {"name": step.name, "retryStrategy": retry_strategy(step),
            "container": container(step, MAIN_CONTAINER, images)}


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


def serve_template(config: PipelineConfig, target: ClusterTarget) -> dict:
    return {
        "name": SERVE,
        "resource": {
            "action": "apply",
            "successCondition": "status.modelStatus.transitionStatus = UpToDate",
            "failureCondition": "status.modelStatus.transitionStatus = BlockedByFailedLoad",
            "manifest": to_yaml(inference_service(config, target)),
        },
    }


def dag(steps: list[Step]) -> dict:
    tasks = []
    for step in steps:
        task = {"name": step.name, "template": step.name}
        if step.depends:
            task["depends"] = " && ".join(step.depends)
        tasks.append(task)
    return {"name": ENTRYPOINT, "dag": {"tasks": tasks}}


def workflow_template(config: PipelineConfig, target: ClusterTarget = ClusterTarget()) -> dict:
    steps = build_steps(config, CLUSTER_STORAGE_ROOT)
    templates = [dag(steps)]
    for step in steps:
        if step.name == INGEST:
            templates.append(ingest_template(config, step, target.images, target.argo_version))
        elif step.name == SELECT:
            templates.append(container_template(step, target.images))
        elif step.name == SERVE:
            templates.append(serve_template(config, target))
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
    """The ConfigMap Argo keeps memoized outputs in; Argo only uses one labelled as a cache."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": MEMO_CACHE_NAME, "labels": {MEMO_CACHE_LABEL: "Cache", **PART_OF}}}


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
