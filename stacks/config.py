"""The stack config, parsed once into typed objects before any resource is declared.

Keys live under the project's namespace (`dist-ml:cluster`, `dist-ml:pipeline`, ...). The
`pipeline` and `serving` sections are parsed by the pipeline's own parser, so a value means what it
means to `python -m pipeline run`. A bad or inapplicable value is a ConfigError naming the key.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping

from pipeline.argo import SUPPORTED_ARGO_VERSION
from pipeline.config import DNS_LABEL, QUANTITY, ConfigError, PipelineConfig, Section, parse_config
from pipeline.manifests import DEFAULT_ARGO_VERSION

PROJECT = "dist-ml"
CLUSTER_KINDS = ("k3d", "gke")
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany")
VERSION = re.compile(r"^v[0-9]+\.[0-9]+\.[0-9]+$")
K3S_IMAGE = re.compile(r"^rancher/k3s:v(?P<major>[0-9]+)\.(?P<minor>[0-9]+)\.[0-9]+-k3s[0-9]+$")
# Keys of the shared sections that only the local engine reads.
LOCAL_ENGINE_ONLY = {"pipeline": ("storageRoot",), "serving": ("httpPort",)}
TOP_LEVEL = ("namespace", "cluster", "platform", "storage", "monitoring", "pipeline", "serving")


@dataclasses.dataclass(frozen=True)
class PortMapping:
    host: int
    container: int


@dataclasses.dataclass(frozen=True)
class K3dConfig:
    name: str = "dist-ml"
    # One server, no agents: local-path volumes are ReadWriteOnce on one node, and every
    # pipeline pod shares the one storage volume, so all of them must run on that node.
    servers: int = 1
    agents: int = 0
    k3s_image: str = "rancher/k3s:v1.33.4-k3s1"
    ports: tuple[PortMapping, ...] = (PortMapping(host=8088, container=80),)

    @property
    def kubernetes_version(self) -> str:
        match = K3S_IMAGE.match(self.k3s_image)
        return f"{match['major']}.{match['minor']}"


@dataclasses.dataclass(frozen=True)
class PlatformConfig:
    training_operator_version: str = "v1.9.4"
    argo_version: str = DEFAULT_ARGO_VERSION
    cert_manager_version: str = "v1.17.0"  # what KServe v0.20's install docs name
    kserve_version: str = "v0.20.0"


@dataclasses.dataclass(frozen=True)
class NodePoolConfig:
    machine_type: str
    min_nodes: int
    max_nodes: int
    accelerator_type: str | None = None
    accelerator_count: int = 0


@dataclasses.dataclass(frozen=True)
class GkeConfig:
    name: str = "dist-ml"
    location: str = ""  # a region (regional cluster) or a zone (zonal); default: gcp:region
    release_channel: str = "REGULAR"
    deletion_protection: bool = True
    kubernetes_version: str = "1.33"  # what the rendered objects are validated against
    cpu_pool: NodePoolConfig = NodePoolConfig("e2-standard-4", 1, 5)
    spot_pool: NodePoolConfig | None = None  # preemptible capacity for training
    gpu_pool: NodePoolConfig | None = None
    training_pool: str = "cpu"  # where TFJob pods run: one of TRAINING_POOLS, an existing pool

    def pool(self, name: str) -> NodePoolConfig | None:
        return {"cpu": self.cpu_pool, "spot": self.spot_pool, "gpu": self.gpu_pool}[name]


@dataclasses.dataclass(frozen=True)
class GcpConfig:
    project: str
    region: str


@dataclasses.dataclass(frozen=True)
class StorageConfig:
    """The PVC of a k3d cluster."""
    size: str = "10Gi"
    access_mode: str = "ReadWriteOnce"
    storage_class: str = "local-path"  # k3s's provisioner


@dataclasses.dataclass(frozen=True)
class GcsConfig:
    """The bucket of a GKE cluster."""
    bucket_name: str
    checkpoint_retention_days: int = 30  # older objects under checkpoints/ are deleted


@dataclasses.dataclass(frozen=True)
class MonitoringConfig:
    enabled: bool
    kube_prometheus_stack_version: str = "80.4.1"


@dataclasses.dataclass(frozen=True)
class StackConfig:
    cluster_kind: str
    namespace: str
    cluster: K3dConfig | GkeConfig
    platform: PlatformConfig
    storage: StorageConfig | GcsConfig
    monitoring: MonitoringConfig
    pipeline: PipelineConfig
    run_on_up: bool
    gcp: GcpConfig | None = None  # gke only


K3D_KEYS = {"servers": "", "agents": "", "k3sImage": "", "ports": ""}
GKE_KEYS = {"location": "", "releaseChannel": "", "deletionProtection": "", "kubernetesVersion": "",
            "nodePools": "", "trainingPool": "cpu, spot or gpu: the node pool of the TFJob pods"}
CLUSTER_KEYS = {"kind": "k3d or gke", "name": "cluster name", **K3D_KEYS, **GKE_KEYS}
PLATFORM_KEYS = {"trainingOperatorVersion": "", "argoVersion": "", "certManagerVersion": "",
                 "kserveVersion": ""}
PVC_KEYS = {"size": "", "accessMode": "", "storageClass": ""}
GCS_KEYS = {"bucketName": "", "checkpointRetentionDays": ""}
STORAGE_KEYS = {**PVC_KEYS, **GCS_KEYS}
MONITORING_KEYS = {"enabled": "", "kubePrometheusStackVersion": ""}
NODE_POOL_KEYS = {"enabled": "", "machineType": "", "minNodes": "", "maxNodes": "", "acceleratorType": "",
                  "acceleratorCount": ""}
RELEASE_CHANNELS = ("RAPID", "REGULAR", "STABLE")
GCP_KEYS = ("project", "region")
# Google's rules: 6-30 characters, lowercase letters, digits and hyphens, a letter first, no hyphen last.
GCP_PROJECT = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
# Well-formed ids that only ever appear in examples: caught now rather than by the first API call.
PLACEHOLDER_PROJECTS = ("my-gcp-project", "my-project", "my-project-id", "your-project", "your-project-id",
                        "project-id", "gcp-project", "example-project")
GCP_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")  # us-central1, northamerica-northeast1
GCP_LOCATION = re.compile(r"^[a-z]+-[a-z]+[0-9]+(-[a-z])?$")  # a region, or a zone like us-central1-a
# At most 24 characters: the nodes' service account is `<name>-nodes`, and account ids stop at 30.
GKE_CLUSTER_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,22}[a-z0-9])?$")
TRAINING_POOLS = ("cpu", "spot", "gpu")
GCS_BUCKET = re.compile(r"^[a-z0-9][-_a-z0-9]{1,61}[a-z0-9]$")
KUBERNETES_VERSION = re.compile(r"^1\.[0-9]+$")


def _not_for(section: Section, keys: Mapping[str, str], kind: str) -> None:
    """Keys of the other cluster kind are errors, not silently ignored."""
    for key in keys:
        if key in section.raw:
            raise section.fail(key, f"does not apply to cluster.kind {kind}")


def _ports(section: Section) -> tuple[PortMapping, ...]:
    raw = section.raw.get("ports")
    if raw is None:
        return K3dConfig.ports
    if not isinstance(raw, list):
        raise section.fail("ports", "must be a list of {host, container}")
    ports = []
    for index, entry in enumerate(raw):
        port = Section(f"{section.key('ports')}[{index}]", entry, {"host": "", "container": ""})
        host, container = port.integer("host", None, 1), port.integer("container", None, 1)
        if host is None or container is None or max(host, container) > 65535:
            raise section.fail(f"ports[{index}]", "must have host and container ports in 1..65535")
        ports.append(PortMapping(host, container))
    return tuple(ports)


def _k3d(section: Section) -> K3dConfig:
    _not_for(section, GKE_KEYS, "k3d")
    defaults = K3dConfig()
    return K3dConfig(
        name=section.text("name", defaults.name, pattern=DNS_LABEL, what="a DNS-1123 label"),
        servers=section.integer("servers", defaults.servers, 1),
        agents=section.integer("agents", defaults.agents, 0),
        k3s_image=section.text("k3sImage", defaults.k3s_image, pattern=K3S_IMAGE,
                               what="a rancher/k3s image like rancher/k3s:v1.33.4-k3s1"),
        ports=_ports(section),
    )


def _node_pool(parent: Section, name: str, default: NodePoolConfig | None,
               accelerated: bool = False) -> NodePoolConfig | None:
    section = Section(parent.key(name), parent.raw.get(name), NODE_POOL_KEYS)
    optional = default is None
    if optional and not section.flag("enabled", False):
        if set(section.raw) - {"enabled"}:
            raise section.fail("enabled", "is false, so the pool's other settings do nothing; "
                                          "set enabled: true or remove them")
        return None
    if not optional and "enabled" in section.raw:
        raise section.fail("enabled", "the CPU pool always exists")
    base = default or NodePoolConfig("e2-standard-8" if not accelerated else "n1-standard-4", 0, 3)
    pool = NodePoolConfig(
        machine_type=section.text("machineType", base.machine_type),
        min_nodes=section.integer("minNodes", base.min_nodes, 0),
        max_nodes=section.integer("maxNodes", base.max_nodes, 1),
        accelerator_type=section.text("acceleratorType", "nvidia-tesla-t4" if accelerated else None),
        accelerator_count=section.integer("acceleratorCount", 1 if accelerated else 0, 0),
    )
    if not optional and pool.min_nodes < 1:
        raise section.fail("minNodes", "must be >= 1: system pods and the platform run only on the cpu pool "
                                       "(the spot and gpu pools are tainted for training), so it cannot "
                                       f"scale to zero; got {pool.min_nodes}")
    if pool.max_nodes < pool.min_nodes:
        raise section.fail("maxNodes", f"must be >= minNodes ({pool.min_nodes}), got {pool.max_nodes}")
    if not accelerated and ("acceleratorType" in section.raw or "acceleratorCount" in section.raw):
        raise section.fail("acceleratorType", "accelerators belong in nodePools.gpu")
    if accelerated and pool.accelerator_count < 1:
        raise section.fail("acceleratorCount", "must be >= 1 for a GPU pool")
    return pool


def _gke(section: Section, gcp: GcpConfig) -> GkeConfig:
    _not_for(section, K3D_KEYS, "gke")
    defaults = GkeConfig()
    pools = Section(section.key("nodePools"), section.raw.get("nodePools"),
                    {"cpu": "", "spot": "", "gpu": ""})
    cluster = GkeConfig(
        name=section.text("name", defaults.name, pattern=GKE_CLUSTER_NAME,
                          what="a GKE cluster name: 1-24 of a-z, 0-9 and -, a letter first"),
        location=section.text("location", gcp.region, pattern=GCP_LOCATION,
                              what="a region like us-central1 or a zone like us-central1-a"),
        release_channel=section.text("releaseChannel", defaults.release_channel, allowed=RELEASE_CHANNELS),
        deletion_protection=section.flag("deletionProtection", defaults.deletion_protection),
        kubernetes_version=section.text("kubernetesVersion", defaults.kubernetes_version,
                                        pattern=KUBERNETES_VERSION, what="a version like 1.33"),
        cpu_pool=_node_pool(pools, "cpu", defaults.cpu_pool),
        spot_pool=_node_pool(pools, "spot", None),
        gpu_pool=_node_pool(pools, "gpu", None, accelerated=True),
    )
    return dataclasses.replace(cluster, training_pool=_training_pool(section, cluster))


def _training_pool(section: Section, cluster: GkeConfig) -> str:
    """The pool named by trainingPool, which must exist; by default the GPU pool, else the spot pool,
    else the cpu pool: the most specialised capacity the stack pays for."""
    default = next(name for name in reversed(TRAINING_POOLS) if cluster.pool(name) is not None)
    name = section.text("trainingPool", default, allowed=TRAINING_POOLS)
    if cluster.pool(name) is None:
        raise section.fail("trainingPool", f"{name} needs cluster.nodePools.{name}.enabled: true; "
                                           f"enable that pool or choose one that exists")
    return name


def _gcp(kind: str, raw: Mapping[str, Any]) -> GcpConfig | None:
    given = {key.partition(":")[2]: value for key, value in raw.items() if key.startswith("gcp:")}
    if kind != "gke":
        if given:
            raise ConfigError(f"gcp:{sorted(given)[0]}: applies only to cluster.kind gke")
        return None
    for key in GCP_KEYS:
        if not isinstance(given.get(key), str) or not given[key]:
            raise ConfigError(f"gcp:{key}: is required on the gke stack (pulumi config set gcp:{key} ...)")
    project, region = given["project"], given["region"]
    if not GCP_PROJECT.match(project) or project in PLACEHOLDER_PROJECTS:
        raise ConfigError(f"gcp:project: must be your GCP project id (6-30 of a-z, 0-9 and -, a letter "
                          f"first), got {project!r}; pulumi config set --stack gke gcp:project ...")
    if not GCP_REGION.match(region):
        raise ConfigError(f"gcp:region: must be a GCP region like us-central1, got {region!r}")
    return GcpConfig(project=project, region=region)


def _platform(raw: Any) -> PlatformConfig:
    section = Section("platform", raw, PLATFORM_KEYS)
    defaults = PlatformConfig()

    def version(key: str, default: str, pattern: re.Pattern = VERSION) -> str:
        return section.text(key, default, pattern=pattern, what="a release tag like v1.2.3")

    return PlatformConfig(
        training_operator_version=version("trainingOperatorVersion", defaults.training_operator_version),
        argo_version=section.text("argoVersion", defaults.argo_version, pattern=SUPPORTED_ARGO_VERSION,
                                  what="an Argo Workflows release v3.x.y or v4.x.y"),
        cert_manager_version=version("certManagerVersion", defaults.cert_manager_version),
        kserve_version=version("kserveVersion", defaults.kserve_version),
    )


def _storage(raw: Any, kind: str, gcp: GcpConfig | None) -> StorageConfig | GcsConfig:
    section = Section("storage", raw, STORAGE_KEYS)
    if kind == "gke":
        _not_for(section, PVC_KEYS, "gke")
        return GcsConfig(
            bucket_name=section.text("bucketName", f"{gcp.project}-dist-ml", pattern=GCS_BUCKET,
                                     what="a bucket name (3-63 of a-z, 0-9, - and _)"),
            checkpoint_retention_days=section.integer("checkpointRetentionDays", 30, 1),
        )
    _not_for(section, GCS_KEYS, kind)
    defaults = StorageConfig()
    return StorageConfig(
        size=section.text("size", defaults.size, pattern=QUANTITY, what="a quantity like 10Gi"),
        access_mode=section.text("accessMode", defaults.access_mode, allowed=ACCESS_MODES),
        storage_class=section.text("storageClass", defaults.storage_class),
    )


def _monitoring(raw: Any, kind: str) -> MonitoringConfig:
    section = Section("monitoring", raw, MONITORING_KEYS)
    defaults = MonitoringConfig(enabled=kind == "gke")
    return MonitoringConfig(
        enabled=section.flag("enabled", defaults.enabled),
        kube_prometheus_stack_version=section.text(
            "kubePrometheusStackVersion", defaults.kube_prometheus_stack_version,
            pattern=re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$"), what="a chart version like 80.4.1"),
    )


def _shared_sections(raw: Mapping[str, Any]) -> tuple[dict, bool]:
    """The pipeline and serving sections for the pipeline's parser, and the stack-only runOnUp."""
    sections = {}
    for name in ("pipeline", "serving"):
        section = raw.get(name) or {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"{name}: must be a mapping of settings, got {type(section).__name__}")
        for key in LOCAL_ENGINE_ONLY[name]:
            if key in section:
                raise ConfigError(f"{name}.{key}: applies only to the local engine "
                                  "(`python -m pipeline run`), not to a cluster stack")
        sections[name] = dict(section)
    run_on_up = sections["pipeline"].pop("runOnUp", False)
    if not isinstance(run_on_up, bool):
        raise ConfigError(f"pipeline.runOnUp: must be true or false, got {run_on_up!r}")
    return sections, run_on_up


