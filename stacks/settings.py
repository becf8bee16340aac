"""What every stack's config has, whatever its cluster kind: the shared sections, StackSettings (which
each kind's stack model extends with its `cluster` and `storage` sections, in its module under
stacks/kinds/), and StackConfig, what the program reads once the config is parsed (stacks/config.py).

The `pipeline` and `serving` sections are the pipeline's own (pipeline/config.py), so a value means
what it means to `python -m pipeline run`, and what must hold across the two is checked by the same
model (PipelineSections).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping

from pydantic import Field, model_validator

from common.cluster_target import DEFAULT_ARGO_VERSION, GPU_RESOURCE
from common.installs import ArtifactSources
from common.tracking_names import tracking_uri_problem
from engines import ENGINES
from pipeline.argo import SUPPORTED_ARGO_VERSION
from pipeline.config import (
    Autoscaling,
    PipelineConfig,
    PipelineSections,
    PipelineSettings,
    ScalingMetric,
    ServingConfig,
)
from pipeline.validation import DnsLabel, Flag, Quantity, Section, Text, fail, matching, quantity_value
from trainer.cluster import NODE_JOB, jobset_replicas

PROJECT = "dist-ml"

ReleaseTag = matching(r"^v[0-9]+\.[0-9]+\.[0-9]+$", "a release tag like v1.2.3")
ArgoRelease = matching(SUPPORTED_ARGO_VERSION.pattern, "an Argo Workflows release v3.x.y or v4.x.y")
ChartVersion = matching(r"^[0-9]+\.[0-9]+\.[0-9]+$", "a chart version like 80.4.1")
ImageReference = matching(r"^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?(@sha256:[0-9a-f]{64})?$",
                          "an image reference like mirror.example/library/python:3.11-slim")
Registry = matching(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9._-]+)*$",
                    "a registry and optional path like registry.example:5000/mirror")
OciRepository = matching(r"^oci://[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9._-]+)*$",
                         "an OCI repository like oci://registry.example/charts")
HttpUrl = matching(r"^https?://[^\s/]+(/\S*)?$", "an http(s) URL like http://prometheus.monitoring.svc:9090")


# --- Sections every stack has -----------------------------------------------------------------------

class ControllerRequests(Section):
    """`platform.controllerRequests`: each controller container's requests."""
    cpu: Quantity | None = Field(None, description="CPU each asks for")
    memory: Quantity | None = Field(None, description="memory each asks for")

    def as_requests(self) -> dict[str, str]:
        return {name: value for name, value in (("cpu", self.cpu), ("memory", self.memory)) if value}


class PlatformConfig(Section):
    """The `platform` section: what runs the pipeline and serving on the cluster."""
    trainer_version: ReleaseTag = Field(
        "v2.3.0", description="Kubeflow Trainer v2 (TrainJob; brings JobSet), with pipeline.engine trainjob")
    kueue_version: ReleaseTag = Field("v0.19.2", description="Kueue, with pipeline.engine trainjob")
    training_operator_version: ReleaseTag = Field(
        "v1.9.4", description="Kubeflow training operator v1 (TFJob), with pipeline.engine tfjob")
    argo_version: ArgoRelease = Field(DEFAULT_ARGO_VERSION, description="Argo Workflows release")
    cert_manager_version: ReleaseTag = Field(
        "v1.21.2", description="cert-manager (tested on Kubernetes 1.33 - 1.36)")
    kserve_version: ReleaseTag = Field("v0.20.0", description="KServe charts (Standard mode)")
    keda_version: ChartVersion = Field(
        "2.21.0", description="KEDA (its release YAML's kustomization; tested on Kubernetes 1.34 - 1.36), "
                              "installed when serving.autoscaling.metric is inflight or rps")
    install_cert_manager: Flag = Field(
        True, description="false: the cluster runs cert-manager already (its CRDs and webhook), as many "
                          "clusters do; the stack installs none")
    artifact_directory: Text | None = Field(
        None, description="air-gapped: every chart and kustomization the platform installs, from this "
                          "directory instead of upstream (docs/guides/air-gapped.md; relative to the "
                          "project)")
    chart_mirror: OciRepository | None = Field(
        None, description="air-gapped: every chart from this OCI repository (helm push of each chart at its "
                          "version) instead of upstream; kustomizations from artifactDirectory or upstream")
    controller_requests: ControllerRequests | None = Field(
        None, description="what each container of the platform's controllers asks for (their limits kept), "
                          "for a small cluster: upstream's ask for about 1.5 CPUs in all (Kueue's and "
                          "JobSet's 500m each); default: upstream's")
    image_mirror: Registry | None = Field(
        None, description="air-gapped: every image the platform's manifests name, from this registry under "
                          "the same path (registry.k8s.io/kueue/kueue:v0.19.2 -> "
                          "<mirror>/kueue/kueue:v0.19.2)")

    def sources(self, root: Path) -> ArtifactSources:
        """Where the platform's artifacts come from; a relative artifactDirectory is the project's."""
        directory = self.artifact_directory and str((root / self.artifact_directory).resolve())
        return ArtifactSources(directory=directory, chart_mirror=self.chart_mirror,
                               image_mirror=self.image_mirror)


