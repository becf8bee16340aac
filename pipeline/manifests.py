"""The Kubernetes objects the pipeline's steps become: TrainJobs and the TensorFlow training runtime
they run on (or TFJobs), and the InferenceService (the HTTPRoute that splits requests between the
stable and the canary InferenceService is cluster_steps.release's).

Plain dicts built from the step definitions, for the Argo templates and for the Pulumi programs, which
differ only in the images and the storage they pass in.
"""

from __future__ import annotations

import dataclasses
import posixpath

from cluster_steps.names import (
    JOBSET_NAME_LABEL,
    MODEL_VERSION_ANNOTATION,
    PREDICTOR_CONTAINER,
    QUEUE_NAME_LABEL,
    REPLICATED_JOB_LABEL,
    TRAINING_QUEUE,
    load_query,
)
from pipeline.config import PipelineConfig, ServingConfig
from pipeline.definition import (
    CLUSTER_STORAGE_ROOT,
    SERVING_IMAGE,
    TRAINER_IMAGE,
    Layout,
    Step,
    serving_flags,
)
from pipeline.validation import ConfigError
from trainer import cluster as tf_cluster

DEFAULT_ARGO_VERSION = "v4.1.2"
IMAGE_TAG = "0.1.0"  # the release these defaults name; the stacks pass content-tagged images
STORAGE_CLAIM_NAME = "dist-ml-storage"
STORAGE_VOLUME = "storage"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
WORKFLOW_NAME = "{{workflow.name}}"  # Argo substitutes it in the manifests of resource templates
TFJOB_CONTAINER = "tensorflow"  # the training operator requires this name
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
PART_OF = {"app.kubernetes.io/part-of": "dist-ml"}
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
# The stacks' Prometheus (infra/monitoring.py prometheus_url): a render's default.
DEFAULT_PROMETHEUS_URL = "http://monitoring-kube-prometheus-prometheus.monitoring.svc:9090"
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
GCS_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
# The user the trainer and serving images run as (their Dockerfiles' USER).
IMAGE_USER = 1000
# GCS FUSE mounts as root unless told otherwise: the images' user must own what it writes, and
# directories need no placeholder objects to be listed.
GCS_FUSE_MOUNT_OPTIONS = f"implicit-dirs,uid={IMAGE_USER},gid={IMAGE_USER},file-mode=664,dir-mode=775"
# One identity per actor, so that each holds only its own rights: the workflow's pods have the
# pipeline's service account (config), TFJob pods, the predictor and the request logger these.
TRAINER_SERVICE_ACCOUNT = "dist-ml-trainer"
PREDICTOR_SERVICE_ACCOUNT = "dist-ml-predictor"
ISVC_API_VERSION = "serving.kserve.io/v1beta1"


class ImageMissing(ValueError):
    """A pod needs an image the cluster target does not have."""


@dataclasses.dataclass(frozen=True)
class Images:
    trainer: str = f"dist-ml/trainer:{IMAGE_TAG}"
    serving: str = f"dist-ml/serving:{IMAGE_TAG}"
    # The trainer with CUDA (trainer-gpu/Dockerfile), for training pods given GPUs: only stacks whose
    # training pool has GPUs build it.
    trainer_gpu: str | None = None

    def trainer_for(self, gpus: int, pods: str) -> str:
        """The trainer image of `pods` given `gpus` GPUs each: the GPU trainer image when any."""
        if not gpus:
            return self.trainer
        if self.trainer_gpu is None:
            raise ImageMissing(f"{pods}: its pods are given GPUs, which need the GPU trainer image, and the "
                               "cluster target has none")
        return self.trainer_gpu

    def of(self, step: Step, gpus: int = 0) -> str:
        """The image of `step`'s pods; given GPUs, the trainer's is the GPU trainer image."""
        if step.image == TRAINER_IMAGE:
            return self.trainer_for(gpus, f"step {step.name}")
        return {SERVING_IMAGE: self.serving}[step.image]


@dataclasses.dataclass(frozen=True)
class ClusterStorage:
    """The volume every pipeline pod mounts at CLUSTER_STORAGE_ROOT, and the URI of its root for KServe."""
    volume_source: dict  # a Kubernetes volume without its name
    uri: str  # pvc://CLAIM or gs://BUCKET: the volume's root as a KServe storageUri
    pod_annotations: dict = dataclasses.field(default_factory=dict)  # what pods mounting it need

    def volume(self) -> dict:
        return {"name": STORAGE_VOLUME, **self.volume_source}


