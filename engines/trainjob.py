"""Kubeflow Trainer v2: each variant trains as a TrainJob on our TensorFlow runtime (Trainer ships none),
which Trainer turns into a JobSet, admitted whole by Kueue (docs/concepts/training.md).

What the platform installs: Trainer's manager overlay (its CRDs and webhooks, and the JobSet release it
is built on) and Kueue's chart with our Configuration; beside the pipeline, our ClusterTrainingRuntimes
and Kueue's ResourceFlavor, ClusterQueue and LocalQueue for the training pool.
"""

from __future__ import annotations

import datetime
import re

import yaml

from common.cluster_names import DNS_LABEL_LENGTH, CustomResource
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
from engines.base import (
    ChartInstall,
    Install,
    JobApi,
    KustomizeInstall,
    MetricsSource,
    QueuePlacement,
    TrainingEngine,
    TrainingNeverSucceeds,
    TrainingSpec,
    condition,
    described,
    env_list,
)
from trainer import cluster as tf_cluster

TRAINJOB = CustomResource("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs")
WORKLOAD = CustomResource("Workload", "kueue.x-k8s.io", "v1beta2", "workloads")
RUNTIME_KIND = "ClusterTrainingRuntime"
RUNTIME_NAME = "dist-ml-tensorflow"  # synchronous; `-ps` under parameter servers
# JobSet labels its pods with the JobSet's name, which Trainer v2 gives the TrainJob's; and with the
# replicated job's.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"  # JobSet's count of its restarts, on pods
# Kueue: the label that puts a job in a LocalQueue, and the one on the Workload it makes for a job.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOAD_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
TRAINING_QUEUE = "dist-ml-training"  # the LocalQueue of the pipeline's namespace (never `default`)
CLUSTER_QUEUE = "dist-ml-training"
FLAVOR_PREFIX = "dist-ml-"
# Kueue's own admission check controller for ProvisioningRequests (kueue v0.19.2
# pkg/controller/admissionchecks/provisioning/constants.go ControllerName); the check and its config
# are ours.
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
PROVISIONING_CHECK = "dist-ml-provisioning"
CHECK_READY = "Ready"  # a Workload's admission check state once its controller lets the job start
KUEUE_API_VERSION = f"{WORKLOAD.group}/{WORKLOAD.version}"
# Kubernetes ends a Job's pod names with 5 random characters; JobSet's webhook counts them in
# (jobset v0.12.0 pkg/webhooks/jobset_webhook.go: `<jobset>-<job>-<jobIndex>-<podIndex>-abcde`).
POD_NAME_SUFFIX = "-abcde"

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
    {
        "name": "preempted",
        "action": "RestartJobSetAndIgnoreMaxRestarts",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": ["condition DisruptionTarget matching"],
    },
    {
        "name": "usage_error",
        "action": "FailJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": [f"exit code {USAGE_ERROR_EXIT} matching"],
    },
)  # any other failure: JobSet's default action, RestartJobSet, counted against maxRestarts