def parse_stack_config(raw: Mapping[str, Any]) -> StackConfig:
    """Typed config of the project's keys (without the `dist-ml:` prefix) and `gcp:` keys (with it);
    raises ConfigError."""
    unknown = sorted(key for key in set(raw) - set(TOP_LEVEL) if not key.startswith("gcp:"))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown setting; known: {', '.join(TOP_LEVEL)}")
    namespace = raw.get("namespace", "dist-ml")
    if not isinstance(namespace, str) or not DNS_LABEL.match(namespace):
        raise ConfigError(f"namespace: must be a DNS-1123 label, got {namespace!r}")
    cluster_section = Section("cluster", raw.get("cluster"), CLUSTER_KEYS)
    kind = cluster_section.text("kind", None, allowed=CLUSTER_KINDS)
    if kind is None:
        raise cluster_section.fail("kind", f"is required: one of {', '.join(CLUSTER_KINDS)}")
    gcp = _gcp(kind, raw)
    cluster = _k3d(cluster_section) if kind == "k3d" else _gke(cluster_section, gcp)
    platform = _platform(raw.get("platform"))
    storage = _storage(raw.get("storage"), kind, gcp)
    sections, run_on_up = _shared_sections(raw)
    pipeline = parse_config(sections)
    if isinstance(cluster, K3dConfig) and cluster.agents > 0 and storage.access_mode != "ReadWriteMany":
        raise ConfigError("cluster.agents: pods on several nodes share the storage volume, which needs "
                          "storage.accessMode ReadWriteMany and a storage.storageClass that provides it "
                          "(k3s's local-path is ReadWriteOnce); keep agents 0 otherwise")
    return StackConfig(cluster_kind=kind, namespace=namespace, cluster=cluster, platform=platform,
                       storage=storage, monitoring=_monitoring(raw.get("monitoring"), kind),
                       pipeline=pipeline, run_on_up=run_on_up, gcp=gcp)


def from_pulumi_values(values: Mapping[str, str], project: str = PROJECT) -> dict[str, Any]:
    """The project's keys (prefix dropped) and the `gcp:` keys (kept) from Pulumi's config map,
    where structured values are JSON text."""
    raw = {}
    for key, value in values.items():
        namespace, _, name = key.partition(":")
        if namespace == "gcp":
            raw[key] = value
        elif namespace == project:
            try:
                raw[name] = json.loads(value) if value[:1] in "{[" else value
            except json.JSONDecodeError as error:
                raise ConfigError(f"{name}: not valid structured config ({error})") from None
    return raw