def pvc_storage(claim_name: str = STORAGE_CLAIM_NAME) -> ClusterStorage:
    return ClusterStorage({"persistentVolumeClaim": {"claimName": claim_name}}, f"pvc://{claim_name}")


def gcs_storage(bucket: str) -> ClusterStorage:
    """A GCS bucket mounted by GKE's Cloud Storage FUSE CSI driver, which injects its sidecar into
    pods annotated for it; the pod's service account needs access through Workload Identity."""
    return ClusterStorage(
        {"csi": {"driver": GCS_FUSE_DRIVER,
                 "volumeAttributes": {"bucketName": bucket, "mountOptions": GCS_FUSE_MOUNT_OPTIONS}}},
        f"gs://{bucket}", pod_annotations={"gke-gcsfuse/volumes": "true"})


@dataclasses.dataclass(frozen=True)
class ClusterTarget:
    """What a cluster gives the rendered objects: images, storage, and its platform's settings."""
    images: Images = Images()
    storage: ClusterStorage = dataclasses.field(default_factory=pvc_storage)
    argo_version: str = DEFAULT_ARGO_VERSION
    logger_url: str | None = None  # where the predictor's KServe logger posts CloudEvents
    prometheus_url: str | None = DEFAULT_PROMETHEUS_URL  # where KEDA reads the load; None: no Prometheus
    # Where TFJob pods run: the training node pool's labels and taints, and its GPUs per node.
    training_tolerations: tuple[dict, ...] = ()  # e.g. a GPU pool's taint
    training_node_selector: dict = dataclasses.field(default_factory=dict)
    training_gpus: int = 0


GPU_RESOURCE = "nvidia.com/gpu"  # the extended resource NVIDIA's device plugin advertises
# trainer.train's flag for the GPUs its pod was given: it fails at once if TensorFlow sees fewer.
GPUS_FLAG = "--gpus"


def storage_mount() -> dict:
    return {"name": STORAGE_VOLUME, "mountPath": CLUSTER_STORAGE_ROOT}


def with_gpus(resources: dict, gpus: int) -> dict:
    """Requests and limits, and `gpus` GPUs (a node's, all of them) when there are any."""
    if gpus:
        # Extended resources cannot be overcommitted: Kubernetes requires requests equal to limits.
        for kind in ("requests", "limits"):
            resources[kind][GPU_RESOURCE] = gpus
    return resources


def gpus_command(command: list[str], gpus: int) -> list[str]:
    """A training command told the GPUs its pod was given (trainer.train --gpus: a pod whose
    TensorFlow sees fewer fails at once, in one line, rather than training on the CPU)."""
    return [*command, GPUS_FLAG, str(gpus)] if gpus else list(command)


def container(step: Step, name: str, images: Images, gpus: int = 0) -> dict:
    return {"name": name, "image": images.of(step, gpus), "imagePullPolicy": "IfNotPresent",
            "command": gpus_command(step.command, gpus), "volumeMounts": [storage_mount()],
            "resources": with_gpus(step.resources.as_manifest(), gpus)}


def pod_template(config: PipelineConfig, step: Step, target: ClusterTarget, labels: dict) -> dict:
    metadata: dict = {"labels": labels}
    if target.storage.pod_annotations:
        metadata["annotations"] = dict(target.storage.pod_annotations)
    spec: dict = {
        "serviceAccountName": TRAINER_SERVICE_ACCOUNT,
        "containers": [container(step, TFJOB_CONTAINER, target.images, target.training_gpus)],
        "volumes": [target.storage.volume()],
    }
    if target.training_node_selector:
        spec["nodeSelector"] = dict(target.training_node_selector)
    if target.training_tolerations:
        spec["tolerations"] = [dict(toleration) for toleration in target.training_tolerations]
    return {"metadata": metadata, "spec": spec}


# A failed container restarts in place (same pod, same address in every TF_CONFIG) and resumes from
# BackupAndRestore. The training operator fails a TFJob as soon as any replica's pod has failed
# (kubeflow/trainer v1.9.4 pkg/controller.v1/tensorflow/tfjob_controller.go UpdateJobStatus), so a
# lost worker is tolerated only because its pod does not fail.
RESTART_POLICY = "OnFailure"


def replica_spec(config: PipelineConfig, step: Step, target: ClusterTarget, labels: dict,
                 replicas: int) -> dict:
    return {"replicas": replicas, "restartPolicy": RESTART_POLICY,
            "template": pod_template(config, step, target, labels)}