# Kubeflow Trainer v2: the controller, its CRDs and webhooks, and the JobSet release it is built on
# (v2.3.0's overlay pulls JobSet v0.12.0's manifests), in kubeflow-system; upstream applies it
# server-side, as the provider does everything. No built-in runtime: ours is the pipeline's.
TRAINER_REPOSITORY = "https://github.com/kubeflow/trainer"
TRAINER_OVERLAY = "manifests/overlays/manager"
TRAINER_NAMESPACE = "kubeflow-system"  # the overlay creates it
KUEUE_CHARTS = "oci://registry.k8s.io/kueue/charts"
KUEUE_CHART = "kueue"
KUEUE_NAMESPACE = "kueue-system"
# The controller's image as Kueue's release packages its chart (hack/helm-chart-package.sh sets the
# repository, the tag and IfNotPresent; its chart in the module names a staging image, pulled Always),
# so that the chart renders the same from the registry and from its module.
KUEUE_IMAGE = "registry.k8s.io/kueue/kueue"
# How long Kueue lets an admitted job's pods take to be ready (pulled, scheduled, started) before it
# evicts the job and queues it again (waitForPodsReady): a new GKE node and a TensorFlow image pull
# take minutes. Requeues are not limited: the train step's timeout bounds the wait.
PODS_READY_TIMEOUT = "15m"
# Kueue's metrics Service (kueue v0.19.2 charts/kueue: metricsService, its labels in _helpers.tpl): its
# port `https` serves /metrics to a caller whose token may GET it (kube-prometheus-stack's Prometheus
# may), over TLS with Kueue's own certificate (the chart's ServiceMonitor skips its verification too).
KUEUE_METRICS_SERVICE_LABELS = {
    "app.kubernetes.io/name": "kueue",
    "app.kubernetes.io/component": "metrics-service",
}
KUEUE_METRICS_ENDPOINT = {
    "port": "https",
    "path": "/metrics",
    "scheme": "https",
    "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
    "tlsConfig": {"insecureSkipVerify": True},
}
# Warning events that say an object of a TrainJob's was not created, by reason, with the kind they are
# recorded on: Trainer v2.3.0's (pkg/controller/trainjob_controller.go), JobSet v0.12.0's
# (pkg/controllers/jobset_controller.go), Kubernetes' Job controller's (pkg/controller/job).
NOT_CREATED = {
    "TrainJobResourcesCreationFailed": "TrainJob",
    "JobCreationFailed": "JobSet",
    "HeadlessServiceCreationFailed": "JobSet",
    "FailedCreate": "Job",
}
# The API server's or a webhook's refusal: the same object is refused on every retry (Trainer builds the
# JobSet from its snapshot of the runtime, taken once). A ResourceQuota's refusal passes once others end.
REFUSED = re.compile(r"denied the request|is invalid|not found|is forbidden(?!: exceeded quota)")
# Kueue v0.19.2's scheduler (pkg/scheduler/flavorassigner/flavorassigner.go) when a pod set can never
# get the queue's flavor: it asks for more than the ClusterQueue could ever lend it ("... > maximum
# capacity (...)"), or its pods' node selector excludes the flavor's node labels. Our ClusterQueue has
# one flavor, so either reason is the whole answer.
NEVER_ADMITTED = ("> maximum capacity", "doesn't match node affinity")
INADMISSIBLE = "Inadmissible"  # Kueue's QuotaReserved reason for a missing or inactive queue


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
        {
            "name": tf_cluster.COMPLETION_INDEX_ENV,
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        },
        {"name": tf_cluster.PORT_ENV, "value": str(tf_cluster.TF_PORT)},
        {"name": tf_cluster.PARAMETER_SERVERS_ENV, "value": str(parameter_servers)},
    ]


def num_nodes_env(nodes: int) -> dict:
    return {"name": tf_cluster.NUM_NODES_ENV, "value": str(nodes)}


def runtime_pod(target: ClusterTarget, container_spec: dict) -> dict:
    """A runtime pod template: the storage, the trainer's identity, the training pool; a failed pod is
    not restarted in place (its Job fails, and JobSet restarts the whole set)."""
    metadata = {"annotations": dict(target.storage.pod_annotations)} if target.storage.pod_annotations else {}
    spec = target.training_placement(
        {
            "serviceAccountName": TRAINER_SERVICE_ACCOUNT,
            "restartPolicy": "Never",
            # Training writes checkpoints and exports to the storage volume as the images' user.
            "securityContext": pod_security_context(IMAGE_USER),
            "containers": [container_spec],
            "volumes": [target.storage.volume()],
        }
    )
    return {"metadata": metadata, "spec": spec}


def runtime_container(name: str, image: str, parameter_servers: int, **fields: object) -> dict:
    port = {"name": tf_cluster.TF_PORT_NAME, "containerPort": tf_cluster.TF_PORT, "protocol": "TCP"}
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": jobset_pod_env(parameter_servers),
        "ports": [port],
        "volumeMounts": [storage_mount()],
        # A TrainJob's trainer (image, command, env, resources) is merged into it: this stays.
        "securityContext": container_security_context(),
        **fields,
    }


def one_try_job(pod: dict, **fields: object) -> dict:
    """A replicated job's Job: one try per pod, and a failure that says why, for JobSet's rules."""
    return {
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": [dict(rule) for rule in FAILED_POD_RULES]},
        **fields,
        "template": pod,
    }


