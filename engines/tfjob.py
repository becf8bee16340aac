"""The training operator v1 (kubeflow/trainer v1.9.x): each variant trains as a TFJob, whose replicas
the operator starts at once (no queue). Kubeflow is retiring it for Trainer v2 (engines/trainjob.py);
kept for clusters that run it (docs/concepts/training.md#moving-from-tfjob).
"""

from __future__ import annotations

from common.cluster_names import CustomResource
from common.cluster_target import (
    IMAGE_USER,
    PART_OF,
    TRAINER_SERVICE_ACCOUNT,
    ClusterTarget,
    gpus_command,
    storage_mount,
    with_gpus,
)
from common.pod_security import container_security_context, pod_security_context
from engines.base import Install, KustomizeInstall, MetricsSource, TrainingEngine, TrainingSpec, env_list

TFJOB = CustomResource("TFJob", "kubeflow.org", "v1", "tfjobs")
TFJOB_CONTAINER = "tensorflow"  # the training operator requires this name
TFJOB_NAME_LABEL = "training.kubeflow.org/job-name"  # the operator labels a TFJob's pods with its name
TRAINING_OPERATOR_REPOSITORY = "https://github.com/kubeflow/trainer"  # the training operator's, up to v1.9
TRAINING_OPERATOR_OVERLAY = "manifests/overlays/standalone"
# The training operator's Service (manifests/base/service.yaml of kubeflow/trainer v1.9.x): its
# container port 8080 has no name upstream, the Service's port does.
TRAINING_OPERATOR_NAMESPACE = "kubeflow"
TRAINING_OPERATOR_SERVICE_LABELS = {"app": "training-operator"}
TRAINING_OPERATOR_METRICS_PORT = "monitoring-port"
# A failed container restarts in place (same pod, same address in every TF_CONFIG) and resumes from
# BackupAndRestore. The training operator fails a TFJob as soon as any replica's pod has failed
# (kubeflow/trainer v1.9.4 pkg/controller.v1/tensorflow/tfjob_controller.go UpdateJobStatus), so a
# lost worker is tolerated only because its pod does not fail.
RESTART_POLICY = "OnFailure"


def pod_template(spec: TrainingSpec, target: ClusterTarget, labels: dict) -> dict:
    metadata: dict = {"labels": labels}
    if target.storage.pod_annotations:
        metadata["annotations"] = dict(target.storage.pod_annotations)
    gpus = target.training_gpus
    resources = {kind: dict(amounts) for kind, amounts in spec.resources.items()}
    container = {
        "name": TFJOB_CONTAINER,
        "image": target.images.trainer_for(gpus, f"step {spec.step}"),
        "imagePullPolicy": "IfNotPresent",
        "command": gpus_command(list(spec.command), gpus),
        "volumeMounts": [storage_mount()],
        "resources": with_gpus(resources, gpus),
        "securityContext": container_security_context(),
    }
    if spec.env:
        container["env"] = env_list(spec.env)
    pod = target.training_placement(
        {
            "serviceAccountName": TRAINER_SERVICE_ACCOUNT,
            # Training writes checkpoints and exports to the storage volume as the images' user.
            "securityContext": pod_security_context(IMAGE_USER),
            "containers": [container],
            "volumes": [target.storage.volume()],
        }
    )
    return {"metadata": metadata, "spec": pod}


def replica_spec(spec: TrainingSpec, target: ClusterTarget, labels: dict, replicas: int) -> dict:
    return {
        "replicas": replicas,
        "restartPolicy": RESTART_POLICY,
        "template": pod_template(spec, target, labels),
    }


def tfjob(spec: TrainingSpec, target: ClusterTarget) -> dict:
    """The TFJob of a training step: `workers` Worker replicas that restart on failure and resume;
    under parameter servers also a Chief (the coordinator) and `parameterServers` PS replicas.

    With a Chief, the job succeeds when the Chief does (the default successPolicy ""; AllWorkers
    would wait for workers that never exit), and cleanPodPolicy Running then deletes the workers
    and parameter servers, which serve until stopped. A restarted PS comes back without the
    variables: the coordinator fails, and the restarted Chief restores its last epoch's backup.
    """
    labels = {**spec.labels, **PART_OF}
    replicas = {"Worker": replica_spec(spec, target, labels, spec.workers)}
    # Pods stay after the job so that `argo logs` and `kubectl logs` can read them; under parameter
    # servers only the Chief's, since the others never end by themselves.
    clean_pod_policy = "None"
    if spec.parameter_servers:
        replicas = {
            "Chief": replica_spec(spec, target, labels, 1),
            **replicas,
            "PS": replica_spec(spec, target, labels, spec.parameter_servers),
        }
        clean_pod_policy = "Running"
    return {
        "apiVersion": f"{TFJOB.group}/{TFJOB.version}",
        "kind": TFJOB.kind,
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {
            "runPolicy": {"cleanPodPolicy": clean_pod_policy, "backoffLimit": spec.retries},
            "tfReplicaSpecs": replicas,
        },
    }


class TFJobEngine(TrainingEngine):
    """The training operator v1's TFJob; its pods start at once, with no queue."""

    name = "tfjob"
    job_resource = TFJOB
    succeeded = "Succeeded"
    pod_label = TFJOB_NAME_LABEL
    stack_keys = {"platform": ("training_operator_version",)}

    def job(self, spec: TrainingSpec, target: ClusterTarget) -> dict:
        return tfjob(spec, target)

    def installs(self, versions: dict[str, str], namespace: str) -> list[Install]:
        return [
            KustomizeInstall("training-operator", TRAINING_OPERATOR_REPOSITORY,
                             versions["training_operator_version"], TRAINING_OPERATOR_OVERLAY,
                             control_plane_ports=(9443,))  # its webhook server
        ]

    def metrics(self) -> MetricsSource:
        return MetricsSource(
            "training-operator",
            TRAINING_OPERATOR_NAMESPACE,
            TRAINING_OPERATOR_SERVICE_LABELS,
            {"port": TRAINING_OPERATOR_METRICS_PORT, "path": "/metrics"},
        )

    def dashboard(self, namespace: str) -> tuple[str, dict[str, str]]:
        """The training operator's TFJob counts."""
        return "TFJobs", {
            name: f'sum(training_operator_jobs_{name}_total{{job_namespace="{namespace}"}})'
            for name in ("created", "successful", "failed", "restarted")
        }

    def progress(self, job: dict, pods: list[dict]) -> str:
        """Each replica type's counts, e.g. `Worker: 2 active`."""
        counts = []
        for kind, status in sorted(((job.get("status") or {}).get("replicaStatuses") or {}).items()):
            shown = [f"{status[key]} {key}" for key in ("active", "succeeded", "failed") if status.get(key)]
            counts.append(f"{kind}: {', '.join(shown) or 'none started'}")
        return "; ".join(counts) or "no replica started yet"