def tfjob(config: PipelineConfig, step: Step, target: ClusterTarget, name: str | None = None) -> dict:
    """The TFJob of a training step: `workers` Worker replicas that restart on failure and resume;
    under parameter servers also a Chief (the coordinator) and `parameterServers` PS replicas.

    With a Chief, the job succeeds when the Chief does (the default successPolicy ""; AllWorkers
    would wait for workers that never exit), and cleanPodPolicy Running then deletes the workers
    and parameter servers, which serve until stopped. A restarted PS comes back without the
    variables: the coordinator fails, and the restarted Chief restores its last epoch's backup.
    Its default name is the workflow's plus the step's, so that every run creates its own.
    """
    labels = {WORKFLOW_LABEL: WORKFLOW_NAME, **PART_OF}
    replicas = {"Worker": replica_spec(config, step, target, labels, step.replicas)}
    # Pods stay after the job so that `argo logs` and `kubectl logs` can read them; under parameter
    # servers only the Chief's, since the others never end by themselves.
    clean_pod_policy = "None"
    if step.parameter_servers:
        replicas = {"Chief": replica_spec(config, step, target, labels, 1), **replicas,
                    "PS": replica_spec(config, step, target, labels, step.parameter_servers)}
        clean_pod_policy = "Running"
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name or f"{WORKFLOW_NAME}-{step.name}", "labels": labels},
        "spec": {
            "runPolicy": {"cleanPodPolicy": clean_pod_policy, "backoffLimit": step.retries},
            "tfReplicaSpecs": replicas,
        },
    }


def release_uri(storage: ClusterStorage, model_name: str, version: str) -> str:
    """Where select released one published version for serving (trainer.model_repository.release_dir,
    as a URI): a directory holding only `<version>/`, TF Serving's layout, so KServe gives the
    predictor that version and no other."""
    return posixpath.join(Layout(storage.uri).releases, model_name, version)


def grpc_flags(target: ClusterTarget) -> list[str]:
    """The server's gRPC port, and with a logger the server's own log of gRPC requests to the same
    URL: KServe's logger sees only HTTP, so each request is logged once whatever its protocol."""
    flags = ["--grpc-port", str(SERVING_GRPC_PORT)]
    if target.logger_url:
        flags += ["--log-url", target.logger_url, "--log-grpc-only"]
    return flags


def model_ready_path(model_name: str) -> str:
    """KServe's v2 model-ready route (kserve/protocol/rest/v2_endpoints.py): 200 once the model is
    loaded, 503 before. /v2/health/ready is not it: without a transformer it answers 200 always."""
    return f"/v2/models/{model_name}/ready"


def scaling(serving: ServingConfig, target: ClusterTarget, namespace: str,
            isvc_name: str) -> tuple[str, dict]:
    """The autoscaler class and the predictor's scaling fields: KServe's HPA (scaleMetric, scaleTarget),
    or KEDA on the InferenceService's own load in Prometheus (autoScaling, whose query selects its pods
    only: cluster_steps.release renames it with the canary)."""
    autoscaling = serving.autoscaling
    replicas = {"minReplicas": serving.min_replicas, "maxReplicas": serving.max_replicas}
    if not autoscaling.on_load:
        return HPA_CLASS, {**replicas, "scaleMetric": autoscaling.metric,
                           "scaleTarget": autoscaling.target_value}
    if target.prometheus_url is None:
        raise ConfigError(f"serving.autoscaling.metric: {autoscaling.metric} is read from Prometheus, and "
                          "this cluster has none: use metric cpu")
    external = {"metric": {"backend": PROMETHEUS_BACKEND, "serverAddress": target.prometheus_url,
                           "query": load_query(autoscaling.metric, namespace, isvc_name)},
                "target": {"type": "Value", "value": str(autoscaling.target_value)}}
    behavior = {"scaleDown": {"stabilizationWindowSeconds": autoscaling.scale_down_stabilization_seconds}}
    return KEDA_CLASS, {**replicas, "autoScaling": {"metrics": [{"type": "External", "external": external}],
                                                     "behavior": behavior}}


