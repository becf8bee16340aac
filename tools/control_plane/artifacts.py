"""An artifact directory (the stacks' `platform.artifactDirectory`, laid out as common/installs.py says)
filled from the components' Go modules at the versions the stacks pin, as an air-gapped cluster's
operator fills one from upstream: the end-to-end tier's `pulumi up` installs the platform from it.

- A chart: the module's chart directory packaged as `helm package` packages it (<chart>/... in a gzipped
  tar), named as `helm pull` names the archive. Where the module's Chart.yaml still holds the
  placeholder its release tool replaces (cert-manager's v0.0.0: make/manifests.mk packages it with
  --version and --app-version), the pinned release is written there, as that tool writes it.
- A kustomization: the module's tree (the top directory the kustomization lives in, whose siblings it
  refers to) under the repository's name at the tag. Trainer's manager overlay refers to JobSet's
  release manifests by URL (manifests/third-party/jobset/kustomization.yaml); JobSet's release builds
  that file from its module's config/default with kustomize (its Makefile's `artifacts`), so the copy
  holds that build beside the kustomization, which names it instead of the URL.

PROVENANCE.json records, for each artifact, the module and version it was copied from and every file
that differs from the module's: tests/e2e_node/test_pulumi.py holds each copy to its pin with it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import tarfile
from pathlib import Path

import yaml

from common.installs import ChartInstall, Install, KustomizeInstall
from tools.control_plane.build import Built, copy_tree
from tools.control_plane.components import JOBSET_RELEASE
from tools.control_plane.upstream import kustomize

PROVENANCE = "PROVENANCE.json"
RELEASE_PLACEHOLDER = "v0.0.0"  # cert-manager's Chart.yaml until its release tool packages it
JOBSET_KUSTOMIZATION = Path("manifests", "third-party", "jobset", "kustomization.yaml")
JOBSET_MANIFESTS = "manifests.yaml"


@dataclasses.dataclass(frozen=True)
class ModuleSource:
    """Where in which component's module an install's artifact is."""

    component: str
    path: str  # the chart's directory, or the top directory of the kustomization's tree


# By install name (common/installs.py): the module holding each artifact the stacks install.
MODULE_SOURCES = {
    "trainer": ModuleSource("trainer", "manifests"),
    "kueue": ModuleSource("kueue", "charts/kueue"),
    "kserve-crd": ModuleSource("kserve", "charts/kserve-crd"),
    "kserve-resources": ModuleSource("kserve", "charts/kserve-resources"),
    "kserve-runtime-configs": ModuleSource("kserve", "charts/kserve-runtime-configs"),
    "cert-manager": ModuleSource("cert-manager", "deploy/charts/cert-manager"),
    "keda": ModuleSource("keda", "config"),
    "argo": ModuleSource("argo", "manifests"),
}


class NoModule(RuntimeError):
    """An artifact no module of the tier's holds; the message names it."""


def fill(directory: Path, installs: list[Install], built: dict[str, Built], kubectl: str) -> dict:
    """Each install's artifact in `directory`, from its module; returns (and writes) the provenance."""
    provenance = {}
    for install in installs:
        source = MODULE_SOURCES.get(install.name)
        if source is None or source.component not in built:
            raise NoModule(f"{install.name}: no module of the tier's holds it "
                           "(tools/control_plane/artifacts.py MODULE_SOURCES)")
        module = built[source.component]
        edits = (chart(directory, install, Path(module.module_dir) / source.path)
                 if isinstance(install, ChartInstall)
                 else tree(directory, install, Path(module.module_dir), source.path, built, kubectl))
        pinned = install.version if isinstance(install, ChartInstall) else install.ref
        provenance[install.artifact] = {"module": module.module, "version": module.version, "pinned": pinned,
                                        "path": source.path, "edits": sorted(edits)}
    (directory / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
    return provenance


def chart(directory: Path, install: ChartInstall, chart_dir: Path) -> list[str]:
    """The chart packaged as <chart>-<version>.tgz; its Chart.yaml stamped if it holds the placeholder."""
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    edits = []
    if meta.get("version") == RELEASE_PLACEHOLDER:
        meta.update(version=install.version, appVersion=install.version)
        edits.append("Chart.yaml")
    target = directory / install.artifact
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as archive:
        for path in sorted(chart_dir.rglob("*")):
            if path.is_file():
                name = f"{install.chart}/{path.relative_to(chart_dir)}"
                if path.relative_to(chart_dir) == Path("Chart.yaml") and edits:
                    data = yaml.safe_dump(meta, sort_keys=False).encode()
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
                else:
                    archive.add(path, arcname=name)
    return edits


def tree(directory: Path, install: KustomizeInstall, module_dir: Path, top: str, built: dict[str, Built],
         kubectl: str) -> list[str]:
    """The module's `top` directory at the artifact's place; Trainer's JobSet reference made local."""
    target = directory / install.artifact / top
    if target.exists():
        shutil.rmtree(target)
    copy_tree(module_dir / top, target)
    reference = module_dir / JOBSET_KUSTOMIZATION
    if top == JOBSET_KUSTOMIZATION.parts[0] and reference.is_file() and "jobset" in built:
        return jobset_release_inline(directory / install.artifact, Path(built["jobset"].module_dir), kubectl)
    return []


def jobset_release_inline(root: Path, jobset_module: Path, kubectl: str) -> list[str]:
    """Trainer's third-party JobSet kustomization naming JobSet's release manifests, built here as its
    release builds them, instead of their URL."""
    kustomization_path = root / JOBSET_KUSTOMIZATION
    kustomization = yaml.safe_load(kustomization_path.read_text())
    resources = kustomization.get("resources") or []
    found = [resource for resource in resources if JOBSET_RELEASE.search(resource)]
    if len(found) != 1:
        raise NoModule(f"{JOBSET_KUSTOMIZATION}: expected one JobSet release URL, found {found or 'none'}")
    release = kustomize(kubectl, jobset_module / "config" / "default")
    (kustomization_path.parent / JOBSET_MANIFESTS).write_text(yaml.safe_dump_all(release, sort_keys=False))
    kustomization["resources"] = [JOBSET_MANIFESTS if resource == found[0] else resource
                                  for resource in resources]
    kustomization_path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    within = JOBSET_KUSTOMIZATION.relative_to(JOBSET_KUSTOMIZATION.parts[0])  # under the copied top directory
    return [str(within), str(within.parent / JOBSET_MANIFESTS)]
