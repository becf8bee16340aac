"""The Argo engine: the pipeline definition as a WorkflowTemplate, a Workflow that runs it, and the
ConfigMap that holds ingest's memo.

    python -m pipeline render --out DIR [--config FILE] [--argo-version v4.1.2]

Each training step creates its TrainJob (pipeline.engine trainjob, on our TensorFlow runtime, queued
by Kueue) or TFJob and watches its conditions (`cluster_steps.train`): it fails with the job's
reason, retries a failed job from its backup, and is bounded by pipeline.trainTimeout. Select
publishes the next version and outputs its number; serve deploys that version
(`cluster_steps.release deploy`): the first one, or any with pipeline.rollout.canaryPercent 0, as the
stable InferenceService, a later one as the canary beside it with that share of the route's
requests, and succeeds only once every replica serves it. The rollout step (`cluster_steps.release
decide`) waits for the canary's evidence (minRequests or maxWait), decides, and promotes or rolls
back; its decision is the step's output `decision`. `render_objects` is what the Pulumi programs
declare (with trainjob, also the training runtimes the TrainJobs name); the workflow, not Pulumi,
owns the InferenceServices and the route, because only a run knows which version each serves and
what share the canary has.

Each step becomes the template its kind's handler renders (TEMPLATES; a kind without one is an error
naming the step). The DAG passes a template's input parameters from the dependency whose template
outputs a parameter of that name: select's `version` reaches serve whatever the steps are called.

Argo's controller keeps the memo cache in its own namespace (argoproj/argo-workflows#10012), so the
cache ConfigMap goes there, and the controller needs a Role there to write it.

Plain dicts, not hera's typed models: no hera release types both Argo v3 and v4 memo caches (7.x
drops v3's configMap.key, 6.x and older require it), and their dumps reorder every key.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from typing import Callable, Mapping

from cluster_steps.inference_service import PredictorSpec, Scaling, inference_service
from common.cli import NEVER_SUCCEEDS_EXIT_CODE
from common.cluster_names import (
    CLUSTER_STORAGE_ROOT,
    MANIFEST_FLAG,
    RELEASE_MODULE,
    TRAIN_STEP_MODULE,
    WORKFLOW_TEMPLATE_NAME,
)
from common.cluster_target import IMAGE_USER, PART_OF, ClusterStorage, ClusterTarget, Images, storage_mount
from common.pod_security import container_security_context, pod_security_context
from common.tracking_names import EXPERIMENT_ENV, PIPELINE_RUN_ENV, TRACKING_URI_ENV
from common.yaml_text import to_yaml
from engines import ENGINES
from engines.base import TrainingSpec, env_list
from pipeline.config import PipelineConfig
from pipeline.definition import (
    SERVING_IMAGE,
    TRAINER_IMAGE,
    Layout,
    PipelineError,
    Step,
    StepKind,
    build_steps,
    ingest_memo_key,
    require_handlers,
    rollout_flags,
    serving_flags,
)
from pipeline.validation import ConfigError
from trainer.dataset_files import MANIFEST_NAME

WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
WORKFLOW_NAME = "{{workflow.name}}"  # Argo substitutes it in the manifests of resource templates
MEMO_CACHE_NAME = "dist-ml-memoize"
MEMO_CACHE_LABEL = "workflows.argoproj.io/configmap-type"
ENTRYPOINT = "pipeline"
API_VERSION = "argoproj.io/v1alpha1"
SUPPORTED_ARGO_VERSION = re.compile(r"^v[34]\.[0-9]+\.[0-9]+$")
MAIN_CONTAINER = "main"
# Argo's install: the controller's namespace and service account (manifests/cluster-install).
ARGO_NAMESPACE = "argo"
ARGO_CONTROLLER_ACCOUNT = "argo"
CONTROLLER_CONFIG_MAP = "workflow-controller-configmap"  # the controller's config (its install's)
# Argo's executor image that runs as a user of its own (v4.1.2 Dockerfile, target argoexec-nonroot:
# USER 8737), released from v3.7.0 on; the plain argoexec image runs as root, which the step pods'
# runAsNonRoot makes the kubelet refuse.
EXECUTOR_IMAGE = "quay.io/argoproj/argoexec:{version}-nonroot"
NONROOT_EXECUTOR_SINCE = (3, 7)
VERSION_PARAMETER = "version"
DECISION_PARAMETER = "decision"
PUBLISHED_VERSION_FILE = "/tmp/published-version"  # select writes it; Argo reads it as an output
DEPLOYED_VERSION_FILE = "/tmp/deployed-version"  # serve writes it, for the rollout step
# A failed step's last log lines become its termination message, which Argo's controller puts in the
# step's message (`argo get`, the Workflow's status): the step's own words on why it failed.
STEP_MESSAGE_POLICY = "FallbackToLogsOnError"
DECISION_FILE = "/tmp/rollout-decision.json"  # the rollout step writes it; Argo keeps it as an output
ROLLOUT_TIMEOUT_SECONDS = 900  # one InferenceService's rollout
TRAIN_DEADLINE_MARGIN_SECONDS = 300  # past a train step's own timeout: deleting its job
# A cluster step only calls the API and waits: every variant's train step runs at once beside the
# TrainJobs Kueue admits, so each asks for little (a Python process with the kubernetes client).
CLUSTER_STEP_RESOURCES = {"requests": {"cpu": "50m", "memory": "128Mi"},
                          "limits": {"cpu": "500m", "memory": "512Mi"}}


def step_image(step: Step, images: Images) -> str:
    """The image of a step's pods (ingest and select the trainer's, the cluster steps the server's)."""
    return {TRAINER_IMAGE: images.trainer, SERVING_IMAGE: images.serving}[step.image]


