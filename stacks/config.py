"""The stack config, parsed once into typed objects before any resource is declared.

Keys live under the project's namespace (`dist-ml:cluster`, `dist-ml:pipeline`, ...), plus the Google
provider's `gcp:project` and `gcp:region` on gke. Each section is a model below (or, for `pipeline` and
`serving`, the pipeline's own, pipeline/config.py, so a value means what it means to `python -m pipeline
run`); each key is declared once with its type, default, constraint and meaning. `cluster.kind` picks
the stack model (K3dStack, GkeStack): a key of another kind, or a bad value, is a ConfigError naming it.

    python -m stacks.config --schema    # the JSON Schema of Pulumi.<stack>.yaml, for editors
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from typing import Annotated, Any, ClassVar, Literal, Mapping, Sequence, Union, get_args

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Strict,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from pipeline.argo import SUPPORTED_ARGO_VERSION, TF_SERVING_CANARY
from pipeline.config import (
    SCHEMA_DIALECT,
    ConfigError,
    DnsLabel,
    PipelineConfig,
    PipelineSettings,
    Quantity,
    Section,
    ServingConfig,
    Text,
    WholeNumber,
    config_error,
    fail,
    key_path,
    matching,
    schema_command,
    section_at,
    standard_keywords,
    without_variant_names,
)
from pipeline.manifests import DEFAULT_ARGO_VERSION

PROJECT = "dist-ml"
K3S_IMAGE = r"^rancher/k3s:v(?P<major>[0-9]+)\.(?P<minor>[0-9]+)\.[0-9]+-k3s[0-9]+$"
# Google's rules: 6-30 characters, lowercase letters, digits and hyphens, a letter first, no hyphen last.
GCP_PROJECT = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"
# Well-formed ids that only ever appear in examples: caught now rather than by the first API call.
PLACEHOLDER_PROJECTS = ("my-gcp-project", "my-project", "my-project-id", "your-project", "your-project-id",
                        "project-id", "gcp-project", "example-project")
PROJECT_RULE = "your GCP project id (6-30 of a-z, 0-9 and -, a letter first)"
SET_PROJECT = "pulumi config set --stack gke gcp:project ..."

Flag = Annotated[bool, Strict()]
Port = Annotated[WholeNumber, Field(ge=1, le=65535)]
ReleaseTag = matching(r"^v[0-9]+\.[0-9]+\.[0-9]+$", "a release tag like v1.2.3")
ArgoRelease = matching(SUPPORTED_ARGO_VERSION.pattern, "an Argo Workflows release v3.x.y or v4.x.y")
ChartVersion = matching(r"^[0-9]+\.[0-9]+\.[0-9]+$", "a chart version like 80.4.1")
K3sImage = matching(K3S_IMAGE, "a rancher/k3s image like rancher/k3s:v1.33.4-k3s1")
GcpProject = matching(GCP_PROJECT, PROJECT_RULE)
GcpRegion = matching(r"^[a-z]+-[a-z]+[0-9]+$", "a GCP region like us-central1")  # northamerica-northeast1
GcpLocation = matching(r"^[a-z]+-[a-z]+[0-9]+(-[a-z])?$",
                       "a region like us-central1 or a zone like us-central1-a")
# At most 24 characters: the nodes' service account is `<name>-nodes`, and account ids stop at 30.
GkeClusterName = matching(r"^[a-z]([-a-z0-9]{0,22}[a-z0-9])?$",
                          "a GKE cluster name: 1-24 of a-z, 0-9 and -, a letter first")
GcsBucket = matching(r"^[a-z0-9][-_a-z0-9]{1,61}[a-z0-9]$", "a bucket name (3-63 of a-z, 0-9, - and _)")
KubernetesVersion = matching(r"^1\.[0-9]+$", "a version like 1.33")
AccessMode = Literal["ReadWriteOnce", "ReadWriteMany"]
ACCESS_MODES = get_args(AccessMode)
ReleaseChannel = Literal["RAPID", "REGULAR", "STABLE"]
RELEASE_CHANNELS = get_args(ReleaseChannel)
TrainingPool = Literal["cpu", "spot", "gpu"]
TRAINING_POOLS = get_args(TrainingPool)  # from the plainest to the most specialised


# --- Sections every stack has -----------------------------------------------------------------------

class PlatformConfig(Section):
    """The `platform` section: what runs the pipeline and serving on the cluster."""
    training_operator_version: ReleaseTag = Field(
        "v1.9.4", description="Kubeflow training operator v1 (TFJob)")
    argo_version: ArgoRelease = Field(DEFAULT_ARGO_VERSION, description="Argo Workflows release")
    cert_manager_version: ReleaseTag = Field(
        "v1.17.0", description="cert-manager (what KServe v0.20 documents)")
    kserve_version: ReleaseTag = Field("v0.20.0", description="KServe charts (Standard mode)")


class MonitoringConfig(Section):
    """The `monitoring` section: kube-prometheus-stack, the monitors and the dist-ml dashboard."""
    enabled: Flag = Field(False, description="install monitoring (default: false on k3d, true on gke)")
    kube_prometheus_stack_version: ChartVersion = Field("80.4.1", description="kube-prometheus-stack chart")


class GkeMonitoring(MonitoringConfig):
    enabled: Flag = Field(True, description="install monitoring (default: false on k3d, true on gke)")


LOCAL_ENGINE_ONLY = "applies only to the local engine (`python -m pipeline run`), not to a cluster stack"


class StackPipeline(PipelineSettings):
    """The `pipeline` section on a stack."""
    NOT_HERE: ClassVar[dict[str, str]] = {"storageRoot": LOCAL_ENGINE_ONLY}
    run_on_up: Flag = Field(False, description="also submit one Workflow run on `pulumi up`")


class StackServing(ServingConfig):
    """The `serving` section on a stack."""
    NOT_HERE: ClassVar[dict[str, str]] = {"httpPort": LOCAL_ENGINE_ONLY}


# --- k3d --------------------------------------------------------------------------------------------

class PortMapping(Section):
    host: Port = Field(description="port on this machine")
    container: Port = Field(description="port of k3d's load balancer (k3s's Traefik ingress: 80)")


class K3dConfig(Section):
    """The `cluster` section of a k3d cluster on this machine."""
    kind: Literal["k3d"] = Field(description="the stack's cluster")
    name: DnsLabel = Field("dist-ml", description="k3d cluster name (kubectl context k3d-<name>)")
    # One server, no agents: local-path volumes are ReadWriteOnce on one node, and every
    # pipeline pod shares the one storage volume, so all of them must run on that node.
    servers: WholeNumber = Field(1, ge=1, description="k3s servers")
    agents: WholeNumber = Field(0, ge=0, description="k3s agents; > 0 needs storage.accessMode ReadWriteMany")
    k3s_image: K3sImage = Field(
        "rancher/k3s:v1.33.4-k3s1", alias="k3sImage", description="k3s image; sets the Kubernetes version")
    ports: tuple[PortMapping, ...] = Field((PortMapping(host=8088, container=80),),
                                           description="host port -> k3d load balancer port")

    @property
    def kubernetes_version(self) -> str:
        major, minor = self.k3s_image.removeprefix("rancher/k3s:v").split(".")[:2]
        return f"{major}.{minor}"


class StorageConfig(Section):
    """The `storage` section of a k3d cluster: its PVC."""
    size: Quantity = Field("10Gi", description="the PVC holding data, checkpoints, exports and models")
    access_mode: AccessMode = Field("ReadWriteOnce", description="ReadWriteOnce or ReadWriteMany")
    storage_class: Text = Field("local-path", description="storage class (k3s's local-path provisioner)")


# --- GKE --------------------------------------------------------------------------------------------

MachineType = Annotated[Text, Field(description="Compute Engine machine type of the pool's nodes")]
MinNodes = Annotated[WholeNumber, Field(
    ge=0, description="fewest nodes, in total across the location's zones")]
MaxNodes = Annotated[WholeNumber, Field(ge=1, description="most nodes, in total (>= minNodes)")]
AcceleratorType = Annotated[Text, Field(description="GPU type of each node (gpu pool only)")]
AcceleratorCount = Annotated[WholeNumber, Field(ge=0, description="GPUs per node (gpu pool only)")]
GPU_ONLY = {key: "accelerators belong in nodePools.gpu" for key in ("acceleratorType", "acceleratorCount")}


class NodePoolConfig(Section):
    """A GKE node pool; as declared here, the cpu pool: always there, untainted, never scaled to zero
    (system pods and the platform run only there)."""
    NOT_HERE: ClassVar[dict[str, str]] = {"enabled": "the CPU pool always exists", **GPU_ONLY}
    OPTIONAL: ClassVar[bool] = False
    ACCELERATED: ClassVar[bool] = False
    machine_type: MachineType = "e2-standard-4"
    min_nodes: MinNodes = 1
    max_nodes: MaxNodes = 5
    accelerator_type: AcceleratorType | None = None
    accelerator_count: AcceleratorCount = 0

    @model_validator(mode="before")
    @classmethod
    def _settings_of_a_disabled_pool(cls, raw: Any) -> Any:
        if cls.OPTIONAL and isinstance(raw, Mapping) and raw.get("enabled", False) is False and (
                set(raw) - {"enabled"}):
            raise fail("is false, so the pool's other settings do nothing; set enabled: true or remove them",
                       "enabled")
        return raw

    def _shown(self, data: dict) -> dict:
        if self.OPTIONAL and not getattr(self, "enabled", True):
            return {key: value for key, value in data.items() if key == "enabled"}
        return super()._shown(data)

    @model_validator(mode="after")
    def _sizes(self) -> NodePoolConfig:
        if not self.OPTIONAL and self.min_nodes < 1:
            raise fail("must be >= 1: system pods and the platform run only on the cpu pool (the spot and "
                       "gpu pools are tainted for training), so it cannot scale to zero; "
                       f"got {self.min_nodes}",
                       "minNodes")
        if self.max_nodes < self.min_nodes:
            raise fail(f"must be >= minNodes ({self.min_nodes}), got {self.max_nodes}", "maxNodes")
        if self.ACCELERATED and self.accelerator_count < 1:
            raise fail("must be >= 1 for a GPU pool", "acceleratorCount")
        return self


class SpotPool(NodePoolConfig):
    """Spot VMs: cheaper, preemptible capacity, tainted for training only."""
    NOT_HERE: ClassVar[dict[str, str]] = GPU_ONLY
    OPTIONAL: ClassVar[bool] = True
    enabled: Flag = Field(False, description="declare this pool")
    machine_type: MachineType = "e2-standard-8"
    min_nodes: MinNodes = 0
    max_nodes: MaxNodes = 3


class GpuPool(SpotPool):
    """Nodes with GPUs, tainted (GKE's nvidia.com/gpu) for training only."""
    NOT_HERE: ClassVar[dict[str, str]] = {}
    ACCELERATED: ClassVar[bool] = True
    machine_type: MachineType = "n1-standard-4"
    accelerator_type: AcceleratorType | None = "nvidia-tesla-t4"
    accelerator_count: AcceleratorCount = 1


class NodePools(Section):
    cpu: NodePoolConfig = Field(
        NodePoolConfig(), description="always present: system pods, platform, serving")
    spot: SpotPool = Field(SpotPool(), description="optional spot pool for training")
    gpu: GpuPool = Field(GpuPool(), description="optional GPU pool for training")


class GkeConfig(Section):
    """The `cluster` section of a GKE cluster."""
    kind: Literal["gke"] = Field(description="the stack's cluster")
    name: GkeClusterName = Field("dist-ml", description="GKE cluster name")
    location: GcpLocation | None = Field(
        None, description="a region (regional cluster) or zone; default gcp:region")
    release_channel: ReleaseChannel = Field("REGULAR", description="GKE release channel")
    deletion_protection: Flag = Field(
        True, description="`pulumi destroy` refuses to delete the cluster while true")
    kubernetes_version: KubernetesVersion = Field(
        "1.33", description="what the rendered objects are validated against")
    node_pools: NodePools = Field(
        NodePools(), description="the cpu pool, and the optional spot and gpu pools")
    requested_training_pool: TrainingPool | None = Field(
        None, alias="trainingPool",
        description="where TFJob pods run, an enabled pool; default: gpu if enabled, else spot if enabled, "
                    "else cpu")

    @property
    def cpu_pool(self) -> NodePoolConfig:
        return self.node_pools.cpu

    @property
    def spot_pool(self) -> SpotPool | None:  # preemptible capacity for training
        return self.node_pools.spot if self.node_pools.spot.enabled else None

    @property
    def gpu_pool(self) -> GpuPool | None:
        return self.node_pools.gpu if self.node_pools.gpu.enabled else None

    def pool(self, name: str) -> NodePoolConfig | None:
        return {"cpu": self.cpu_pool, "spot": self.spot_pool, "gpu": self.gpu_pool}[name]

    @property
    def training_pool(self) -> str:
        """The pool of TFJob pods: the one named, else the most specialised capacity the stack pays for."""
        return self.requested_training_pool or next(
            name for name in reversed(TRAINING_POOLS) if self.pool(name) is not None)

    @model_validator(mode="after")
    def _training_pool_exists(self) -> GkeConfig:
        name = self.requested_training_pool
        if name is not None and self.pool(name) is None:
            raise fail(f"{name} needs cluster.nodePools.{name}.enabled: true; enable that pool or choose one "
                       "that exists", "trainingPool")
        return self


class GcsConfig(Section):
    """The `storage` section of a GKE cluster: its bucket."""
    bucket_name: GcsBucket | None = Field(None, description="the bucket; default <gcp:project>-dist-ml")
    checkpoint_retention_days: WholeNumber = Field(
        30, ge=1, description="objects under checkpoints/ (and old versions) are deleted after this")


@dataclasses.dataclass(frozen=True)
class GcpConfig:
    project: str
    region: str


# --- One model per cluster kind ---------------------------------------------------------------------

class StackSettings(Section):
    """The settings every stack has; a subclass per cluster kind adds its cluster and storage."""
    PROVIDER: ClassVar[str] = ""  # the cloud provider's config namespace, whose other keys are its own
    namespace: DnsLabel = Field(
        "dist-ml", description="where the pipeline, its storage and the model server live")
    platform: PlatformConfig = Field(PlatformConfig(), description="the platform's versions")
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

    def kind_sections(self) -> tuple[Any, Any, Any]:
        """The cluster and storage sections as the stack reads them, and the cloud's settings, if any."""
        return self.cluster, self.storage, None

    @model_validator(mode="after")
    def _judgeable_canary(self) -> StackSettings:
        """A canary is judged on our server's /metrics; KServe's TF Serving serves none."""
        if self.pipeline.rollout.canary_percent and self.serving.runtime == "tensorflow":
            raise fail(f"{TF_SERVING_CANARY}; got {self.pipeline.rollout.canary_percent}",
                       "pipeline.rollout.canaryPercent")
        return self


class K3dStack(StackSettings):
    """A stack on a k3d cluster."""
    cluster: K3dConfig = Field(description="the k3d cluster")
    storage: StorageConfig = Field(StorageConfig(), description="the PVC every pipeline pod mounts")

    @model_validator(mode="after")
    def _one_node_or_shared_storage(self) -> K3dStack:
        if self.cluster.agents > 0 and self.storage.access_mode != "ReadWriteMany":
            raise fail("pods on several nodes share the storage volume, which needs storage.accessMode "
                       "ReadWriteMany and a storage.storageClass that provides it (k3s's local-path is "
                       "ReadWriteOnce); keep agents 0 otherwise", "cluster.agents")
        return self


class GkeStack(StackSettings):
    """A stack on a GKE cluster."""
    PROVIDER: ClassVar[str] = "gcp"
    gcp_project: GcpProject | None = Field(None, alias="gcp:project", description=f"required: {PROJECT_RULE}")
    gcp_region: GcpRegion | None = Field(
        None, alias="gcp:region", description="required: the region of everything")
    cluster: GkeConfig = Field(description="the GKE cluster")
    storage: GcsConfig = Field(GcsConfig(), description="the bucket every pipeline pod mounts")
    monitoring: GkeMonitoring = Field(GkeMonitoring(), description="Prometheus, Grafana and the dashboard")

    def kind_sections(self) -> tuple[GkeConfig, GcsConfig, GcpConfig]:
        """cluster.location and storage.bucketName default from gcp:region and gcp:project."""
        gcp = GcpConfig(project=self.gcp_project, region=self.gcp_region)
        cluster, storage = self.cluster, self.storage
        if cluster.location is None:
            cluster = cluster.model_copy(update={"location": gcp.region})
        if storage.bucket_name is None:
            storage = storage.model_copy(update={"bucket_name": f"{gcp.project}-{PROJECT}"})
        return cluster, storage, gcp

    @model_validator(mode="after")
    def _project_and_region(self) -> GkeStack:
        for key, value in (("gcp:project", self.gcp_project), ("gcp:region", self.gcp_region)):
            if value is None:
                raise fail(f"is required on the gke stack (pulumi config set {key} ...)", key)
        if self.gcp_project in PLACEHOLDER_PROJECTS:
            raise fail(f"must be {PROJECT_RULE}, got {self.gcp_project!r}; {SET_PROJECT}", "gcp:project")
        return self


def stack_models() -> dict[str, type[StackSettings]]:
    """cluster.kind -> the kind's stack model, from the registry of cluster kinds (stacks/kinds/),
    read when asked: the kinds' modules import this one, and a test may register another kind."""
    from stacks.kinds import KINDS

    return {name: kind.settings for name, kind in KINDS.items()}


def _cluster_kind(raw: Any) -> str | None:
    cluster = raw.get("cluster") if isinstance(raw, Mapping) else getattr(raw, "cluster", None)
    kind = cluster.get("kind") if isinstance(cluster, Mapping) else getattr(cluster, "kind", None)
    return kind if isinstance(kind, str) else None


@functools.cache
def _stack_settings(kinds: tuple[tuple[str, type[StackSettings]], ...]) -> TypeAdapter[StackSettings]:
    return TypeAdapter(Annotated[Union[tuple(Annotated[model, Tag(kind)] for kind, model in kinds)],
                                 Discriminator(_cluster_kind)])


def stack_settings() -> TypeAdapter[StackSettings]:
    """The validator of a stack's settings: the model of the kind `cluster.kind` names."""
    return _stack_settings(tuple(stack_models().items()))


@dataclasses.dataclass(frozen=True)
class StackConfig:
    """What the stack program reads: the validated sections, with the defaults that come from other
    sections filled in (cluster.location and storage.bucketName from gcp:)."""
    namespace: str
    cluster: K3dConfig | GkeConfig
    platform: PlatformConfig
    storage: StorageConfig | GcsConfig
    monitoring: MonitoringConfig
    pipeline: PipelineConfig
    run_on_up: bool
    gcp: GcpConfig | None = None  # gke only

    @property
    def cluster_kind(self) -> str:
        return self.cluster.kind


def _stack_config(settings: StackSettings) -> StackConfig:
    cluster, storage, gcp = settings.kind_sections()
    serving = ServingConfig.model_construct(**{name: getattr(settings.serving, name)
                                               for name in ServingConfig.model_fields})
    return StackConfig(namespace=settings.namespace, cluster=cluster, platform=settings.platform,
                       storage=storage, monitoring=settings.monitoring,
                       pipeline=PipelineConfig.of(settings.pipeline, serving),
                       run_on_up=settings.pipeline.run_on_up, gcp=gcp)


def _stack_error(error: ValidationError, raw: Mapping[str, Any]) -> ConfigError:
    """A stack error as `key.path: problem`: the kind's tag dropped, a key of another kind said so."""
    first = error.errors(include_url=False)[0]
    if first["type"] == "union_tag_invalid":
        tag = first["ctx"]["tag"]
        return ConfigError(f"cluster.kind: must be one of {', '.join(stack_models())}, got {tag!r}")
    if first["type"] == "union_tag_not_found":
        cluster = raw.get("cluster")
        if cluster is not None and not isinstance(cluster, Mapping):
            return ConfigError(f"cluster: must be a mapping of settings, got {type(cluster).__name__}")
        return ConfigError(f"cluster.kind: is required: one of {', '.join(stack_models())}")
    kind, loc = first["loc"][0], first["loc"][1:]
    if first["type"] == "extra_forbidden":
        others = [other for other, model in stack_models().items() if other != kind and (
            _has_key(section_at(model, loc[:-1]), loc[-1])
            or str(loc[-1]).partition(":")[0] == model.PROVIDER)]
        if others:
            problem = (f"applies only to cluster.kind {', '.join(others)}" if len(loc) == 1
                       else f"does not apply to cluster.kind {kind}")
            return ConfigError(f"{key_path(loc)}: {problem}")
    return config_error(error, stack_models()[kind], skip=1)


def _has_key(model: type[BaseModel] | None, key: Any) -> bool:
    return model is not None and any((field.alias or name) == key
                                     for name, field in model.model_fields.items())


def parse_stack_config(raw: Mapping[str, Any]) -> StackConfig:
    """Typed config of the project's keys (without the `dist-ml:` prefix) and `gcp:` keys (with it);
    raises ConfigError."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config: must be a mapping of settings, got {type(raw).__name__}")
    try:
        settings = stack_settings().validate_python(raw)
    except ValidationError as error:
        raise _stack_error(error, raw) from None
    return _stack_config(settings)


EMPTY_VALUES = ("", "null", "{}", "[]")


def from_pulumi_values(values: Mapping[str, str], project: str = PROJECT) -> dict[str, Any]:
    """The project's keys (prefix dropped) and the `gcp:` keys (kept) from Pulumi's config map,
    where structured values are JSON text. A key set to nothing (`pulumi config set dist-ml:namespace
    ""`, or an empty structure) is an error naming it: unset keys default, set ones must say something."""
    raw = {}
    for key, value in values.items():
        namespace, _, name = key.partition(":")
        if namespace not in ("gcp", project):
            continue
        shown = key_path([key if namespace == "gcp" else name])
        if not isinstance(value, str):
            raise ConfigError(f"{shown}: must be text as Pulumi passes config, got {type(value).__name__}")
        if value.strip() in EMPTY_VALUES:
            raise ConfigError(f"{shown}: is set but empty; give it a value or remove it "
                              f"(pulumi config rm {key_path([key])})")
        if namespace == "gcp":
            raw[key] = value
            continue
        try:
            raw[name] = json.loads(value) if value[:1] in ("{", "[") else value
        except json.JSONDecodeError as error:
            raise ConfigError(f"{shown}: not valid structured config ({error})") from None
    return raw


# A value set with `pulumi config set --secret` is stored as {secure: ...} in the stack file.
SECURE_VALUE = {"type": "object", "properties": {"secure": {"type": "string"}}, "required": ["secure"],
                "additionalProperties": False}


def stack_file_schema() -> dict:
    """The JSON Schema of a Pulumi.<stack>.yaml: its `config` is one stack model, keys prefixed `dist-ml:`."""
    schema = standard_keywords(without_variant_names(stack_settings().json_schema(by_alias=True)))
    definitions = schema.pop("$defs")
    for model in stack_models().values():
        definition = definitions[model.__name__]
        definition["properties"] = {
            (key if ":" in key else f"{PROJECT}:{key}"): {"anyOf": [value, SECURE_VALUE]}
            for key, value in definition["properties"].items()}
        definition["required"] = [f"{PROJECT}:{key}" for key in definition.get("required", [])]
        if model.PROVIDER:  # the provider's own keys (gcp:zone, ...)
            definition["patternProperties"] = {f"^{model.PROVIDER}:": {}}
    return {"$schema": SCHEMA_DIALECT, "title": "dist-ml Pulumi stack file", "type": "object",
            "properties": {"config": schema}, "$defs": definitions}


def main(argv: Sequence[str] | None = None) -> int:
    return schema_command("stacks.config", stack_file_schema, argv)


if __name__ == "__main__":
    sys.exit(main())
