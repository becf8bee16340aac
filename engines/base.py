"""What a training engine is: the one interface behind which Kubeflow Trainer v2 (TrainJob) and the
training operator (TFJob) differ, so that the stacks, the Argo renderer and the train step ask it,
never test its name (docs/extending/engine.md).

An engine declares, as data and plain functions over dicts (no Pulumi, no TensorFlow: the train step
runs in the serving image): the job a training step creates and the objects it needs beside it (its
runtimes, its queue); the platform pieces it installs and which stack keys set them; where its
controllers expose metrics; the API calls its step makes; and how the step reads its job (done,
waiting, refused, its progress).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Protocol

from common.cli import NeverSucceeds
from common.cluster_names import DNS_LABEL_LENGTH, CustomResource
from common.cluster_target import ClusterTarget
from common.installs import ChartInstall, Install, KustomizeInstall  # noqa: F401 - engines name them here

ApiCall = tuple[str, str, str]  # (API group, resource, verb): what a step's service account needs


@dataclasses.dataclass(frozen=True)
class TrainingSpec:
    """One variant's training, as the engines need it: a train step's, or a runtime's."""

    name: str  # the job's
    step: str  # the step's, for messages
    command: tuple[str, ...]
    workers: int
    parameter_servers: int
    resources: dict  # one worker's requests and limits
    retries: int  # restarts of the whole job after a lost pod
    labels: dict
    env: dict = dataclasses.field(default_factory=dict)  # the training command's, beside the engine's own


def env_list(env: dict) -> list[dict]:
    """A container's `env` of a mapping."""
    return [{"name": name, "value": value} for name, value in env.items()]




@dataclasses.dataclass(frozen=True)
class MetricsSource:
    """Where the engine's controller serves Prometheus metrics: a Service's port, and how to scrape it."""

    name: str
    namespace: str
    service_labels: dict
    endpoint: dict  # a ServiceMonitor endpoint: port, path, and scheme and TLS if any


@dataclasses.dataclass(frozen=True)
class QueuePlacement:
    """The training pool an engine's queue admits jobs to: its labels, taints and what it holds."""

    pool: str
    node_labels: dict
    tolerations: tuple[dict, ...]
    quota: dict[str, str]  # resource -> quantity
    # A ProvisioningRequest class that brings the pool's nodes for each admitted job, all at once (GKE's
    # queued provisioning), and the resources it provisions; None: the nodes are there, or the
    # cluster autoscaler adds them pod by pod.
    provisioning_class: str | None = None
    provisioned_resources: tuple[str, ...] = ()


class JobApi(Protocol):
    """The API calls a train step makes (plain dicts, as the API server sends them)."""

    def get_job(self, resource: CustomResource, namespace: str, name: str) -> dict | None: ...
    def create_job(self, resource: CustomResource, namespace: str, manifest: dict) -> None: ...
    def delete_job(self, resource: CustomResource, namespace: str, name: str) -> None: ...
    def list_pods(self, namespace: str, label_selector: str) -> list[dict]: ...
    def list_objects(self, resource: CustomResource, namespace: str, label_selector: str) -> list[dict]: ...
    def list_warnings(self, namespace: str) -> list[dict]: ...


class TrainingFailed(RuntimeError):
    """The job failed, or cannot finish by itself; the message says why, in one line."""


class TrainingNeverSucceeds(TrainingFailed, NeverSucceeds):
    """The job will never run to its end, in the cluster's words (refused, never admitted, its pods
    unable to start): retrying the step cannot help."""


def condition(job: dict, kind: str, status: str = "True") -> dict | None:
    """The object's condition of type `kind` when its status is `status`."""
    for found in (job.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind and found.get("status") == status:
            return found
    return None


def described(found: dict) -> str:
    return f"{found.get('reason', '')}: {found.get('message', '')}".strip(": ")


class TrainingEngine(abc.ABC):
    """One way of training a variant on a cluster; `pipeline.engine` names it (engines/__init__.py)."""

    @property
    def step_calls(self) -> tuple[ApiCall, ...]:
        """Every call the train step makes for this engine (the workflow's Role grants exactly these)."""
        job = self.job_resource
        own_job = tuple((job.group, job.plural, verb) for verb in ("get", "create", "delete"))
        return (*own_job, ("", "pods", "list"), *self.extra_step_calls)

    name: ClassVar[str]  # pipeline.engine's value
    job_resource: ClassVar[CustomResource]  # what a train step creates
    succeeded: ClassVar[str]  # the job's condition that ends it well
    pod_label: ClassVar[str]  # the label that names the job on its pods
    # The calls the train step makes for this engine beyond the ones it makes for every engine (its
    # job's get, create and delete, its pods' list): step_calls is all of them.
    extra_step_calls: ClassVar[tuple[ApiCall, ...]] = ()
    # The stack keys (section -> field names of stacks/settings.py's models) that set this engine's
    # pieces: set on a stack of another engine, they would do nothing, so they are errors there.
    stack_keys: ClassVar[dict[str, tuple[str, ...]]]
    # Whether a queue (queue_objects) admits its jobs whole, within cluster.trainingQuota: a job the
    # quota could never hold is then a config error.
    queued: ClassVar[bool] = False

    @abc.abstractmethod
    def job(self, spec: TrainingSpec, target: ClusterTarget) -> dict:
        """The job a train step creates for `spec`."""

    def runtimes(self, specs: list[TrainingSpec], target: ClusterTarget) -> list[dict]:
        """Cluster-scoped objects the jobs of `specs` name, which the stacks declare (none by default)."""
        return []

    def queue_objects(self, placement: QueuePlacement, namespace: str) -> list[dict]:
        """The queue that admits the jobs of `namespace` to `placement`, in creation order (none by
        default: the engine starts a job's pods at once)."""
        return []

    @abc.abstractmethod
    def installs(self, versions: dict[str, str], namespace: str) -> list[Install]:
        """What the platform installs for it; `versions` holds its stack_keys' platform values, and
        `namespace` is the pipeline's."""

    @abc.abstractmethod
    def metrics(self) -> MetricsSource:
        """Where its controller's metrics are scraped."""

    @abc.abstractmethod
    def dashboard(self, namespace: str) -> tuple[str, dict[str, str]]:
        """The dashboard's training panel: its title, and each series' legend and PromQL."""

    def longest_name(self, workers: int, parameter_servers: int) -> int:
        """The longest name its controllers accept for a job of `workers` and `parameter_servers`."""
        return DNS_LABEL_LENGTH

    def name_limit(self, job: dict) -> int:
        """The longest name its controllers accept for the job `job` (its manifest)."""
        return DNS_LABEL_LENGTH

    @abc.abstractmethod
    def progress(self, job: dict, pods: list[dict]) -> str:
        """What the job's status shows of its progress, in a few words."""

    def waiting(self, api: JobApi, namespace: str, job: dict) -> str | None:
        """Why the job waits to start (None when it does not); TrainingFailed when it never will."""
        return None

    def refusal(self, api: JobApi, namespace: str, job: dict) -> str | None:
        """A controller's words saying it cannot create the job's objects, or None."""
        return None