def tracking_env(config: PipelineConfig, target: ClusterTarget) -> dict[str, str]:
    """What the steps that track in MLflow are given (trainer.tracking): the cluster's tracking server,
    the experiment, and the workflow's name as the pipeline run that groups their runs. None without
    a server or with tracking off."""
    if target.tracking_uri is None or not config.tracking.enabled:
        return {}
    return {TRACKING_URI_ENV: target.tracking_uri, EXPERIMENT_ENV: config.experiment,
            PIPELINE_RUN_ENV: WORKFLOW_NAME}


def step_container(step: Step, images: Images, env: Mapping[str, str] = {}) -> dict:
    """The container of a step that runs its own command on the storage volume."""
    container = {"name": MAIN_CONTAINER, "image": step_image(step, images), "imagePullPolicy": "IfNotPresent",
                 "command": list(step.command), "volumeMounts": [storage_mount()],
                 "resources": step.resources.as_manifest(), "securityContext": container_security_context(),
                 "terminationMessagePolicy": STEP_MESSAGE_POLICY}
    if env:
        container["env"] = env_list(env)
    return container


def training_spec(step: Step, env: Mapping[str, str] = {}) -> TrainingSpec:
    """A train step's training, for its engine; its job is named after the workflow and the step, so
    that every run creates its own."""
    return TrainingSpec(name=f"{WORKFLOW_NAME}-{step.name}", step=step.name, command=tuple(step.command),
                        workers=step.replicas, parameter_servers=step.parameter_servers,
                        resources=step.resources.as_manifest(), retries=step.retries,
                        labels={WORKFLOW_LABEL: WORKFLOW_NAME}, env=dict(env))


def training_runtimes(config: PipelineConfig, target: ClusterTarget) -> list[dict]:
    """What the engine's jobs name beside them (its runtimes), for the stacks to declare."""
    specs = [training_spec(step) for step in build_steps(config, CLUSTER_STORAGE_ROOT)
             if step.kind == StepKind.TRAIN]
    return ENGINES[config.engine].runtimes(specs, target)


def release_uri(storage: ClusterStorage, model_name: str, version: str) -> str:
    """Where select released one published version for serving (trainer.model_repository.release_dir,
    as a URI): a directory holding only `<version>/`, TF Serving's layout, so KServe gives the
    predictor that version and no other."""
    return posixpath.join(Layout(storage.uri).releases, model_name, version)


