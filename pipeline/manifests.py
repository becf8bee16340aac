"""The Kubernetes objects the pipeline's steps become: TFJobs and the InferenceService (the HTTPRoute
that splits requests between the stable and the canary InferenceService is cluster_steps.release's).

Plain dicts built from the step definitions, for the Argo templates and for the Pulumi programs, which
differ only in the images and the storage they pass in.
"""

from __future__ import annotations

import dataclasses
import posixpath

from cluster_steps.names import MODEL_VERSION_ANNOTATION, PREDICTOR_CONTAINER
from pipeline.config import PipelineConfig
from pipeline.definition import (
    CLUSTER_STORAGE_ROOT,
    SERVING_IMAGE,
    TRAINER_IMAGE,
    Layout,
    Step,
    serving_flags,
)

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

    def of(self, step: Step, gpus: int = 0) -> str:
        """The image of `step`'s pods; given GPUs, the trainer's is the GPU trainer image."""
        if gpus and step.image == TRAINER_IMAGE:
            if self.trainer_gpu is None:
                raise ImageMissing(f"step {step.name}: its pods are given GPUs, which need the GPU trainer "
                                   "image, and the cluster target has none")
            return self.trainer_gpu
        return {TRAINER_IMAGE: self.trainer, SERVING_IMAGE: self.serving}[step.image]


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
    # Where TFJob pods run: the training node pool's labels and taints, and its GPUs per node.
    training_tolerations: tuple[dict, ...] = ()  # e.g. a GPU pool's taint
    training_node_selector: dict = dataclasses.field(default_factory=dict)
    training_gpus: int = 0


GPU_RESOURCE = "nvidia.com/gpu"  # the extended resource NVIDIA's device plugin advertises
# trainer.train's flag for the GPUs its pod was given: it fails at once if TensorFlow sees fewer.
GPUS_FLAG = "--gpus"


def storage_mount() -> dict:
    return {"name": STORAGE_VOLUME, "mountPath": CLUSTER_STORAGE_ROOT}


def container(step: Step, name: str, images: Images, gpus: int = 0) -> dict:
    resources = step.resources.as_manifest()
    command = step.command
    if gpus:
        # Extended resources cannot be overcommitted: Kubernetes requires requests equal to limits.
        for kind in ("requests", "limits"):
            resources[kind][GPU_RESOURCE] = gpus
        command = [*command, GPUS_FLAG, str(gpus)]
    return {"name": name, "image": images.of(step, gpus), "imagePullPolicy": "IfNotPresent",
            "command": command, "volumeMounts": [storage_mount()], "resources": resources}


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


def inference_service(config: PipelineConfig, target: ClusterTarget, version: str) -> dict:
    """The InferenceService serving one published `version` (a number, or Argo's placeholder for it),
    with KServe's TF Serving or our server. A new version changes the predictor's pods, so every
    replica rolls to it."""
    serving = config.serving
    resources = serving.resources.as_manifest()
    storage_uri = release_uri(target.storage, config.model_name, version)
    predictor: dict = {
        "minReplicas": serving.min_replicas,
        "maxReplicas": serving.max_replicas,
        "scaleMetric": serving.scale_metric,
        "scaleTarget": serving.scale_target,
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
                                     MODEL_VERSION_ANNOTATION: version}},
        "spec": {"predictor": predictor},
    }