def training_runtime(spec: TrainingSpec, target: ClusterTarget) -> dict:
    """Our TensorFlow ClusterTrainingRuntime for jobs like `spec` (its workers, parameter servers,
    resources and restarts).

    `node`, the replicated job Trainer fills from a TrainJob, holds the workers (under parameter
    servers also the chief, node 0); `ps` the parameter servers, which never exit: under them the
    node Job succeeds when the chief does (Kubernetes' Job successPolicy on index 0, which stops the
    workers), and the JobSet when `node` does (its successPolicy), deleting the ps Job. Every pod
    builds its TF_CONFIG from its environment (trainer.cluster), naming the others by JobSet's
    hostnames on TF_PORT. A failed pod fails its Job, and JobSet restarts every Job (failurePolicy):
    training resumes from the variant's backup, up to `retries` times; a preempted node's pod
    restarts it without counting, a user's mistake (exit status 2) fails it at once. mlPolicy
    without a framework is Trainer's PlainML: it sets numNodes and the TrainJob's env, nothing else.
    """
    parameter_servers = spec.parameter_servers
    nodes = tf_cluster.jobset_replicas(spec.workers, parameter_servers)[tf_cluster.NODE_JOB]
    gpus = target.training_gpus
    image = target.images.trainer_for(gpus, runtime_name(parameter_servers))
    node = runtime_container(
        NODE_CONTAINER, image, parameter_servers, resources=with_gpus(dict_copy(spec.resources), gpus)
    )
    node_job = one_try_job(runtime_pod(target, node))
    replicated_jobs = [
        {
            "name": tf_cluster.NODE_JOB,
            "template": {"metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}}, "spec": node_job},
        }
    ]
    if parameter_servers:
        node_job["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}  # the chief's
        # Parameter servers hold variables and compute no steps: no GPU, the CPU image.
        ps_container = runtime_container(
            PS_CONTAINER,
            target.images.trainer,
            parameter_servers,
            command=PS_COMMAND,
            resources=dict_copy(spec.resources),
        )
        ps_job = one_try_job(
            runtime_pod(target, ps_container), parallelism=parameter_servers, completions=parameter_servers
        )
        replicated_jobs.append({"name": tf_cluster.PS_JOB, "template": {"spec": ps_job}})
    jobset = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [tf_cluster.NODE_JOB]},
        "failurePolicy": {"maxRestarts": spec.retries, "rules": [dict(rule) for rule in FAILED_JOB_RULES]},
        "replicatedJobs": replicated_jobs,
    }
    return {
        "apiVersion": api_version(TRAINJOB),
        "kind": RUNTIME_KIND,
        "metadata": {"name": runtime_name(parameter_servers), "labels": dict(PART_OF)},
        "spec": {"mlPolicy": {"numNodes": nodes}, "template": {"spec": jobset}},
    }


def api_version(resource: CustomResource) -> str:
    return f"{resource.group}/{resource.version}"


def dict_copy(resources: dict) -> dict:
    """Requests and limits, copied two levels deep (with_gpus adds to them)."""
    return {kind: dict(amounts) for kind, amounts in resources.items()}


def trainjob(spec: TrainingSpec, target: ClusterTarget) -> dict:
    """The TrainJob of a training step, on our runtime, in Kueue's training queue (which admits all of
    its pods at once, or none): the step's command on `numNodes` node pods with a worker's resources."""
    nodes = tf_cluster.jobset_replicas(spec.workers, spec.parameter_servers)[tf_cluster.NODE_JOB]
    gpus = target.training_gpus
    labels = {QUEUE_NAME_LABEL: TRAINING_QUEUE, **spec.labels, **PART_OF}
    body: dict = {
        "runtimeRef": {
            "apiGroup": TRAINJOB.group,
            "kind": RUNTIME_KIND,
            "name": runtime_name(spec.parameter_servers),
        },
        # The same resources as the runtime's node container: Kueue v0.19.2 counts resourcesPerNode alone
        # (it vendors Trainer v2.2.1, which replaced the runtime's with it), Trainer v2.3.0 merges them.
        "trainer": {
            "image": target.images.trainer_for(gpus, f"step {spec.step}"),
            "command": gpus_command(list(spec.command), gpus),
            "numNodes": nodes,
            "env": [num_nodes_env(nodes), *env_list(spec.env)],
            "resourcesPerNode": with_gpus(dict_copy(spec.resources), gpus),
        },
    }
    if spec.parameter_servers:
        ps_pods = {
            "name": tf_cluster.PS_JOB,
            "template": {
                "spec": {
                    "template": {
                        "spec": {"containers": [{"name": PS_CONTAINER, "env": [num_nodes_env(nodes)]}]}
                    }
                }
            },
        }
        body["runtimePatches"] = [
            {
                "manager": STEP_PATCH_MANAGER,
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [ps_pods]}}},
            }
        ]
    return {
        "apiVersion": api_version(TRAINJOB),
        "kind": TRAINJOB.kind,
        "metadata": {"name": spec.name, "labels": labels},
        "spec": body,
    }