def inference_service(config: PipelineConfig, target: ClusterTarget, version: str, namespace: str) -> dict:
    """The InferenceService serving one published `version` (a number, or Argo's placeholder for it) in
    `namespace` (a name, or Argo's placeholder for it), with KServe's TF Serving or our server. A new
    version changes the predictor's pods, so every replica rolls to it."""
    serving = config.serving
    resources = serving.resources.as_manifest()
    storage_uri = release_uri(target.storage, config.model_name, version)
    autoscaler_class, scaling_fields = scaling(serving, target, namespace, config.model_name)
    predictor: dict = {
        **scaling_fields,
        "serviceAccountName": PREDICTOR_SERVICE_ACCOUNT,
        # Both runtimes: these are the predictor's (the Deployment's and its PodSpec's), not the container's.
        "deploymentStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": MAX_UNAVAILABLE, "maxSurge": MAX_SURGE}},
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
    }
    if target.logger_url:
        predictor["logger"] = {"mode": "all", "url": target.logger_url}
    if serving.runtime == "tensorflow":
        model = {"modelFormat": {"name": "tensorflow"}, "storageUri": storage_uri,
                 "runtimeVersion": serving.runtime_version or TF_SERVING_VERSION, "resources": resources}
        predictor["model"] = model
    else:
        predictor["containers"] = [{
            "name": PREDICTOR_CONTAINER,
            "image": target.images.serving,
            "imagePullPolicy": "IfNotPresent",
            "args": ["--model-base-path", KSERVE_MODEL_DIR, *serving_flags(config),
                     "--http-port", str(SERVING_HTTP_PORT), *grpc_flags(target)],
            # A custom container gets its model through the storage initializer, as built-in ones do.
            "env": [{"name": "STORAGE_URI", "value": storage_uri}],
            "ports": [{"name": PREDICTOR_PORT_NAME, "containerPort": SERVING_HTTP_PORT, "protocol": "TCP"},
                      {"name": GRPC_PORT_NAME, "containerPort": SERVING_GRPC_PORT, "protocol": "TCP"}],
            "resources": resources,
            "readinessProbe": {"httpGet": {"path": model_ready_path(config.model_name),
                                           "port": SERVING_HTTP_PORT},
                               "periodSeconds": READINESS_PERIOD_SECONDS,
                               "failureThreshold": READINESS_FAILURE_THRESHOLD},
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        }]
    return {
        "apiVersion": ISVC_API_VERSION,
        "kind": "InferenceService",
        "metadata": {"name": config.model_name, "labels": dict(PART_OF),
                     "annotations": {DEPLOYMENT_MODE_ANNOTATION: STANDARD_MODE,
                                     AUTOSCALER_CLASS_ANNOTATION: autoscaler_class,
                                     MODEL_VERSION_ANNOTATION: version}},
        "spec": {"predictor": predictor},
    }


# --- Kubeflow Trainer v2: our TensorFlow runtime and the TrainJobs that run on it ---------------------

TRAINJOB_API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME_NAME = "dist-ml-tensorflow"  # synchronous; `-ps` under parameter servers
# Trainer v2 fills one replicated job of a runtime from a TrainJob (image, command, env, numNodes, its
# resources): the one with this label, and in it only the container named `node` (kubeflow/trainer
# v2.3.0 pkg/constants/constants.go: LabelTrainJobAncestor, AncestorTrainer, Node).
ANCESTOR_LABEL, ANCESTOR_TRAINER = "trainer.kubeflow.org/trainjob-ancestor-step", "trainer"
NODE_CONTAINER, PS_CONTAINER = tf_cluster.NODE_JOB, tf_cluster.PS_JOB
PS_COMMAND = ["python", "-m", "trainer.parameter_server"]  # the ps pods serve; they train no variant
# The runtimePatches entry the train step owns (Trainer v2 wants a domain-prefixed manager; Kueue adds
# its own, kueue.x-k8s.io/manager): the node count for the ps pods, which TrainJob.spec.trainer misses.
STEP_PATCH_MANAGER = "dist-ml.io/train-step"
# Pods' exit status on a user's mistake (common.cli.UsageError): restarting the set cannot mend it.
USAGE_ERROR_EXIT = 2
# Kubernetes' Job names the podFailurePolicy rule's match in its failure message ("Pod ns/x has
# condition DisruptionTarget matching FailJob rule at index 0", "Container node for pod ns/x failed
# with exit code 2 matching ..."; pkg/controller/job/pod_failure_policy.go), which JobSet's rules
# match: a preempted node's pod has condition DisruptionTarget.
FAILED_POD_RULES = (
    {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]},
    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [USAGE_ERROR_EXIT]}},
)
# Rule names match JobSet's pattern (v0.12.0 pkg/webhooks/jobset_webhook.go ruleNameFmt: letters, digits,
# `_`, `,` and `:`; no hyphen): its webhook refuses the JobSet otherwise, and Trainer then only records
# an event on the TrainJob.
FAILED_JOB_RULES = (
    {"name": "preempted", "action": "RestartJobSetAndIgnoreMaxRestarts",
     "onJobFailureReasons": ["PodFailurePolicy"],
     "onJobFailureMessagePatterns": ["condition DisruptionTarget matching"]},
    {"name": "usage_error", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
     "onJobFailureMessagePatterns": [f"exit code {USAGE_ERROR_EXIT} matching"]},
)  # any other failure: JobSet's default action, RestartJobSet, counted against maxRestarts


