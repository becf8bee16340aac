"""A cluster the user already has (kind, minikube, Docker Desktop, a cluster on premises), reached by a
kubeconfig and one of its contexts: the stack creates no cluster and installs into this one the same
platform, storage, pipeline, serving and tracking as on k3d and GKE. Its stack config is ExistingStack:
the `cluster` section (ExistingConfig), the `storage` section (ExistingStorage: a PVC of the cluster's
storage class) and the `images` section (ExistingImages: the images' references, or a registry the
stack pushes them to).

Every wait is the Kubernetes provider's own (its readiness awaits, `pulumi.com/waitFor`), so this kind
needs no command provider, and `pulumi up` no kubectl; nor Docker, unless the stack builds the images.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import pulumi
import pulumi_kubernetes as k8s
from pydantic import Field, model_validator

from common.cluster_target import KUBERNETES_MINOR, Images
from infra.gateway import GatewayPlacement
from infra.images import BASE_IMAGES, PushedImages, PushedImagesArgs
from infra.tracking import VolumeBackend
from pipeline.validation import Quantity, Section, Text, fail, matching
from stacks.kinds.base import (
    Cluster,
    ClusterKind,
    ImageSource,
    Storage,
    TrackingPlacement,
    TrainingPlacement,
    volume_storage,
)
from stacks.kinds.k3d import ACCESS_MODES, AccessMode, Port
from stacks.settings import ImageReference, ImagesConfig, Registry, StackSettings, TrainingQuota

KIND = "existing"
KubernetesMinor = matching(r"^1\.[0-9]+$", "a Kubernetes minor like 1.35")
# Asked for node pools, this kind says why not rather than only that the keys are another kind's.
NO_NODE_POOLS = (f"does not apply to cluster.kind {KIND}: the cluster's nodes are its own; training pods "
                 "run on any node with room (cluster.trainingQuota bounds them) on the CPU trainer image")
REFERENCES = ("trainer", "serving", "trackingServer")


# --- The stack config -------------------------------------------------------------------------------

class ExistingConfig(Section):
    """The `cluster` section of a cluster the user already has."""
    NOT_HERE: ClassVar[dict[str, str]] = {"nodePools": NO_NODE_POOLS, "trainingPool": NO_NODE_POOLS}
    kind: Literal["existing"] = Field(description="the stack's cluster")
    # Required: `pulumi up` never installs into whatever cluster the current context happens to be.
    context: Text = Field(description="the kubeconfig context of the cluster (required)")
    kubeconfig: Text | None = Field(
        None, description="the kubeconfig file; default: $KUBECONFIG, else ~/.kube/config, as kubectl "
                          "reads it")
    kubernetes_version: KubernetesMinor = Field(
        KUBERNETES_MINOR, alias="kubernetesVersion",
        description="the cluster's Kubernetes minor: the Pod Security version the system's namespace "
                    "enforces")
    gateway_class: Text = Field(
        alias="gatewayClass", description="the GatewayClass of the cluster's Gateway API implementation "
                                          "(istio, eg, cilium, traefik, ...), which also serves its CRDs "
                                          "(required)")
    gateway_port: Port = Field(80, alias="gatewayPort", description="the port the model's Gateway listens on")
    training_quota: TrainingQuota = Field(
        TrainingQuota(cpu="2", memory="4Gi"),
        description="what the cluster holds for training, Kueue's quota (pipeline.engine trainjob)")


class ExistingStorage(Section):
    """The `storage` section of an existing cluster: a PVC of its storage class."""
    size: Quantity = Field("10Gi", description="the PVC holding data, checkpoints, exports and models")
    access_mode: AccessMode = Field(
        "ReadWriteOnce", description=f"{' or '.join(ACCESS_MODES)}; ReadWriteMany when pods of several nodes "
                                     "share it")
    storage_class: Text | None = Field(None, description="storage class; default: the cluster's default")


class ExistingImages(ImagesConfig):
    """The `images` section of an existing cluster: the images you built and pushed, or the registry
    the stack builds them (Docker with BuildKit, on the machine that runs `pulumi up`) and pushes to."""
    NOT_HERE: ClassVar[dict[str, str]] = {}
    registry: Registry | None = Field(
        None, description="the stack builds the images and pushes them here (e.g. "
                          "registry.example:5000/team), with the credentials `docker login` stored")
    trainer: ImageReference | None = Field(None, description="the trainer image you pushed (with serving and "
                                                             "trackingServer, instead of registry)")
    serving: ImageReference | None = Field(None, description="the serving image you pushed")
    tracking_server: ImageReference | None = Field(None, description="the tracking server image you pushed")

    @model_validator(mode="after")
    def _pushed_or_built(self) -> ExistingImages:
        given = [key for key, value in zip(REFERENCES, (self.trainer, self.serving, self.tracking_server))
                 if value is not None]
        if self.registry is None and len(given) < len(REFERENCES):
            missing = [key for key in REFERENCES if key not in given]
            raise fail(f"needs the images you pushed ({', '.join(REFERENCES)}; missing "
                       f"{', '.join(missing)}), or images.registry for the stack to build and push them",
                       missing[0])
        if self.registry is not None and given:
            raise fail("names an image you pushed, and images.registry has the stack build them: choose one",
                       given[0])
        if self.registry is None and self.base_image is not None:
            raise fail("applies only when the stack builds the images (images.registry)", "baseImage")
        return self

    def references(self) -> Images | None:
        """The images as given, or None when the stack builds them."""
        if self.registry is not None:
            return None
        return Images(trainer=self.trainer, serving=self.serving, tracking_server=self.tracking_server)


class ExistingStack(StackSettings):
    """A stack on a cluster the user already has."""
    cluster: ExistingConfig = Field(description="the cluster: kubeconfig, context, Gateway class")
    storage: ExistingStorage = Field(ExistingStorage(), description="the PVC every pipeline pod mounts")
    images: ExistingImages = Field(description="the images you pushed, or the registry the stack pushes to")

    def training_quota(self) -> tuple[dict[str, str], int]:
        return self.cluster.training_quota.as_quota(), 0


# --- The kind ---------------------------------------------------------------------------------------

class ExistingKind(ClusterKind):
    settings = ExistingStack

    def cluster(self) -> Cluster:
        config = self.config.cluster
        provider = k8s.Provider("cluster-provider", kubeconfig=config.kubeconfig, context=config.context)
        return Cluster(provider=provider, kubeconfig=None)

    def images(self, cluster: Cluster) -> ImageSource:
        images = self.config.images
        given = images.references()
        if given is not None:
            return ImageSource(images=given)
        pushed = PushedImages("images", PushedImagesArgs(
            registry=images.registry, base_image=images.base_image, images=BASE_IMAGES))
        return ImageSource(images=pushed.images)

    def storage(self, cluster: Cluster, namespace: k8s.core.v1.Namespace, users: tuple[str, ...]) -> Storage:
        return volume_storage(self.config, cluster.provider, namespace)

    def tracking(self, cluster: Cluster, service_account: str) -> TrackingPlacement:
        return TrackingPlacement(VolumeBackend(storage_class=self.config.storage.storage_class))

    def training_placement(self) -> TrainingPlacement:
        return TrainingPlacement(pool=KIND, quota=self.config.cluster.training_quota.as_quota())

    def gateway(self, cluster: Cluster) -> GatewayPlacement:
        config = self.config.cluster
        address = (f"kubectl --context {config.context} -n {self.config.namespace} get gateway "
                   "-o jsonpath='{.items[0].status.addresses[0].value}'")
        return GatewayPlacement(config.gateway_class, config.gateway_port, url="http://<inferenceAddress>",
                                address_hint=address, crds_served=True)

    def outputs(self, images: ImageSource) -> dict[str, pulumi.Input]:
        return {"kubeContext": self.config.cluster.context,
                "images": pulumi.Output.from_input(images.images).apply(lambda built: {
                    "trainer": built.trainer, "serving": built.serving,
                    "trackingServer": built.tracking_server})}