EXISTING_ONLY = "applies only to cluster.kind existing, whose images you may push yourself"


class ImagesConfig(Section):
    """The `images` section: how the stack builds the project's images."""
    NOT_HERE: ClassVar[dict[str, str]] = {key: EXISTING_ONLY for key in (
        "registry", "trainer", "serving", "trackingServer")}
    base_image: ImageReference | None = Field(
        None, description="the images' base, for a builder without Docker Hub: a mirror's copy of "
                          "python:3.11-slim (default: python:3.11-slim, the Dockerfiles' BASE_IMAGE)")


class MonitoringConfig(Section):
    """The `monitoring` section: kube-prometheus-stack, the monitors and the dist-ml dashboard."""
    enabled: Flag = Field(False, description="install monitoring (default: false on k3d, true on gke)")
    kube_prometheus_stack_version: ChartVersion = Field("80.4.1", description="kube-prometheus-stack chart")
    prometheus_url: HttpUrl | None = Field(
        None, description="the cluster's own Prometheus, run by its Prometheus Operator (whose PodMonitor "
                          "and ServiceMonitor the stack declares): no kube-prometheus-stack is installed, "
                          "and KEDA reads the load here")

    @model_validator(mode="after")
    def _own_prometheus_is_monitoring(self) -> MonitoringConfig:
        if self.prometheus_url is not None and not self.enabled:
            raise fail("names the Prometheus the stack's monitors and KEDA use, and monitoring.enabled is "
                       "false: set it true, or remove prometheusUrl", "prometheusUrl")
        return self


class TrainingQuota(Section):
    """What the training pool holds for training: Kueue's ClusterQueue admits TrainJobs up to it."""
    cpu: Quantity = Field(description="CPU, summed over the pods' requests")
    memory: Quantity = Field(description="memory, summed over the pods' requests")

    def as_quota(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory}


LOCAL_ENGINE_ONLY = "applies only to the local engine (`python -m pipeline run`), not to a cluster stack"


class StackPipeline(PipelineSettings):
    """The `pipeline` section on a stack."""
    NOT_HERE: ClassVar[dict[str, str]] = {"storageRoot": LOCAL_ENGINE_ONLY}
    run_on_up: Flag = Field(False, description="also submit one Workflow run on `pulumi up`")

    @model_validator(mode="after")
    def _a_tracking_server_pods_reach(self) -> StackPipeline:
        """Pods reach a server, not a database or a directory on someone's machine."""
        uri = self.tracking.uri
        if uri is not None and (problem := tracking_uri_problem(uri, server_only=True)) is not None:
            raise fail(f"must be the tracking server the cluster's pods call: {problem}", "tracking.uri")
        return self


class StackAutoscaling(Autoscaling):
    """`serving.autoscaling` on a stack without monitoring by default (k3d): CPU, as no Prometheus is
    there to read the load from."""
    metric: ScalingMetric = Field(
        "cpu", description="inflight or rps (through KEDA on the stack's Prometheus: needs monitoring), "
                           "or cpu or memory (KServe's HPA); default: cpu on k3d, inflight on gke")


class StackServing(ServingConfig):
    """The `serving` section on a stack."""
    NOT_HERE: ClassVar[dict[str, str]] = {**ServingConfig.NOT_HERE, "httpPort": LOCAL_ENGINE_ONLY}
    autoscaling: StackAutoscaling = Field(
        StackAutoscaling(), description="what the replicas follow: {metric, target, scaleDownStabilization, "
                                        "latencyObjectiveMs}")


# --- The base of every kind's stack model -----------------------------------------------------------

