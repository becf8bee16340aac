"""What differs between the clusters a stack can run on, behind one small interface.

A cluster kind declares six things: the cluster and a Kubernetes provider bound to it, where the
images come from, the storage every pipeline pod mounts, the identity through which pods use that
storage (annotations on their service accounts), the Gateway API implementation users reach the
model through, and the tracking server's backend (its database and identity). Everything else — the
platform, the pipeline, serving, tracking, monitoring — is composed once, the same way for every kind
(stacks/compose.py).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import pulumi
import pulumi_kubernetes as k8s

from common.cluster_target import ClusterStorage, Images
from infra.gateway import GatewayPlacement
from infra.storage import PvcStorage, PvcStorageArgs
from infra.tracking import TrackingBackend
from stacks.settings import StackConfig, StackSettings


@dataclasses.dataclass(frozen=True)
class Cluster:
    provider: k8s.Provider  # every Kubernetes object goes through it
    kubeconfig: pulumi.Output[str] | None  # a secret; None for a cluster the user's own kubeconfig reaches


@dataclasses.dataclass(frozen=True)
class ImageSource:
    images: pulumi.Input[Images]  # what pods run (an Output where digests are known only after a push)
    ready: list[pulumi.Resource] = dataclasses.field(default_factory=list)  # pods wait for these


@dataclasses.dataclass(frozen=True)
class Storage:
    storage: ClusterStorage  # the volume every pipeline pod mounts, and its URI for KServe
    ready: list[pulumi.Resource]  # pods that mount it wait for these
    # What lets a pod's service account use the storage (e.g. a Workload Identity binding).
    account_annotations: dict[str, pulumi.Input[str]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TrainingPlacement:
    """Where training pods run: a node pool's name, labels and taints, its GPUs per pod, and what it
    holds for training ({resource: quantity}, Kueue's quota)."""
    pool: str
    quota: dict[str, str]
    tolerations: tuple[dict, ...] = ()
    node_selector: dict = dataclasses.field(default_factory=dict)
    gpus: int = 0
    provisioning_class: str | None = None  # nodes through ProvisioningRequests of this class (GPUs)


@dataclasses.dataclass(frozen=True)
class TrackingPlacement:
    """Where the tracking server keeps its runs and artifacts on this cluster, what must exist first,
    and what lets its pods act as the identity that backend needs."""
    backend: TrackingBackend
    ready: list[pulumi.Resource] = dataclasses.field(default_factory=list)
    account_annotations: dict[str, pulumi.Input[str]] = dataclasses.field(default_factory=dict)


class ClusterKind(abc.ABC):
    """One kind of cluster (k3d, GKE, ...), made from the parsed stack config."""

    # The stack config of this kind: the shared sections (StackSettings) plus its cluster and
    # storage sections; `cluster.kind` in a stack file picks it.
    settings: ClassVar[type[StackSettings]]

    def __init__(self, config: StackConfig):
        self.config = config

    @abc.abstractmethod
    def cluster(self) -> Cluster:
        """Declares the cluster and its provider."""

    @abc.abstractmethod
    def images(self, cluster: Cluster) -> ImageSource:
        """Declares how the trainer and serving images reach the cluster's nodes."""

    @abc.abstractmethod
    def storage(self, cluster: Cluster, namespace: k8s.core.v1.Namespace, users: tuple[str, ...]) -> Storage:
        """Declares the storage, usable by pods running as the service accounts `users`."""

    @abc.abstractmethod
    def gateway(self, cluster: Cluster) -> GatewayPlacement:
        """The GatewayClass and listener port of the model's Gateway on this cluster, what must exist
        before it, and how a user reaches it."""

    @abc.abstractmethod
    def training_placement(self) -> TrainingPlacement:
        """Where training pods run, and what that pool holds for them."""

    @abc.abstractmethod
    def tracking(self, cluster: Cluster, service_account: str) -> TrackingPlacement:
        """Declares the tracking server's backend, for pods running as `service_account`."""

    def outputs(self, images: ImageSource) -> dict[str, pulumi.Input]:
        """Stack outputs of this kind beyond the ones every stack has."""
        return {}


def volume_storage(config: StackConfig, provider: k8s.Provider, namespace: k8s.core.v1.Namespace) -> Storage:
    """The stack's claim on a cluster's own StorageClass (k3d's, a cluster the user has), deleted with the
    system's namespace. Any pod in the namespace may mount it: no identity to bind."""
    section = config.storage
    storage = PvcStorage("storage", PvcStorageArgs(
        namespace=config.namespace, size=section.size, access_mode=section.access_mode,
        storage_class=section.storage_class, provider=provider, depends_on=[namespace],
        deleted_with=namespace))
    return Storage(storage=storage.storage, ready=[storage])

