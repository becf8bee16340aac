"""What a stack's artifact directory must hold (`platform.artifactDirectory`, for an air-gapped cluster),
and how to fetch each piece on a connected machine: one line per chart and kustomization the stack
installs with its config, then the command that puts it in place.

    python -m stacks.artifacts --stack local|gke|<stack> [--directory DIR]

Reads Pulumi.<stack>.yaml as `pulumi up` would (gke's project and region are not needed). The layout
is common/installs.py's: charts/<chart>-<version>.tgz as `helm pull` writes them, and each
kustomization's repository at its tag under kustomize/<repository>-<tag>/. docs/guides/air-gapped.md
says how to carry the directory and the images across.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import shlex
from pathlib import Path
from typing import Sequence

from common import cli
from common.installs import ChartInstall, Install
from pipeline.validation import ConfigError
from stacks.config import from_pulumi_values, parse_stack_config
from stacks.installs import REPO_ROOT, installed_artifacts
from stacks.render import pulumi_values

# Trainer's manager overlay names JobSet's release manifests by URL (manifests/third-party/jobset): in
# an air-gapped copy, the file is fetched beside the kustomization, which then names it.
JOBSET_KUSTOMIZATION = "manifests/third-party/jobset/kustomization.yaml"
TRAINER_REPOSITORY = "https://github.com/kubeflow/trainer"
# The keys a gke stack file needs that no artifact depends on.
PLACEHOLDER_CLOUD = {"gcp:project": "dist-ml-artifacts", "gcp:region": "us-central1"}


def fetch_commands(install: Install, directory: str) -> list[str]:
    """The shell commands that put `install`'s artifact in `directory`, on a machine that reaches
    upstream (helm and git)."""
    if isinstance(install, ChartInstall):
        charts = posixpath.join(directory, posixpath.dirname(install.artifact))
        oci = install.repository.startswith("oci://")
        source = ([f"{install.repository.rstrip('/')}/{install.chart}"] if oci
                  else [install.chart, "--repo", install.repository])
        return [shlex.join(["helm", "pull", *source, "--version", install.version, "-d", charts])]
    target = posixpath.join(directory, install.artifact)
    commands = [shlex.join(["git", "clone", "--depth", "1", "--branch", install.ref, install.repository,
                            target])]
    if install.repository == TRAINER_REPOSITORY and install.path.startswith("manifests/overlays/manager"):
        # JobSet's release manifests, which the overlay names by URL: fetched beside it, then named there.
        kustomization = shlex.quote(posixpath.join(target, JOBSET_KUSTOMIZATION))
        manifests = shlex.quote(posixpath.join(target, posixpath.dirname(JOBSET_KUSTOMIZATION),
                                               "manifests.yaml"))
        commands.append(f"url=$(grep -o 'https://[^ ]*manifests.yaml' {kustomization}) && "
                        f"curl -fsSL \"$url\" -o {manifests} && "
                        f"sed -i \"s|$url|manifests.yaml|\" {kustomization}")
    return commands


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="stacks.artifacts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", required=True, help="reads Pulumi.<stack>.yaml")
    parser.add_argument("--directory", default=None,
                        help="where the artifacts go (default: the stack's platform.artifactDirectory, "
                             "else DIR)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    stack_file = REPO_ROOT / f"Pulumi.{args.stack}.yaml"
    if not stack_file.is_file():
        raise cli.UsageError(f"{stack_file}: no such stack file")
    values = pulumi_values(stack_file)
    if json.loads(values.get("dist-ml:cluster", "{}")).get("kind") == "gke":
        values = {**PLACEHOLDER_CLOUD, **values}
    try:
        config = parse_stack_config(from_pulumi_values(values))
    except ConfigError as error:
        raise cli.UsageError(f"{stack_file.name}: {error}") from None
    directory = args.directory or config.platform.artifact_directory or "DIR"
    for install in installed_artifacts(config):
        version = install.version if isinstance(install, ChartInstall) else install.ref
        kind = "chart" if isinstance(install, ChartInstall) else f"kustomization {install.path} of"
        print(f"# {install.name}: {kind} {install.artifact} ({version})")
        for command in fetch_commands(install, str(Path(directory))):
            print(command)


if __name__ == "__main__":
    cli.run("stacks.artifacts", main)