def kueue_manager_config(namespace: str) -> dict:
    """Kueue's whole manager configuration (the chart takes it as one string, decoded strictly, and
    it replaces the chart's default): TrainJobs only, in the pipeline's namespace only, each admitted
    all at once (waitForPodsReady: Kueue v0.19 has it on by default; set here so it says how long).
    No pod or Deployment integration: Argo's step pods and the predictors are not Kueue's to hold."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "waitForPodsReady": {
            "timeout": PODS_READY_TIMEOUT,
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction"},
        },
        "managedJobsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "integrations": {"frameworks": ["trainer.kubeflow.org/trainjob"]},
    }


def resource_flavor(pool: str, node_labels: dict, tolerations: tuple[dict, ...]) -> dict:
    spec: dict = {}
    if node_labels:
        spec["nodeLabels"] = dict(node_labels)
    if tolerations:
        spec["tolerations"] = [dict(toleration) for toleration in tolerations]
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": f"{FLAVOR_PREFIX}{pool}", "labels": dict(PART_OF)},
        "spec": spec,
    }


def provisioning_check(provisioning_class: str, resources: tuple[str, ...]) -> list[dict]:
    """A ProvisioningRequestConfig of `provisioning_class` for `resources`, and the AdmissionCheck of
    Kueue's provisioning controller that names it: Kueue holds a job admitted on the flavor until the
    class has brought every node it needs, then lets all its pods start at once."""
    config = {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ProvisioningRequestConfig",
        "metadata": {"name": PROVISIONING_CHECK, "labels": dict(PART_OF)},
        "spec": {"provisioningClassName": provisioning_class, "managedResources": list(resources)},
    }
    check = {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": {"name": PROVISIONING_CHECK, "labels": dict(PART_OF)},
        "spec": {"controllerName": PROVISIONING_CONTROLLER,
                 "parameters": {"apiGroup": WORKLOAD.group, "kind": "ProvisioningRequestConfig",
                                "name": PROVISIONING_CHECK}},
    }
    return [config, check]


def cluster_queue(flavor: str, quota: dict[str, str], namespace: str, checked: bool = False) -> dict:
    """Admits the pipeline namespace's jobs (a ClusterQueue without a namespaceSelector admits none)
    within `quota` ({resource: quantity}: Kueue refuses a job that asks for a resource it does not
    cover). BestEffortFIFO: a job that does not fit does not hold back a smaller one behind it."""
    queue = {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE, "labels": dict(PART_OF)},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": list(quota),
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": resource, "nominalQuota": amount}
                                for resource, amount in quota.items()
                            ],
                        }
                    ],
                }
            ],
        },
    }
    if checked:  # the flavor's jobs wait for PROVISIONING_CHECK
        queue["spec"]["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": PROVISIONING_CHECK, "onFlavors": [flavor]}]}
    return queue


def local_queue(namespace: str) -> dict:
    """The queue the TrainJobs name (kueue.x-k8s.io/queue-name). Not `default`: Kueue would then put every
    job of the namespace in it, labelled or not."""
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": TRAINING_QUEUE, "namespace": namespace, "labels": dict(PART_OF)},
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }


def trainjob_name_limit(replicated_jobs: dict[str, int]) -> int:
    """The longest TrainJob name JobSet's webhook accepts, given each replicated job's pod
    count: Trainer v2 names the JobSet after the TrainJob, and every pod `<name>-<job>-0-<index>`
    with Kubernetes' suffix must stay a DNS label (one Job per replicated job: index 0)."""
    return min(
        DNS_LABEL_LENGTH - len(f"-{job}-0-{pods - 1}{POD_NAME_SUFFIX}")
        for job, pods in replicated_jobs.items()
    )


def event_time(event: dict) -> datetime.datetime:
    """When it last happened, from a core/v1 or an events.k8s.io event (controller-runtime's recorder
    writes the latter: eventTime, to the microsecond, or its series')."""
    return timestamp(
        (event.get("series") or {}).get("lastObservedTime")
        or event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
    )