class StackSettings(PipelineSections):
    """The settings every stack has; a subclass per cluster kind adds its cluster and storage."""
    PROVIDER: ClassVar[str] = ""  # the cloud provider's config namespace, whose other keys are its own
    namespace: DnsLabel = Field(
        "dist-ml", description="where the pipeline, its storage and the model server live")
    platform: PlatformConfig = Field(PlatformConfig(), description="the platform's versions")
    images: ImagesConfig = Field(ImagesConfig(), description="how the project's images are built")
    monitoring: MonitoringConfig = Field(
        MonitoringConfig(), description="Prometheus, Grafana and the dashboard")
    pipeline: StackPipeline = Field(
        StackPipeline(), description="as in the pipeline's config file, + runOnUp")
    serving: StackServing = Field(StackServing(), description="as in the pipeline's config file")

    @model_validator(mode="before")
    @classmethod
    def _providers_own_keys(cls, raw: Any) -> Any:
        """The provider reads its other keys (gcp:zone, ...) itself; they are not ours to check."""
        if not isinstance(raw, Mapping) or not cls.PROVIDER:
            return raw
        ours = {field.alias for field in cls.model_fields.values()}
        return {key: value for key, value in raw.items()
                if key in ours or not str(key).startswith(f"{cls.PROVIDER}:")}

    # Keys that set up one engine's pieces (each engine's stack_keys): set for another engine, they
    # would do nothing, so they are errors there, and dumps leave them out.
    def _other_engines_keys(self) -> Iterator[tuple[str, str, str, str]]:
        """(engine, section, field name, key) of each key of another engine than this stack's."""
        for name, engine in ENGINES.items():
            for section, fields in engine.stack_keys.items():
                model = type(getattr(self, section))
                for field in fields:
                    if name != self.pipeline.engine and field in model.model_fields:
                        yield name, section, field, model.model_fields[field].alias or field

    @model_validator(mode="after")
    def _keys_of_the_engine(self) -> StackSettings:
        for owner, section, field, key in self._other_engines_keys():
            if field in getattr(self, section).model_fields_set:
                raise fail(f"applies only to pipeline.engine {owner}, and this stack's is "
                           f"{self.pipeline.engine}; remove it or change the engine", f"{section}.{key}")
        return self

    def training_quota(self) -> tuple[dict[str, str], int] | None:
        """Kueue's quota for training, and the GPUs each node pod asks for; None for a kind whose
        quota is not this model's to know."""
        return None

    @model_validator(mode="after")
    def _every_trainjob_fits_the_quota(self) -> StackSettings:
        """A queued engine's queue (Kueue, for TrainJobs) admits a job only when the quota holds all of
        its pods at once: one that asks for more would wait in the queue until the train step's timeout."""
        engine = ENGINES[self.pipeline.engine]
        found = self.training_quota() if engine.queued else None
        if found is None:
            return self
        quota, gpus = found
        requests = self.pipeline.trainer_resources.requests
        for variant in self.pipeline.variants:
            replicas = jobset_replicas(self.pipeline.workers, self.pipeline.parameter_servers_of(variant))
            pods = sum(replicas.values())
            asks = {name: quantity_value(requests[name]) * pods for name in ("cpu", "memory")}
            if gpus:
                asks[GPU_RESOURCE] = gpus * replicas[NODE_JOB]
            kind = engine.job_resource.kind
            for name, amount in asks.items():
                if amount > quantity_value(quota[name]):
                    raise fail(f"{variant}'s {kind} asks for {shown_amount(name, amount)} "
                               f"at once, more than cluster.trainingQuota holds ({quota[name]}): its queue "
                               "would never admit it; train on fewer workers, ask for less "
                               "(pipeline.trainerResources) or give the pool more", "pipeline.workers")
        return self

    def _shown(self, data: dict) -> dict:
        data = super()._shown(data)
        for _, section, name, key in self._other_engines_keys():
            if isinstance(data.get(section), dict):
                data[section] = {k: v for k, v in data[section].items() if k not in (name, key)}
        return data

    @model_validator(mode="after")
    def _load_needs_prometheus(self) -> StackSettings:
        metric = self.serving.autoscaling.metric
        if self.serving.autoscaling.on_load and not self.monitoring.enabled:
            raise fail(f"{metric} is read from the stack's Prometheus, and monitoring.enabled is false: "
                       "set monitoring.enabled true, or serving.autoscaling.metric cpu",
                       "serving.autoscaling.metric")
        return self

    def kind_sections(self) -> tuple[Any, Any, Any]:
        """The cluster and storage sections as the stack reads them, and the cloud's settings, if any."""
        return self.cluster, self.storage, None


def shown_amount(resource: str, amount: float) -> str:
    if resource == "memory":
        return f"{amount / 2**30:g}Gi of memory"
    return f"{amount:g} {'CPU' if resource == 'cpu' else resource}"


@dataclasses.dataclass(frozen=True)
class StackConfig:
    """What the stack program reads: the validated sections, with the defaults that come from other
    sections filled in (StackSettings.kind_sections: on gke, cluster.location and storage.bucketName
    from gcp:)."""
    namespace: str
    cluster: Any  # the kind's `cluster` section (K3dConfig, GkeConfig, ...), whose `kind` names the kind
    platform: PlatformConfig
    storage: Any  # the kind's `storage` section (StorageConfig, GcsConfig, ...)
    monitoring: MonitoringConfig
    pipeline: PipelineConfig
    run_on_up: bool
    cloud: Any = None  # the cloud provider's settings, for a kind that has them (GcpConfig on gke)
    images: ImagesConfig = dataclasses.field(default_factory=ImagesConfig)

    @property
    def cluster_kind(self) -> str:
        return self.cluster.kind
