"""What the platform installs, as data: each upstream chart or kustomize directory at its version, where it
comes from (upstream, an artifact directory, an OCI chart mirror), and the image names its pods run,
rewritten for an image mirror. The training engines (engines/), the Pulumi components (infra/) and the
control-plane tier (tools/), which fills an artifact directory from the components' Go modules, read
it here. Standard library only.

An artifact directory (the stacks' `platform.artifactDirectory`, docs/guides/air-gapped.md) holds:

    charts/<chart>-<version>.tgz          what `helm pull <chart> --version <version>` writes
    kustomize/<repository>-<ref>/...      the repository's tree at the tag (`git clone --branch <ref>`),
                                          its kustomization at the install's path
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any

CHARTS = "charts"
KUSTOMIZE = "kustomize"
DEFAULT_REGISTRY = "docker.io"


@dataclasses.dataclass(frozen=True)
class KustomizeInstall:
    """A kustomize directory of an upstream git repository at a tag, applied server-side. `tags`: the
    image tags upstream's release sets on manifests that name `:latest` or `:main` (its `kustomize edit
    set image` or `sed`), by image name."""

    name: str
    repository: str  # https://github.com/<owner>/<name>
    ref: str
    path: str  # the kustomization's directory in the repository
    tags: tuple[tuple[str, str], ...] = ()
    control_plane_ports: tuple[int, ...] = ()  # see control_plane_ports()

    @property
    def url(self) -> str:
        """kustomize's remote form of the directory (it clones the repository with git)."""
        return f"{self.repository}.git/{self.path}?ref={self.ref}"

    @property
    def artifact(self) -> str:
        """The repository's tree in an artifact directory."""
        return posixpath.join(KUSTOMIZE, f"{posixpath.basename(self.repository)}-{self.ref}")


@dataclasses.dataclass(frozen=True)
class ChartInstall:
    """A Helm chart from its upstream repository (an OCI registry, oci://..., or a chart repository,
    https://...), in its own namespace (created first), with values."""

    name: str
    chart: str  # its name in the repository
    repository: str
    version: str
    namespace: str
    values: dict
    release: str | None = None  # the Helm release's name; None: Pulumi's resource name
    control_plane_ports: tuple[int, ...] = ()  # see control_plane_ports()

    @property
    def artifact(self) -> str:
        """The chart's archive in an artifact directory, as `helm pull` names it."""
        return posixpath.join(CHARTS, f"{self.chart}-{self.version}.tgz")


Install = KustomizeInstall | ChartInstall


@dataclasses.dataclass(frozen=True)
class ArtifactSources:
    """Where the platform's artifacts come from when not from upstream: every chart from the OCI
    registry `chart_mirror`, else from `directory`; every kustomization from `directory`; every image
    the manifests name from the registry `image_mirror`."""

    directory: str | None = None
    chart_mirror: str | None = None  # oci://host[:port][/path]
    image_mirror: str | None = None  # host[:port][/path]


@dataclasses.dataclass(frozen=True)
class ChartSource:
    """helm.v4.Chart's chart, version and repository for one chart."""

    chart: str
    version: str | None
    repository: str | None


def chart_source(install: ChartInstall, sources: ArtifactSources) -> ChartSource:
    if sources.chart_mirror is not None:
        return ChartSource(f"{sources.chart_mirror.rstrip('/')}/{install.chart}", install.version, None)
    if sources.directory is not None:  # the archive names its version
        return ChartSource(posixpath.join(sources.directory, install.artifact), None, None)
    if install.repository.startswith("oci://"):
        return ChartSource(f"{install.repository.rstrip('/')}/{install.chart}", install.version, None)
    return ChartSource(install.chart, install.version, install.repository)


def kustomize_source(install: KustomizeInstall, sources: ArtifactSources) -> str:
    if sources.directory is not None:
        return posixpath.join(sources.directory, install.artifact, install.path)
    return install.url


def image_parts(image: str) -> tuple[str, str]:
    """(registry host, the rest) of an image reference, as Docker normalizes it: no host means
    docker.io, and a one-part repository there is under library/."""
    first, _, rest = image.partition("/")
    if not rest:
        return DEFAULT_REGISTRY, f"library/{image}"
    if "." in first or ":" in first or first == "localhost":
        return first, rest
    return DEFAULT_REGISTRY, image


def qualified(image: str) -> str:
    """`image` as containerd and the kubelet name it (docker.io/library/busybox:latest)."""
    host, rest = image_parts(image)
    return f"{host}/{rest}"


def mirrored(image: str, mirror: str | None) -> str:
    """`image` in the mirror: its registry host replaced by the mirror's (the path, tag and digest
    kept), as charts' `global.imageRegistry` does; unchanged without a mirror."""
    if mirror is None:
        return image
    return f"{mirror.rstrip('/')}/{image_parts(image)[1]}"


def retagged(image: str, tags: dict[str, str]) -> str:
    """`image` with the tag `tags` gives its name (a kustomize install's release tags)."""
    name, tag = split_tag(image)
    return f"{name}:{tags[name]}" if name in tags and "@" not in image else image


def split_tag(image: str) -> tuple[str, str | None]:
    """(name, tag) of an image reference; the tag None when it has none."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1:]
    return name, None


def with_images(value: Any, tags: dict[str, str], mirror: str | None) -> Any:
    """`value` (an object, or any part of one) with every image it names (each `image` field: pod
    templates' containers, KServe's storage and serving runtime containers) tagged as `tags` say and
    taken from `mirror`. A new value; `value` is left as it was."""
    if isinstance(value, dict):
        return {key: (mirrored(retagged(item, tags), mirror) if key == "image" and isinstance(item, str)
                      else with_images(item, tags, mirror)) for key, item in value.items()}
    if isinstance(value, list):
        return [with_images(item, tags, mirror) for item in value]
    return value


def control_plane_ports(installs: list[Install]) -> tuple[int, ...]:
    """The ports the API server calls on the installs' pods: their admission webhooks' and aggregated
    APIs' target ports (what a Service's targetPort resolves to in the pod). Each install names its
    own, beside its version; a private GKE cluster's firewall opens exactly these to the control plane
    (infra/network.py), and the control-plane tier holds them to what the installed platform serves."""
    return tuple(sorted({port for install in installs for port in install.control_plane_ports}))