def runtime_name(parameter_servers: int) -> str:
    return f"{RUNTIME_NAME}-ps" if parameter_servers else RUNTIME_NAME


def label_field(label: str) -> dict:
    """An environment variable's value from one of the pod's labels (the downward API)."""
    return {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}


def jobset_pod_env(parameter_servers: int) -> list[dict]:
    """What every pod of the runtime knows besides the node count (trainer.cluster.JOBSET_ENV): its
    JobSet and replicated job from JobSet's labels, its index from its Indexed Job's annotation (as
    Kubernetes would also set JOB_COMPLETION_INDEX), the port, and the parameter servers."""
    return [
        {"name": tf_cluster.JOBSET_NAME_ENV, "valueFrom": label_field(JOBSET_NAME_LABEL)},
        {"name": tf_cluster.REPLICATED_JOB_ENV, "valueFrom": label_field(REPLICATED_JOB_LABEL)},
        {"name": tf_cluster.COMPLETION_INDEX_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": tf_cluster.PORT_ENV, "value": str(tf_cluster.TF_PORT)},
        {"name": tf_cluster.PARAMETER_SERVERS_ENV, "value": str(parameter_servers)},
    ]


def num_nodes_env(nodes: int) -> dict:
    return {"name": tf_cluster.NUM_NODES_ENV, "value": str(nodes)}


def runtime_pod(target: ClusterTarget, container_spec: dict) -> dict:
    """A runtime pod template: the storage, the trainer's identity, the training pool; a failed pod is
    not restarted in place (its Job fails, and JobSet restarts the whole set)."""
    metadata = {"annotations": dict(target.storage.pod_annotations)} if target.storage.pod_annotations else {}
    spec: dict = {"serviceAccountName": TRAINER_SERVICE_ACCOUNT, "restartPolicy": "Never",
                  "containers": [container_spec], "volumes": [target.storage.volume()]}
    if target.training_node_selector:
        spec["nodeSelector"] = dict(target.training_node_selector)
    if target.training_tolerations:
        spec["tolerations"] = [dict(toleration) for toleration in target.training_tolerations]
    return {"metadata": metadata, "spec": spec}


def runtime_container(name: str, image: str, parameter_servers: int, **fields: object) -> dict:
    port = {"name": tf_cluster.TF_PORT_NAME, "containerPort": tf_cluster.TF_PORT, "protocol": "TCP"}
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent",
            "env": jobset_pod_env(parameter_servers), "ports": [port], "volumeMounts": [storage_mount()],
            **fields}


def one_try_job(pod: dict, **fields: object) -> dict:
    """A replicated job's Job: one try per pod, and a failure that says why, for JobSet's rules."""
    return {"backoffLimit": 0, "podFailurePolicy": {"rules": [dict(rule) for rule in FAILED_POD_RULES]},
            **fields, "template": pod}