def predictor_spec(config: PipelineConfig, target: ClusterTarget, version: str,
                   namespace: str) -> PredictorSpec:
    """The InferenceService of one published `version` (a number, or Argo's placeholder for it) in
    `namespace` (a name, or Argo's placeholder for it), from the serving section."""
    serving = config.serving
    autoscaling = serving.autoscaling
    if autoscaling.on_load and target.prometheus_url is None:
        raise ConfigError(f"serving.autoscaling.metric: {autoscaling.metric} is read from Prometheus, and "
                          "this cluster has none: use metric cpu")
    return PredictorSpec(
        model_name=config.model_name, version=version, namespace=namespace,
        storage_uri=release_uri(target.storage, config.model_name, version), runtime=serving.runtime,
        runtime_version=serving.runtime_version, image=target.images.serving,
        server_args=tuple(serving_flags(config)), resources=serving.resources.as_manifest(),
        min_replicas=serving.min_replicas, max_replicas=serving.max_replicas,
        scaling=Scaling(autoscaling.metric, autoscaling.target_value, autoscaling.on_load,
                        autoscaling.scale_down_stabilization_seconds),
        prometheus_url=target.prometheus_url, logger_url=target.logger_url)


def retry_strategy(step: Step) -> dict:
    """Argo retries a failed attempt, but not one the cluster said will never succeed (its exit code
    says so: common.cli.NeverSucceeds), which would only meet the same answer again."""
    return {"limit": str(step.retries), "retryPolicy": "OnFailure",
            "expression": f"asInt(lastRetry.exitCode) != {NEVER_SUCCEEDS_EXIT_CODE}"}


def memo_cache_ref(step: Step, argo_version: str) -> dict:
    """Argo v3's schema requires the ConfigMap key of the cache entry; v4's rejects it."""
    if argo_version.startswith("v3."):
        return {"name": MEMO_CACHE_NAME, "key": step.name}
    return {"name": MEMO_CACHE_NAME}


def ingest_template(config: PipelineConfig, step: Step, target: ClusterTarget) -> dict:
    return {
        "name": step.name,
        # Argo memoizes outputs: the manifest is ingest's, and a hit skips the pod. No retryStrategy
        # beside it: a memo hit of a template with one is a Retry node without children, which has no
        # outbound node (v4.0.5 workflow/controller/operator.go, getOutboundNodes), so the tasks after
        # it hang off nothing and the run stays Running for ever (seen on the tier's real node). A
        # failed ingest fails the run; resubmitting it costs nothing that succeeded.
        "memoize": {"key": ingest_memo_key(config), "maxAge": config.memoize_max_age,
                    "cache": {"configMap": memo_cache_ref(step, target.argo_version)}},
        "container": step_container(step, target.images),
        "outputs": {"parameters": [
            {"name": "manifest", "valueFrom": {"path": f"{step.outputs[0]}/{MANIFEST_NAME}"}},
        ]},
    }


def select_template(config: PipelineConfig, step: Step, target: ClusterTarget) -> dict:
    """Select, and the number of the version it published as an output."""
    main = step_container(step, target.images, tracking_env(config, target))
    main["command"] = [*main["command"], "--published-version-file", PUBLISHED_VERSION_FILE,
                       "--releases-uri", Layout(target.storage.uri).releases]
    return {"name": step.name, "retryStrategy": retry_strategy(step), "container": main,
            "outputs": {"parameters": [
                {"name": VERSION_PARAMETER, "valueFrom": {"path": PUBLISHED_VERSION_FILE}}]}}


