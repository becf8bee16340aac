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
CLUSTER_KINDS = ("k3d",)  # gke: the GKE issue
DEPLOYMENT_MODES = ("Standard", "Knative")
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany")
VERSION = re.compile(r"^v[0-9]+\.[0-9]+\.[0-9]+$")
K3S_IMAGE = re.compile(r"^rancher/k3s:v(?P<major>[0-9]+)\.(?P<minor>[0-9]+)\.[0-9]+-k3s[0-9]+$")
# Keys of the shared sections that only the local engine reads.
LOCAL_ENGINE_ONLY = {"pipeline": ("storageRoot",), "serving": ("httpPort",)}
STACK_ONLY_PIPELINE_KEYS = {"runOnUp": "also run the pipeline once on `pulumi up`"}
TOP_LEVEL = ("namespace", "cluster", "platform", "storage", "pipeline", "serving")


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
    kserve_deployment_mode: str = "Standard"
    knative_version: str = "v1.19.0"  # only with kserveDeploymentMode Knative


@dataclasses.dataclass(frozen=True)
class StorageConfig:
    size: str = "10Gi"
    access_mode: str = "ReadWriteOnce"
    storage_class: str = "local-path"  # k3s's provisioner


@dataclasses.dataclass(frozen=True)
class StackConfig:
    cluster_kind: str
    namespace: str
    cluster: K3dConfig
    platform: PlatformConfig
    storage: StorageConfig
    pipeline: PipelineConfig
    run_on_up: bool


CLUSTER_KEYS = {"kind": "k3d or gke", "name": "cluster name", "servers": "k3s servers",
                "agents": "k3s agents", "k3sImage": "rancher/k3s image", "ports": "host port mappings"}
PLATFORM_KEYS = {"trainingOperatorVersion": "", "argoVersion": "", "certManagerVersion": "",
                 "kserveVersion": "", "kserveDeploymentMode": "", "knativeVersion": ""}
STORAGE_KEYS = {"size": "", "accessMode": "", "storageClass": ""}


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


def _cluster(raw: Any) -> tuple[str, K3dConfig]:
    section = Section("cluster", raw, CLUSTER_KEYS)
    kind = section.text("kind", None, allowed=CLUSTER_KINDS)
    if kind is None:
        raise section.fail("kind", f"is required: one of {', '.join(CLUSTER_KINDS)}")
    defaults = K3dConfig()
    cluster = K3dConfig(
        name=section.text("name", defaults.name, pattern=DNS_LABEL, what="a DNS-1123 label"),
        servers=section.integer("servers", defaults.servers, 1),
        agents=section.integer("agents", defaults.agents, 0),
        k3s_image=section.text("k3sImage", defaults.k3s_image, pattern=K3S_IMAGE,
                               what="a rancher/k3s image like rancher/k3s:v1.33.4-k3s1"),
        ports=_ports(section),
    )
    return kind, cluster


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
        kserve_deployment_mode=section.text("kserveDeploymentMode", defaults.kserve_deployment_mode,
                                            allowed=DEPLOYMENT_MODES),
        knative_version=version("knativeVersion", defaults.knative_version),
    )


def _storage(raw: Any) -> StorageConfig:
    section = Section("storage", raw, STORAGE_KEYS)
    defaults = StorageConfig()
    return StorageConfig(
        size=section.text("size", defaults.size, pattern=QUANTITY, what="a quantity like 10Gi"),
        access_mode=section.text("accessMode", defaults.access_mode, allowed=ACCESS_MODES),
        storage_class=section.text("storageClass", defaults.storage_class),
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
    """Typed config of the project's keys without the `dist-ml:` prefix; raises ConfigError."""
    unknown = sorted(set(raw) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown setting; known: {', '.join(TOP_LEVEL)}")
    namespace = raw.get("namespace", "dist-ml")
    if not isinstance(namespace, str) or not DNS_LABEL.match(namespace):
        raise ConfigError(f"namespace: must be a DNS-1123 label, got {namespace!r}")
    kind, cluster = _cluster(raw.get("cluster"))
    platform = _platform(raw.get("platform"))
    storage = _storage(raw.get("storage"))
    sections, run_on_up = _shared_sections(raw)
    pipeline = parse_config(sections)
    if cluster.agents > 0 and storage.access_mode != "ReadWriteMany":
        raise ConfigError("cluster.agents: pods on several nodes share the storage volume, which needs "
                          "storage.accessMode ReadWriteMany and a storage.storageClass that provides it "
                          "(k3s's local-path is ReadWriteOnce); keep agents 0 otherwise")
    needs_knative = pipeline.serving.scale_metric in ("concurrency", "rps")
    if needs_knative and platform.kserve_deployment_mode != "Knative":
        raise ConfigError(f"serving.scaleMetric: {pipeline.serving.scale_metric} autoscaling needs "
                          "platform.kserveDeploymentMode Knative; Standard mode scales on cpu or memory")
    return StackConfig(cluster_kind=kind, namespace=namespace, cluster=cluster, platform=platform,
                       storage=storage, pipeline=pipeline, run_on_up=run_on_up)


def from_pulumi_values(values: Mapping[str, str], project: str = PROJECT) -> dict[str, Any]:
    """The project's keys from Pulumi's config map ({"dist-ml:cluster": "<JSON>"}), decoded."""
    raw = {}
    for key, value in values.items():
        namespace, _, name = key.partition(":")
        if namespace != project:
            continue
        try:
            raw[name] = json.loads(value) if value[:1] in "{[" else value
        except json.JSONDecodeError as error:
            raise ConfigError(f"{name}: not valid structured config ({error})") from None
    return raw