def training_runtime(config: PipelineConfig, target: ClusterTarget, parameter_servers: int = 0) -> dict:
    """Our TensorFlow ClusterTrainingRuntime, for Kubeflow Trainer v2 (which ships none).

    `node`, the replicated job Trainer fills from a TrainJob, holds the workers (under parameter
    servers also the chief, node 0); `ps` the parameter servers, which never exit: under them the
    node Job succeeds when the chief does (Kubernetes' Job successPolicy on index 0, which stops the
    workers), and the JobSet when `node` does (its successPolicy), deleting the ps Job. Every pod
    builds its TF_CONFIG from its environment (trainer.cluster), naming the others by JobSet's
    hostnames on TF_PORT. A failed pod fails its Job, and JobSet restarts every Job (failurePolicy):
    training resumes from the variant's backup, up to `pipeline.retries` times; a preempted node's
    pod restarts it without counting, a user's mistake (exit status 2) fails it at once. mlPolicy
    without a framework is Trainer's PlainML: it sets numNodes and the TrainJob's env, nothing else.
    """
    nodes = tf_cluster.jobset_replicas(config.workers, parameter_servers)[tf_cluster.NODE_JOB]
    gpus = target.training_gpus
    image = target.images.trainer_for(gpus, runtime_name(parameter_servers))
    node = runtime_container(NODE_CONTAINER, image, parameter_servers,
                             resources=with_gpus(config.trainer_resources.as_manifest(), gpus))
    node_job = one_try_job(runtime_pod(target, node))
    replicated_jobs = [{"name": tf_cluster.NODE_JOB, "template": {
        "metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}}, "spec": node_job}}]
    if parameter_servers:
        node_job["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}  # the chief's
        # Parameter servers hold variables and compute no steps: no GPU, the CPU image.
        ps_container = runtime_container(PS_CONTAINER, target.images.trainer, parameter_servers,
                                         command=PS_COMMAND, resources=config.trainer_resources.as_manifest())
        ps_job = one_try_job(runtime_pod(target, ps_container), parallelism=parameter_servers,
                             completions=parameter_servers)
        replicated_jobs.append({"name": tf_cluster.PS_JOB, "template": {"spec": ps_job}})
    jobset = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [tf_cluster.NODE_JOB]},
        "failurePolicy": {"maxRestarts": config.retries, "rules": [dict(rule) for rule in FAILED_JOB_RULES]},
        "replicatedJobs": replicated_jobs,
    }
    return {"apiVersion": TRAINJOB_API_VERSION, "kind": "ClusterTrainingRuntime",
            "metadata": {"name": runtime_name(parameter_servers), "labels": dict(PART_OF)},
            "spec": {"mlPolicy": {"numNodes": nodes}, "template": {"spec": jobset}}}


def runtime_names(config: PipelineConfig) -> dict[str, int]:
    """The runtimes the config's variants train on, with their parameter servers: synchronous, and
    the one with pipeline.parameterServers."""
    servers = sorted({config.parameter_servers_of(variant) for variant in config.variants})
    return {runtime_name(count): count for count in servers}


def training_runtimes(config: PipelineConfig, target: ClusterTarget) -> list[dict]:
    return [training_runtime(config, target, count) for count in runtime_names(config).values()]


def trainjob(config: PipelineConfig, step: Step, target: ClusterTarget, name: str | None = None) -> dict:
    """The TrainJob of a training step, on our runtime, in Kueue's training queue (which admits all of
    its pods at once, or none): the step's command on `numNodes` node pods with a worker's resources.
    Its default name is the workflow's plus the step's, so that every run creates its own."""
    nodes = tf_cluster.jobset_replicas(step.replicas, step.parameter_servers)[tf_cluster.NODE_JOB]
    gpus = target.training_gpus
    labels = {QUEUE_NAME_LABEL: TRAINING_QUEUE, WORKFLOW_LABEL: WORKFLOW_NAME, **PART_OF}
    spec: dict = {
        "runtimeRef": {"apiGroup": TRAINJOB_API_VERSION.partition("/")[0], "kind": "ClusterTrainingRuntime",
                       "name": runtime_name(step.parameter_servers)},
        # The same resources as the runtime's node container: Kueue v0.19.2 counts resourcesPerNode alone
        # (it vendors Trainer v2.2.1, which replaced the runtime's with it), Trainer v2.3.0 merges them.
        "trainer": {"image": target.images.of(step, gpus), "command": gpus_command(step.command, gpus),
                    "numNodes": nodes, "env": [num_nodes_env(nodes)],
                    "resourcesPerNode": with_gpus(step.resources.as_manifest(), gpus)},
    }
    if step.parameter_servers:
        ps_pods = {"name": tf_cluster.PS_JOB, "template": {"spec": {"template": {"spec": {
            "containers": [{"name": PS_CONTAINER, "env": [num_nodes_env(nodes)]}]}}}}}
        spec["runtimePatches"] = [{"manager": STEP_PATCH_MANAGER, "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [ps_pods]}}}}]
    return {"apiVersion": TRAINJOB_API_VERSION, "kind": "TrainJob",
            "metadata": {"name": name or f"{WORKFLOW_NAME}-{step.name}", "labels": labels}, "spec": spec}
