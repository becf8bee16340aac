"""GKE: node pools (training on its own pool) in a VPC network of the stack's own, images in Artifact
Registry by digest, a GCS bucket mounted with GCS FUSE, reached through Workload Identity, and the
model's endpoint, internal unless the stack asks for a public one. Its stack config is GkeStack: the
`cluster` section (GkeConfig, with its node pools and endpoint), the `storage` section (GcsConfig,
the bucket) and the Google provider's `gcp:project` and `gcp:region`."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from typing import Annotated, Any, ClassVar, Literal, Mapping, get_args

import pulumi
import pulumi_kubernetes as k8s
from pydantic import AfterValidator, Field, model_validator

from common.cluster_names import GATEWAY_NAME, canary_name, predictor_deployment_name
from common.cluster_target import GPU_RESOURCE, KUBERNETES_MINOR, PART_OF
from engines import ENGINES
from infra.cloud_sql import DATABASE, TrackingDatabase, TrackingDatabaseArgs
from infra.gateway import GatewayPlacement
from infra.gcp_apis import GcpApis, GcpApisArgs
from infra.gcs import GcsStorage, GcsStorageArgs
from infra.gke import (
    GPU_DRIVER_VERSIONS,
    QUEUED_PROVISIONING_CLASS,
    GkeCluster,
    GkeClusterArgs,
    MaintenanceWindow,
    NodePoolArgs,
    allocatable,
    machine_size,
    node_selector,
    toleration,
)
from infra.gke_endpoint import (
    BACKEND_POLICY_CRD,
    CERTMAP_ANNOTATION,
    HTTP_PORT,
    HTTPS_PORT,
    INTERNAL_GATEWAY_CLASS,
    NAMED_ADDRESS,
    PUBLIC_GATEWAY_CLASS,
    backend_policy,
)
from infra.gke_public_endpoint import PublicEndpoint, PublicEndpointArgs
from infra.network import GkeNetwork, GkeNetworkArgs, region_of
from infra.registry import RegistryImages, RegistryImagesArgs
from infra.tracking import CloudSqlBackend
from pipeline.config import Autoscaling, ScalingMetric
from pipeline.validation import Flag, Section, Text, WholeNumber, fail, matching
from stacks.installs import platform_ports
from stacks.kinds.base import Cluster, ClusterKind, ImageSource, Storage, TrackingPlacement, TrainingPlacement
from stacks.settings import PROJECT, MonitoringConfig, StackServing, StackSettings, TrainingQuota

# Google's rules: 6-30 characters, lowercase letters, digits and hyphens, a letter first, no hyphen last.
GCP_PROJECT = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"
# Well-formed ids that only ever appear in examples: caught now rather than by the first API call.
PLACEHOLDER_PROJECTS = ("my-gcp-project", "my-project", "my-project-id", "your-project", "your-project-id",
                        "project-id", "gcp-project", "example-project")
PROJECT_RULE = "your GCP project id (6-30 of a-z, 0-9 and -, a letter first)"
SET_PROJECT = "pulumi config set --stack gke gcp:project ..."
GcpProject = matching(GCP_PROJECT, PROJECT_RULE)
GcpRegion = matching(r"^[a-z]+-[a-z]+[0-9]+$", "a GCP region like us-central1")  # northamerica-northeast1
GcpLocation = matching(r"^[a-z]+-[a-z]+[0-9]+(-[a-z])?$",
                       "a region like us-central1 or a zone like us-central1-a")
# At most 24 characters: the nodes' service account is `<name>-nodes`, and account ids stop at 30.
GkeClusterName = matching(r"^[a-z]([-a-z0-9]{0,22}[a-z0-9])?$",
                          "a GKE cluster name: 1-24 of a-z, 0-9 and -, a letter first")
GcsBucket = matching(r"^[a-z0-9][-_a-z0-9]{1,61}[a-z0-9]$", "a bucket name (3-63 of a-z, 0-9, - and _)")
KubernetesVersion = matching(r"^1\.[0-9]+$", f"a version like {KUBERNETES_MINOR}")
# A fully qualified DNS name of at least two labels, lowercase, no wildcard (one certificate, one host).
DOMAIN_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DomainName = Annotated[matching(rf"^({DOMAIN_LABEL}\.)+[a-z]([-a-z0-9]{{0,61}}[a-z0-9])?$",
                                "a domain name like models.example.com"), Field(max_length=253)]
IPV4_RANGE_RULE = "an IPv4 range like 203.0.113.0/24"


def _client_range(text: str) -> str:
    """A range of clients to let in: a network (no host bits set), and not the whole internet."""
    try:
        network = ipaddress.IPv4Network(text)
    except ValueError as error:
        raise fail(f"must be {IPV4_RANGE_RULE}, got {text!r} ({error})") from None
    if network.prefixlen == 0:
        raise fail(f"{text} lets everyone in: name the ranges your clients call from")
    return text


Ipv4Range = Annotated[matching(r"^[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}$", IPV4_RANGE_RULE),
                      AfterValidator(_client_range)]
ReleaseChannel = Literal["RAPID", "REGULAR", "STABLE"]
RELEASE_CHANNELS = get_args(ReleaseChannel)
TrainingPool = Literal["cpu", "spot", "gpu"]
TRAINING_POOLS = get_args(TrainingPool)  # from the plainest to the most specialised


# --- The stack config -------------------------------------------------------------------------------

MachineType = Annotated[Text, Field(description="Compute Engine machine type of the pool's nodes")]
MinNodes = Annotated[WholeNumber, Field(
    ge=0, description="fewest nodes, in total across the location's zones")]
MaxNodes = Annotated[WholeNumber, Field(ge=1, description="most nodes, in total (>= minNodes)")]
AcceleratorType = Annotated[Text, Field(description="GPU type of each node (gpu pool only)")]
AcceleratorCount = Annotated[WholeNumber, Field(ge=0, description="GPUs per node (gpu pool only)")]
DriverVersion = Annotated[Literal[GPU_DRIVER_VERSIONS], Field(
    description="the NVIDIA driver GKE installs on each node: DEFAULT or LATEST for the node's GKE version "
                "(gpu pool only)")]
GPU_ONLY = {"acceleratorType": "accelerators belong in nodePools.gpu",
            "acceleratorCount": "accelerators belong in nodePools.gpu",
            "driverVersion": "GPU drivers belong in nodePools.gpu"}


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
    driver_version: DriverVersion | None = None

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
    driver_version: DriverVersion = GPU_DRIVER_VERSIONS[0]
    queued_provisioning: Flag = Field(
        False, description="nodes only when a training job is admitted, all of its nodes at once, through "
                           "GKE's queued provisioning (Dynamic Workload Scheduler, flex-start) and Kueue's "
                           "ProvisioningRequest admission check: for GPUs when capacity is scarce "
                           "(pipeline.engine trainjob)")


class NodePools(Section):
    cpu: NodePoolConfig = Field(
        NodePoolConfig(), description="always present: system pods, platform, serving")
    spot: SpotPool = Field(SpotPool(), description="optional spot pool for training")
    gpu: GpuPool = Field(GpuPool(), description="optional GPU pool for training")


UtcTime = matching(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$",
                   "a UTC time like 2026-01-03T02:00:00Z")
WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
_DAYS = "(" + "|".join(WEEKDAYS) + ")"
Recurrence = matching(rf"^FREQ=(DAILY|WEEKLY;BYDAY={_DAYS}(,{_DAYS})*)$",
                      "FREQ=DAILY or FREQ=WEEKLY;BYDAY=<days> (MO,TU,WE,TH,FR,SA,SU)")
# GKE's rule for a maintenance window (kubernetes-engine/docs/how-to/maintenance-windows-and-exclusions):
# "at least 48 hours of maintenance availability in a 32-day rolling window", counting only windows
# of 4 contiguous hours or more. 32 days hold at least 4 of each weekday.
LEAST_WINDOW_HOURS, LEAST_HOURS_IN_32_DAYS, WEEKS_IN_32_DAYS = 4, 48, 4


class MaintenanceConfig(Section):
    """When GKE may upgrade the cluster and its nodes, and whether minor upgrades wait for the stack."""
    window_start: UtcTime = Field(
        "2026-01-03T02:00:00Z", description="the first window's start (its time of day is every window's)")
    window_end: UtcTime = Field("2026-01-03T08:00:00Z", description="the first window's end")
    recurrence: Recurrence = Field("FREQ=WEEKLY;BYDAY=SA,SU", description="how the window repeats (RFC 5545)")
    hold_minor_upgrades: Flag = Field(
        True, description="a maintenance exclusion (NO_MINOR_UPGRADES) until the minor's end of support: "
                          "patches only, the cluster stays on cluster.kubernetesVersion")
    hold_from: UtcTime = Field("2026-01-01T00:00:00Z", description="when that exclusion starts")

    @model_validator(mode="after")
    def _gke_takes_the_window(self) -> MaintenanceConfig:
        start, end = (datetime.datetime.fromisoformat(time.replace("Z", "+00:00"))
                      for time in (self.window_start, self.window_end))
        hours = (end - start).total_seconds() / 3600
        if not LEAST_WINDOW_HOURS <= hours <= 24:
            raise fail(f"must be {LEAST_WINDOW_HOURS} to 24 hours after windowStart (GKE counts only windows "
                       f"of {LEAST_WINDOW_HOURS} hours or more): {hours:g} h", "windowEnd")
        days = self.recurrence.partition("BYDAY=")[2].split(",") if "WEEKLY" in self.recurrence else None
        in_32_days = hours * (32 if days is None else WEEKS_IN_32_DAYS * len(days))
        if in_32_days < LEAST_HOURS_IN_32_DAYS:
            raise fail(f"gives {in_32_days:g} hours in 32 days; GKE requires at least "
                       f"{LEAST_HOURS_IN_32_DAYS}: more days or longer windows", "recurrence")
        return self


class EndpointConfig(Section):
    """Who reaches the model: by default only the cluster's VPC network, through an internal load
    balancer; public: true puts it on the internet, over HTTPS only and behind an allowlist."""
    public: Flag = Field(
        False, description="false: an internal load balancer, reached from the cluster's VPC network in "
                           "its region; true: a global external one, HTTPS for `domain`, from "
                           "`allowedSourceRanges` only")
    domain: DomainName | None = Field(
        None, description="public only, required: the name users call, with a Google-managed certificate")
    allowed_source_ranges: tuple[Ipv4Range, ...] = Field(
        (), description="public only, required: the client ranges Cloud Armor lets in; it denies the rest")

    @model_validator(mode="after")
    def _public_needs_https_and_an_allowlist(self) -> EndpointConfig:
        if not self.public:
            for key, value in (("domain", self.domain), ("allowedSourceRanges", self.allowed_source_ranges)):
                if value:
                    raise fail("applies only to a public endpoint (public: true)", key)
            return self
        if self.domain is None:
            raise fail("is required with public: true: the endpoint serves HTTPS only, with a Google-managed "
                       "certificate for this name", "domain")
        if not self.allowed_source_ranges:
            raise fail("is required with public: true: the ranges your clients call from; everyone else is "
                       "denied", "allowedSourceRanges")
        return self


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
        KUBERNETES_MINOR,
        description="the control plane's minimum minor (GKE's min_master_version; the release channel "
                    "upgrades it), what the rendered objects are validated against")
    node_pools: NodePools = Field(
        NodePools(), description="the cpu pool, and the optional spot and gpu pools")
    requested_training_pool: TrainingPool | None = Field(
        None, alias="trainingPool",
        description="where training pods run, an enabled pool; default: gpu if enabled, else spot if "
                    "enabled, else cpu")
    training_quota: TrainingQuota | None = Field(
        None, description="what the training pool holds for training, Kueue's quota (pipeline.engine "
                          "trainjob); default: maxNodes times a node's allocatable CPU and memory")
    endpoint: EndpointConfig = Field(
        EndpointConfig(), description="who reaches the model: the VPC network (default) or, over HTTPS, the "
                                      "internet's allowed ranges")
    maintenance: MaintenanceConfig = Field(
        MaintenanceConfig(), description="when GKE may upgrade, and the hold on minor upgrades")
    authorized_networks: tuple[Ipv4Range, ...] = Field(
        (), description="who may reach the control plane's public IP endpoint; none (default): it is "
                        "private, and kubectl and Pulumi reach the cluster through its DNS-based endpoint "
                        "with their Google identity (0.0.0.0/0 is refused)")

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
        """The pool of training pods: the one named, else the most specialised capacity the stack pays for."""
        return self.requested_training_pool or next(
            name for name in reversed(TRAINING_POOLS) if self.pool(name) is not None)

    def training_quota_of_pool(self) -> dict[str, str]:
        """Kueue's quota: trainingQuota, else what the training pool's nodes hold at its most (maxNodes
        times a node's allocatable, GKE's rule), and all of its GPUs."""
        pool = self.pool(self.training_pool)
        if self.training_quota is not None:
            quota = self.training_quota.as_quota()
        else:
            cpus, memory_gib = allocatable(*machine_size(pool.machine_type))
            quota = {"cpu": f"{int(cpus * pool.max_nodes * 1000)}m",
                     "memory": f"{int(memory_gib * pool.max_nodes * 1024)}Mi"}
        if pool.ACCELERATED:
            quota[GPU_RESOURCE] = str(pool.accelerator_count * pool.max_nodes)
        return quota

    @model_validator(mode="after")
    def _training_pool_exists(self) -> GkeConfig:
        name = self.requested_training_pool
        if name is not None and self.pool(name) is None:
            raise fail(f"{name} needs cluster.nodePools.{name}.enabled: true; enable that pool or choose one "
                       "that exists", "trainingPool")
        machine_type = self.pool(self.training_pool).machine_type
        if self.training_quota is None and machine_size(machine_type) is None:
            raise fail(f"is needed for the {self.training_pool} pool's machine type {machine_type}, whose "
                       "size this stack does not know: give {cpu, memory} for training", "trainingQuota")
        return self


class GcsConfig(Section):
    """The `storage` section of a GKE cluster: its bucket."""
    bucket_name: GcsBucket | None = Field(None, description="the bucket; default <gcp:project>-dist-ml")
    checkpoint_retention_days: WholeNumber = Field(
        30, ge=1, description="objects under checkpoints/ (and old versions) are deleted after this")


@dataclasses.dataclass(frozen=True)
class GcpConfig:
    """The Google provider's `gcp:project` and `gcp:region`: a gke stack's StackConfig.cloud."""
    project: str
    region: str


class GkeMonitoring(MonitoringConfig):
    enabled: Flag = Field(True, description="install monitoring (default: false on k3d, true on gke)")


class GkeAutoscaling(Autoscaling):
    metric: ScalingMetric = Field(
        "inflight", description="inflight or rps (through KEDA on the stack's Prometheus: needs monitoring), "
                                "or cpu or memory (KServe's HPA); default: cpu on k3d, inflight on gke")


class GkeServing(StackServing):
    autoscaling: GkeAutoscaling = Field(
        GkeAutoscaling(), description="what the replicas follow: {metric, target, scaleDownStabilization, "
                                      "latencyObjectiveMs}")


class GkeStack(StackSettings):
    """A stack on a GKE cluster."""
    PROVIDER: ClassVar[str] = "gcp"
    gcp_project: GcpProject | None = Field(None, alias="gcp:project", description=f"required: {PROJECT_RULE}")
    gcp_region: GcpRegion | None = Field(
        None, alias="gcp:region", description="required: the region of everything")
    cluster: GkeConfig = Field(description="the GKE cluster")
    storage: GcsConfig = Field(GcsConfig(), description="the bucket every pipeline pod mounts")
    monitoring: GkeMonitoring = Field(GkeMonitoring(), description="Prometheus, Grafana and the dashboard")
    serving: GkeServing = Field(GkeServing(), description="as in the pipeline's config file")

    def training_quota(self) -> tuple[dict[str, str], int]:
        pool = self.cluster.pool(self.cluster.training_pool)
        return self.cluster.training_quota_of_pool(), pool.accelerator_count if pool.ACCELERATED else 0

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

    @model_validator(mode="after")
    def _queued_provisioning_is_kueues_on_the_training_pool(self) -> GkeStack:
        gpu, key = self.cluster.gpu_pool, "cluster.nodePools.gpu.queuedProvisioning"
        if gpu is None or not gpu.queued_provisioning:
            return self
        if self.cluster.training_pool != "gpu":
            raise fail("needs cluster.trainingPool gpu: the pool has nodes only for the jobs Kueue admits "
                       "to it", key)
        if not ENGINES[self.pipeline.engine].queued:
            raise fail(f"needs pipeline.engine trainjob: Kueue's admission check asks for the nodes "
                       f"(got {self.pipeline.engine})", key)
        return self


# --- The kind ---------------------------------------------------------------------------------------

WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"
PROBE_IMAGE = "curlimages/curl:8.11.1"  # a pod in the cluster, hence in its VPC network, that calls the model


def node_pool(pool: NodePoolConfig, spot: bool = False, queued: bool = False) -> NodePoolArgs:
    accelerators = {"accelerator_type": pool.accelerator_type, "accelerator_count": pool.accelerator_count}
    if pool.driver_version is not None:
        accelerators["gpu_driver_version"] = pool.driver_version
    return NodePoolArgs(machine_type=pool.machine_type, min_nodes=pool.min_nodes, max_nodes=pool.max_nodes,
                        spot=spot, queued_provisioning=queued, **accelerators)


def node_pools(cluster: GkeConfig) -> dict[str, NodePoolArgs]:
    pools = {"cpu": node_pool(cluster.cpu_pool)}
    if cluster.spot_pool:
        pools["spot"] = node_pool(cluster.spot_pool, spot=True)
    if cluster.gpu_pool:
        pools["gpu"] = node_pool(cluster.gpu_pool, queued=cluster.gpu_pool.queued_provisioning)
    return pools


class GkeKind(ClusterKind):
    settings = GkeStack

    def cluster(self) -> Cluster:
        config, gcp = self.config.cluster, self.config.cloud
        self._pools = node_pools(config)
        # First of all: on a fresh project, every other Google resource fails until its API is on.
        self._apis = GcpApis("apis", GcpApisArgs(project=gcp.project))
        # Before the cluster: its nodes are granted reading the repository before they start.
        self._registry = RegistryImages("images", RegistryImagesArgs(
            project=gcp.project, region=gcp.region, gpu_training=self._pools[config.training_pool].gpus > 0,
            base_image=self.config.images.base_image),
            opts=self._after_apis())
        self._network = GkeNetwork("network", GkeNetworkArgs(
            project=gcp.project, name=config.name, region=region_of(config.location),
            proxy_only_subnet=not config.endpoint.public, cluster=config.name,
            control_plane_ports=platform_ports(self.config)), opts=self._after_apis())
        self._cluster = GkeCluster("cluster", GkeClusterArgs(
            project=gcp.project, name=config.name, location=config.location,
            release_channel=config.release_channel, kubernetes_version=config.kubernetes_version,
            deletion_protection=config.deletion_protection,
            node_pools=self._pools, image_repository=self._registry.repository, network=self._network,
            authorized_networks=config.authorized_networks,
            maintenance=MaintenanceWindow(config.maintenance.window_start, config.maintenance.window_end,
                                          config.maintenance.recurrence),
            hold_minor_upgrades_from=config.maintenance.hold_from if config.maintenance.hold_minor_upgrades
            else None),
            opts=self._after_apis())
        return Cluster(provider=self._cluster.provider, kubeconfig=self._cluster.kubeconfig)

    def images(self, cluster: Cluster) -> ImageSource:
        return ImageSource(images=self._registry.images)

    def storage(self, cluster: Cluster, namespace: k8s.core.v1.Namespace, users: tuple[str, ...]) -> Storage:
        gcp, config = self.config.cloud, self.config.storage
        storage = GcsStorage("storage", GcsStorageArgs(
            project=gcp.project, location=gcp.region, bucket_name=config.bucket_name,
            checkpoint_retention_days=config.checkpoint_retention_days, namespace=self.config.namespace,
            workload_pool=self._cluster.workload_pool, kubernetes_service_accounts=users),
            opts=self._after_apis())
        self._storage = storage
        return Storage(storage=storage.storage, ready=[storage],
                       account_annotations={WORKLOAD_IDENTITY_ANNOTATION: storage.service_account_email})

    def tracking(self, cluster: Cluster, service_account: str) -> TrackingPlacement:
        gcp, storage = self.config.cloud, self.config.storage
        database = TrackingDatabase("tracking-database", TrackingDatabaseArgs(
            project=gcp.project, region=gcp.region, name=f"{self.config.cluster.name}-mlflow",
            network=self._network.network.id, bucket=storage.bucket_name, namespace=self.config.namespace,
            kubernetes_service_account=service_account, workload_pool=self._cluster.workload_pool,
            deletion_protection=self.config.cluster.deletion_protection),
            opts=pulumi.ResourceOptions(depends_on=[self._apis, self._storage]))
        backend = CloudSqlBackend(connection_name=database.connection_name, database_user=database.user,
                                  database=DATABASE, artifacts=database.artifacts)
        return TrackingPlacement(backend, ready=[database], account_annotations={
            WORKLOAD_IDENTITY_ANNOTATION: database.service_account_email})

    def _after_apis(self) -> pulumi.ResourceOptions:
        """The options of a component of Google resources: it registers once the APIs are on, and its
        children, which register after it, wait with it."""
        return pulumi.ResourceOptions(depends_on=[self._apis])

    def training_placement(self) -> TrainingPlacement:
        # Training pods go to the training pool only; nothing else tolerates the spot and gpu taints.
        name = self.config.cluster.training_pool
        pool = self._pools[name]
        return TrainingPlacement(pool=name, quota=self.config.cluster.training_quota_of_pool(),
                                 tolerations=tuple(toleration(taint) for taint in pool.taints),
                                 node_selector=node_selector(name), gpus=pool.gpus,
                                 provisioning_class=QUEUED_PROVISIONING_CLASS if pool.queued_provisioning
                                 else None)

    def gateway(self, cluster: Cluster) -> GatewayPlacement:
        endpoint = self.config.cluster.endpoint
        self._public = self._public_endpoint() if endpoint.public else None
        if self._public is None:
            # GKE gives the Gateway the internal load balancer's address, in the stack's network, once
            # it has programmed it (minutes); its proxies run in the proxy-only subnet.
            return GatewayPlacement(INTERNAL_GATEWAY_CLASS, HTTP_PORT, ready=[self._network.proxy_only],
                                    url="http://<inferenceAddress>", address_hint=self._address_command())
        public = self._public
        namespace, model = self.config.namespace, self.config.pipeline.model_name
        # Every predictor Service the route may send requests to, the canary's too, behind the allowlist.
        policies = tuple(backend_policy(namespace, predictor_deployment_name(name),
                                        public.security_policy_name, PART_OF)
                         for name in (model, canary_name(model)))
        return GatewayPlacement(
            PUBLIC_GATEWAY_CLASS, HTTPS_PORT, ready=public.ready, url=f"https://{endpoint.domain}",
            https=True, redirect_port=HTTP_PORT,
            annotations={CERTMAP_ANNOTATION: public.certificate_map_name},
            addresses=({"type": NAMED_ADDRESS, "value": public.address_name},), policies=policies,
            crds=(BACKEND_POLICY_CRD,))

    def _public_endpoint(self) -> PublicEndpoint:
        config, gcp = self.config.cluster, self.config.cloud
        return PublicEndpoint("endpoint", PublicEndpointArgs(
            project=gcp.project, name=f"{config.name}-model", domain=config.endpoint.domain,
            allowed_source_ranges=config.endpoint.allowed_source_ranges), opts=self._after_apis())

    def _address_command(self) -> str:
        return (f"kubectl -n {self.config.namespace} get gateway {GATEWAY_NAME} "
                "-o jsonpath='{.status.addresses[0].value}'")

    def outputs(self, images: ImageSource) -> dict[str, pulumi.Input]:
        return {"images": pulumi.Output.from_input(images.images).apply(lambda built: {
                    "trainer": built.trainer, "serving": built.serving,
                    **({"trainerGpu": built.trainer_gpu} if built.trainer_gpu else {})}),
                **self._endpoint_outputs()}

    def _endpoint_outputs(self) -> dict[str, pulumi.Input]:
        """Who reaches the model, and how: inside the VPC network (a pod of the cluster is there), or
        at the public address once the DNS records are published."""
        if self._public is not None:
            return {"publicAddress": self._public.address, "dnsRecords": self._public.dns_records}
        namespace, model, config = self.config.namespace, self.config.pipeline.model_name, self.config.cluster
        return {
            "inferenceNetwork": f"VPC network {config.name}, region {region_of(config.location)}: an "
                                "internal load balancer, which clients in that network and region reach",
            "inferenceFromInside": f"kubectl -n {namespace} run model-probe --rm -i --restart=Never "
                                   f"--image={PROBE_IMAGE} -- curl -sS "
                                   f"http://$({self._address_command()})/v1/models/{model}",
        }
