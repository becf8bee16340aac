"""What a cluster gives the objects the pipeline puts on it: the images its pods run, the storage every
pipeline pod mounts, where training pods go (the training pool's labels, taints and GPUs), and its
platform's settings. One home for these types, on the floor every user of them may import: the
training engines (engines/), the cluster steps, the Argo renderer (pipeline/), the Pulumi components
(infra/) and the stacks. Standard library only.
"""

from __future__ import annotations

import dataclasses

from common.cluster_names import CLUSTER_STORAGE_ROOT

DEFAULT_ARGO_VERSION = "v4.1.2"
# The Kubernetes both stacks run: k3s's image on k3d, the GKE control plane's minimum, what the rendered
# objects are validated against and what the control-plane tier builds. 1.35: the newest minor inside
# every pinned controller's tested range, upstream's until 2027-02-28 (docs/reference/kubernetes.md).
KUBERNETES_MINOR = "1.35"
K3S_IMAGE = "rancher/k3s:v1.35.8-k3s1"
IMAGE_TAG = "0.1.0"  # the release these defaults name; the stacks pass content-tagged images
STORAGE_CLAIM_NAME = "dist-ml-storage"
STORAGE_VOLUME = "storage"
PART_OF = {"app.kubernetes.io/part-of": "dist-ml"}
# The stacks' Prometheus (infra/monitoring.py prometheus_url): a render's default.
DEFAULT_PROMETHEUS_URL = "http://monitoring-kube-prometheus-prometheus.monitoring.svc:9090"
GCS_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
# The user the trainer and serving images run as (their Dockerfiles' USER).
IMAGE_USER = 1000
# GCS FUSE mounts as root unless told otherwise: the images' user must own what it writes, and
# directories need no placeholder objects to be listed.
GCS_FUSE_MOUNT_OPTIONS = f"implicit-dirs,uid={IMAGE_USER},gid={IMAGE_USER},file-mode=664,dir-mode=775"
# One identity per actor, so that each holds only its own rights: the workflow's pods have the
# pipeline's service account (config), training pods, the predictor and the request logger these.
TRAINER_SERVICE_ACCOUNT = "dist-ml-trainer"
PREDICTOR_SERVICE_ACCOUNT = "dist-ml-predictor"
GPU_RESOURCE = "nvidia.com/gpu"  # the extended resource NVIDIA's device plugin advertises
# trainer.train's flag for the GPUs its pod was given: it fails at once if TensorFlow sees fewer.
GPUS_FLAG = "--gpus"


class ImageMissing(ValueError):
    """A pod needs an image the cluster target does not have."""


@dataclasses.dataclass(frozen=True)
class Images:
    trainer: str = f"dist-ml/trainer:{IMAGE_TAG}"
    serving: str = f"dist-ml/serving:{IMAGE_TAG}"
    # The trainer with CUDA (trainer-gpu/Dockerfile), for training pods given GPUs: only stacks whose
    # training pool has GPUs build it.
    trainer_gpu: str | None = None
    tracking_server: str = f"dist-ml/tracking-server:{IMAGE_TAG}"  # MLflow's server (infra/tracking.py)

    def trainer_for(self, gpus: int, pods: str) -> str:
        """The trainer image of `pods` given `gpus` GPUs each: the GPU trainer image when any."""
        if not gpus:
            return self.trainer
        if self.trainer_gpu is None:
            raise ImageMissing(
                f"{pods}: its pods are given GPUs, which need the GPU trainer image, and the "
                "cluster target has none"
            )
        return self.trainer_gpu


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
        {
            "csi": {
                "driver": GCS_FUSE_DRIVER,
                "volumeAttributes": {"bucketName": bucket, "mountOptions": GCS_FUSE_MOUNT_OPTIONS},
            }
        },
        f"gs://{bucket}",
        pod_annotations={"gke-gcsfuse/volumes": "true"},
    )


@dataclasses.dataclass(frozen=True)
class ClusterTarget:
    """What a cluster gives the rendered objects: images, storage, and its platform's settings."""

    images: Images = Images()
    storage: ClusterStorage = dataclasses.field(default_factory=pvc_storage)
    argo_version: str = DEFAULT_ARGO_VERSION
    logger_url: str | None = None  # where the predictor's KServe logger posts CloudEvents
    prometheus_url: str | None = DEFAULT_PROMETHEUS_URL  # where KEDA reads the load; None: no Prometheus
    # Where training pods run: the training node pool's labels and taints, and its GPUs per node.
    training_tolerations: tuple[dict, ...] = ()  # e.g. a GPU pool's taint
    training_node_selector: dict = dataclasses.field(default_factory=dict)
    training_gpus: int = 0
    tracking_uri: str | None = None  # the MLflow tracking server the pipeline's pods record into; None: none

    def training_placement(self, spec: dict) -> dict:
        """A pod spec with the training pool's node selector and tolerations, when it has any."""
        if self.training_node_selector:
            spec["nodeSelector"] = dict(self.training_node_selector)
        if self.training_tolerations:
            spec["tolerations"] = [dict(toleration) for toleration in self.training_tolerations]
        return spec


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