def train_template(config: PipelineConfig, step: Step, target: ClusterTarget) -> dict:
    """Creates the step's TrainJob or TFJob and watches it to its end (cluster_steps.train says why
    not a resource template). The job belongs to the workflow: deleting the workflow deletes it and
    its pods."""
    manifest = ENGINES[config.engine].job(training_spec(step, tracking_env(config, target)), target)
    manifest["metadata"]["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": "Workflow",
                                                "name": "{{workflow.name}}", "uid": "{{workflow.uid}}"}]
    timeout = config.train_timeout_seconds
    return {
        "name": step.name,
        # A pod lost with its node, or a job failed by its backoff limit: the retry creates the job
        # again and training resumes from the variant's backup.
        "retryStrategy": retry_strategy(step),
        "activeDeadlineSeconds": timeout + TRAIN_DEADLINE_MARGIN_SECONDS,  # a backstop past the step's own
        "container": cluster_step_container(target, TRAIN_STEP_MODULE, [
            "--namespace", "{{workflow.namespace}}", "--timeout-seconds", str(timeout),
            MANIFEST_FLAG, json.dumps(manifest, sort_keys=True)]),
    }


def cluster_step_container(target: ClusterTarget, module: str, args: list[str],
                           env: Mapping[str, str] = {}) -> dict:
    """A step of cluster_steps (`module`), in the serving image, which carries the kubernetes client."""
    container = {"name": MAIN_CONTAINER, "image": target.images.serving, "imagePullPolicy": "IfNotPresent",
                 "command": ["python", "-m", module], "args": args,
                 "resources": {kind: dict(amounts) for kind, amounts in CLUSTER_STEP_RESOURCES.items()},
                 "securityContext": container_security_context(),
                 "terminationMessagePolicy": STEP_MESSAGE_POLICY}
    if env:
        container["env"] = env_list(env)
    return container


def serve_template(config: PipelineConfig, step: Step, target: ClusterTarget) -> dict:
    """Deploys the version select published, as the stable version or as the canary, waiting a
    bounded time for it to roll out; outputs that version for the rollout step."""
    version = f"{{{{inputs.parameters.{VERSION_PARAMETER}}}}}"
    manifest = inference_service(predictor_spec(config, target, version, "{{workflow.namespace}}"))
    return {
        "name": step.name,
        "inputs": {"parameters": [{"name": VERSION_PARAMETER}]},
        "retryStrategy": retry_strategy(step),
        "activeDeadlineSeconds": ROLLOUT_TIMEOUT_SECONDS * 2,  # a backstop: the step's own wait is bounded
        "container": cluster_step_container(target, RELEASE_MODULE, [
            "deploy", "--namespace", "{{workflow.namespace}}",
            "--canary-percent", str(config.rollout.canary_percent),
            "--timeout-seconds", str(ROLLOUT_TIMEOUT_SECONDS),
            "--version-file", DEPLOYED_VERSION_FILE,
            MANIFEST_FLAG, json.dumps(manifest, sort_keys=True)], tracking_env(config, target)),
        "outputs": {"parameters": [
            {"name": VERSION_PARAMETER, "valueFrom": {"path": DEPLOYED_VERSION_FILE}}]},
    }


def rollout_template(config: PipelineConfig, step: Step, target: ClusterTarget) -> dict:
    """Judges the canary serve deployed (if it deployed one) and promotes or rolls it back; the
    decision with its numbers is the step's output. Bounded: maxWait, then at most one rollout."""
    policy = config.rollout
    return {
        "name": step.name,
        "inputs": {"parameters": [{"name": VERSION_PARAMETER}]},
        "retryStrategy": retry_strategy(step),
        # A backstop past the step's own bounds: the wait for evidence and a promotion's rollout.
        "activeDeadlineSeconds": policy.max_wait_seconds + ROLLOUT_TIMEOUT_SECONDS * 2,
        "container": cluster_step_container(target, RELEASE_MODULE, [
            "decide", "--namespace", "{{workflow.namespace}}", "--model-name", config.model_name,
            "--version", f"{{{{inputs.parameters.{VERSION_PARAMETER}}}}}",
            *rollout_flags(config),
            "--timeout-seconds", str(ROLLOUT_TIMEOUT_SECONDS),
            "--decision-file", DECISION_FILE], tracking_env(config, target)),
        "outputs": {"parameters": [{"name": DECISION_PARAMETER, "valueFrom": {"path": DECISION_FILE}}]},
    }


def applied_manifest(template: dict) -> dict:
    """The object a cluster step's template applies: a train step's TFJob, a serve step's
    InferenceService (its placeholders left as they are)."""
    args = template["container"]["args"]
    return json.loads(args[args.index(MANIFEST_FLAG) + 1])