def timestamp(text: str | None) -> datetime.datetime:
    """An RFC 3339 time of the API's, to the second or finer (compared as times, not as text: an event
    at 10:00:05.1 is not before an object created at 10:00:05); the earliest time when there is none.
    An object's creationTimestamp has whole seconds, so an event of the same second counts as after it."""
    if not text:
        return datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    return datetime.datetime.fromisoformat(text).replace(microsecond=0)


class TrainJobEngine(TrainingEngine):
    """Kubeflow Trainer v2's TrainJob on our runtime, queued by Kueue."""

    name = "trainjob"
    job_resource = TRAINJOB
    succeeded = "Complete"
    pod_label = JOBSET_NAME_LABEL
    extra_step_calls = (
        (WORKLOAD.group, WORKLOAD.plural, "list"),  # why Kueue holds it
        ("", "events", "list"),  # the controllers' refusals
    )
    stack_keys = {"platform": ("trainer_version", "kueue_version"), "cluster": ("training_quota",)}
    queued = True

    def job(self, spec: TrainingSpec, target: ClusterTarget) -> dict:
        return trainjob(spec, target)

    def runtimes(self, specs: list[TrainingSpec], target: ClusterTarget) -> list[dict]:
        """One runtime per parameter-server count the jobs use (synchronous, and `-ps`)."""
        by_servers = {spec.parameter_servers: spec for spec in specs}
        return [training_runtime(by_servers[servers], target) for servers in sorted(by_servers)]

    def queue_objects(self, placement: QueuePlacement, namespace: str) -> list[dict]:
        """A ResourceFlavor for the training pool, a ClusterQueue whose quota is what the pool holds, and
        the LocalQueue the TrainJobs name: every variant's TrainJob is submitted at once, and Kueue
        admits one when the quota holds all of its pods, so that no job starts with part of its
        workers. At admission Kueue writes the flavor's node labels and tolerations into the pods (its
        runtime patch), so they land on the training pool; its tolerations replace the runtime's
        (kueue v0.19.2 patches them in whole), so they are the pool's own."""
        flavor = resource_flavor(placement.pool, placement.node_labels, placement.tolerations)
        checks = (provisioning_check(placement.provisioning_class, placement.provisioned_resources)
                  if placement.provisioning_class else [])
        return [
            flavor,
            *checks,
            cluster_queue(flavor["metadata"]["name"], placement.quota, namespace, checked=bool(checks)),
            local_queue(namespace),
        ]

    def installs(self, versions: dict[str, str], namespace: str) -> list[Install]:
        kueue = versions["kueue_version"]
        return [
            # Trainer's and JobSet's webhooks both listen on 9443 (their managers' webhook servers).
            KustomizeInstall("trainer", TRAINER_REPOSITORY, versions["trainer_version"], TRAINER_OVERLAY,
                             control_plane_ports=(9443,)),
            ChartInstall(
                "kueue",
                KUEUE_CHART,
                KUEUE_CHARTS,
                kueue.removeprefix("v"),
                KUEUE_NAMESPACE,
                {
                    "controllerManager": {"manager": {"image": {
                        "repository": KUEUE_IMAGE, "tag": kueue, "pullPolicy": "IfNotPresent"}}},
                    "managerConfig": {
                        "controllerManagerConfigYaml": yaml.safe_dump(
                            kueue_manager_config(namespace), sort_keys=False
                        )
                    },
                },
                control_plane_ports=(8082, 9443),  # its visibility API (aggregated), its webhooks
            ),
        ]

    def metrics(self) -> MetricsSource:
        return MetricsSource(
            "kueue", KUEUE_NAMESPACE, KUEUE_METRICS_SERVICE_LABELS, dict(KUEUE_METRICS_ENDPOINT)
        )

    def dashboard(self, namespace: str) -> tuple[str, dict[str, str]]:
        """TrainJobs waiting in and admitted by Kueue's queue."""
        queue = f'cluster_queue="{CLUSTER_QUEUE}"'
        return "Training queue", {
            "pending": f"sum(kueue_pending_workloads{{{queue}}})",
            "admitted": f"sum(kueue_admitted_active_workloads{{{queue}}})",
        }

    def longest_name(self, workers: int, parameter_servers: int) -> int:
        """JobSet's webhook refuses pod names past 63 characters, and Trainer then only records an event
        on the TrainJob, so names are checked first (at config time, and by the step)."""
        return trainjob_name_limit(tf_cluster.jobset_replicas(workers, parameter_servers))

    def name_limit(self, job: dict) -> int:
        """The node job's pod names are the longest (the ps job's are shorter for any count below 1000
        servers)."""
        return trainjob_name_limit({tf_cluster.NODE_JOB: job["spec"]["trainer"]["numNodes"]})

    def progress(self, job: dict, pods: list[dict]) -> str:
        """Each replicated job's Jobs (`node: 1 active`), and JobSet's restarts so far, read off its pods."""
        counts = []
        for status in (job.get("status") or {}).get("jobsStatus") or []:
            shown = [
                f"{status[key]} {key}"
                for key in ("active", "ready", "succeeded", "failed", "suspended")
                if status.get(key)
            ]
            counts.append(f"{status.get('name')}: {', '.join(shown) or 'no job yet'}")
        restarts = max(
            (int(pod["metadata"].get("labels", {}).get(RESTART_ATTEMPT_LABEL, 0)) for pod in pods), default=0
        )
        shown = "; ".join(counts) or "no job started yet"
        return f"{shown} (restarted {restarts} time(s) after a lost pod)" if restarts else shown

    def waiting(self, api: JobApi, namespace: str, job: dict) -> str | None:
        """Why Kueue holds the TrainJob (suspended until its queue admits it), None when it does not.
        Raises TrainingFailed when Kueue gave up on it (its Workload deactivated), or never will admit
        it (inadmissible, or more than the queue could ever hold)."""
        if not (job.get("spec") or {}).get("suspend"):
            return None
        uid = job["metadata"].get("uid")
        workloads = api.list_objects(WORKLOAD, namespace, f"{WORKLOAD_JOB_UID_LABEL}={uid}") if uid else []
        if not workloads:
            return "suspended, waiting for Kueue to admit it (no Workload yet)"
        workload = workloads[0]
        if (workload.get("spec") or {}).get("active") is False:
            evicted = condition(workload, "Evicted") or {}
            raise TrainingNeverSucceeds(
                f"Kueue deactivated Workload {workload['metadata']['name']}: "
                f"{described(evicted) or 'spec.active is false'}"
            )
        if reserved := condition(workload, "QuotaReserved", status="False"):
            message = reserved.get("message", "")
            if reserved.get("reason") == INADMISSIBLE or any(never in message for never in NEVER_ADMITTED):
                raise TrainingNeverSucceeds(
                    f"Kueue will never admit Workload {workload['metadata']['name']} in "
                    f"{workload['spec'].get('queueName')}: {described(reserved)}"
                )
            return f"queued by Kueue in {workload['spec'].get('queueName')}: {described(reserved)}"
        if pending := [check for check in (workload.get("status") or {}).get("admissionChecks") or []
                       if check.get("state") != CHECK_READY]:
            return (f"quota reserved by Kueue in {workload['spec'].get('queueName')}, waiting for its "
                    "admission check " + "; ".join(f"{check['name']}: {check.get('state')}"
                                         + (f": {check['message']}" if check.get("message") else "")
                                         for check in pending))
        return f"suspended, Kueue's Workload {workload['metadata']['name']} admitting it"

    def refusal(self, api: JobApi, namespace: str, job: dict) -> str | None:
        """The first controller's warning that an object of this TrainJob (the TrainJob, its JobSet, the
        JobSet's Jobs, all named after it) was refused, as `<reason> on <kind> <name>: <message>`."""
        name, uid = job["metadata"]["name"], job["metadata"].get("uid")
        since = timestamp(job["metadata"].get("creationTimestamp"))
        for event in api.list_warnings(namespace):
            involved, reason = event.get("involvedObject") or {}, event.get("reason")
            if NOT_CREATED.get(reason) != involved.get("kind") or not REFUSED.search(
                event.get("message") or ""
            ):
                continue
            ours = (
                involved.get("uid") == uid
                if involved.get("kind") == "TrainJob"
                else involved.get("name") == name or involved.get("name", "").startswith(f"{name}-")
            )
            if ours and event_time(event) >= since:
                message = (event.get("message") or "").strip()
                return f"{reason} on {involved['kind']} {involved.get('name')}: {message}"
        return None