# Step kind -> its template: how the Argo engine runs each kind of step.
Renderer = Callable[[PipelineConfig, Step, ClusterTarget], dict]
TEMPLATES: dict[StepKind, Renderer] = {
    StepKind.INGEST: ingest_template,
    StepKind.TRAIN: train_template,
    StepKind.SELECT: select_template,
    StepKind.SERVE: serve_template,
    StepKind.ROLLOUT: rollout_template,
}


def parameter_names(template: dict, direction: str) -> list[str]:
    """The names of a template's `inputs` or `outputs` parameters."""
    return [parameter["name"] for parameter in template.get(direction, {}).get("parameters", [])]


def parameter_source(step: Step, name: str, templates: Mapping[str, dict]) -> str:
    """The one dependency of `step` whose template outputs parameter `name`."""
    sources = [dependency for dependency in step.depends
               if name in parameter_names(templates[dependency], "outputs")]
    if len(sources) != 1:
        raise PipelineError(f"step {step.name}: input parameter {name!r} is output by "
                            f"{len(sources)} of its dependencies ({', '.join(step.depends) or 'none'}); "
                            f"it needs exactly one")
    return sources[0]


def dag_task(step: Step, templates: Mapping[str, dict]) -> dict:
    task: dict = {"name": step.name, "template": step.name}
    if step.depends:
        task["depends"] = " && ".join(step.depends)
    arguments = [
        {"name": name,
         "value": f"{{{{tasks.{parameter_source(step, name, templates)}.outputs.parameters.{name}}}}}"}
        for name in parameter_names(templates[step.name], "inputs")]
    if arguments:
        task["arguments"] = {"parameters": arguments}
    return task


def dag(steps: list[Step], templates: Mapping[str, dict]) -> dict:
    return {"name": ENTRYPOINT, "dag": {"tasks": [dag_task(step, templates) for step in steps]}}


def workflow_template(config: PipelineConfig, target: ClusterTarget = ClusterTarget()) -> dict:
    steps = build_steps(config, CLUSTER_STORAGE_ROOT)
    require_handlers(steps, TEMPLATES, "argo")
    templates = {step.name: TEMPLATES[step.kind](config, step, target) for step in steps}
    spec: dict = {
        "entrypoint": ENTRYPOINT,
        "serviceAccountName": config.service_account_name,
        # Pods of a failed run stay for `argo logs`; a successful run's go.
        "podGC": {"strategy": "OnWorkflowSuccess"},
        # Every step pod's, Argo's init and wait containers run under it too (theirs: executor_config);
        # ingest and select write to the storage volume as the images' user.
        "securityContext": pod_security_context(IMAGE_USER),
        "volumes": [target.storage.volume()],
        "templates": [dag(steps, templates), *templates.values()],
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


def executor_config(argo_version: str) -> dict:
    """The `executor` of the workflow controller's config map: the image and security context of the
    init and wait containers Argo adds to every step pod (v4.1.2 workflow/controller/workflowpod.go
    newExecContainer takes both from it), so that they meet `restricted` as the steps' own do."""
    major, minor = (int(part) for part in argo_version.removeprefix("v").split(".")[:2])
    if (major, minor) < NONROOT_EXECUTOR_SINCE:
        raise ConfigError(f"platform.argoVersion {argo_version}: its executor image runs as root, which the "
                          "step pods' restricted security context refuses; use v3.7.0 or later")
    return {"image": EXECUTOR_IMAGE.format(version=argo_version),
            "securityContext": container_security_context()}


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
        **{runtime_file(runtime): runtime for runtime in training_runtimes(config, target)},
    }


def runtime_file(runtime: dict) -> str:
    return f"{runtime['kind'].lower()}-{runtime['metadata']['name']}.yaml"


def write(config: PipelineConfig, out: Path, target: ClusterTarget = ClusterTarget()) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, manifest in render_objects(config, target).items():
        path = out / name
        path.write_text(to_yaml(manifest))
        paths.append(path)
    return paths
