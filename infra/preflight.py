"""Are the command-line tools that `pulumi up` needs here, new enough, and is Docker's daemon up?

    python -m infra.preflight [--stack local|gke|existing]

Prints one `ok:` line per tool with its version and exits 0, or one `problem:` line per missing,
too old or unreadable tool (and a Docker daemon that does not answer), saying what to install,
and exits 1. Plain subprocesses: no Pulumi, no stacks, nothing from the network.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from typing import Callable, Sequence

from common import cli
from common.cluster_target import KUBERNETES_MINOR

Version = tuple[int, ...]

VERSION_TIMEOUT_SECONDS = 30.0  # `gcloud version` starts a Python interpreter; seconds on a laptop
DOCKER_INFO_TIMEOUT_SECONDS = 15.0  # a wedged daemon socket hangs `docker info` for minutes
DOTTED = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")

# Minimum versions, each with why.
# BuildKit is the default `docker build` backend from 23.0; 24.0 is the oldest Engine we accept.
DOCKER_MIN: Version = (24, 0)
# k3d 5.6+ for the k3s images of Kubernetes 1.33 and later (Pulumi.local.yaml pins K3S_IMAGE).
K3D_MIN: Version = (5, 6)
# The Python runtime's `toolchain: pip` option in Pulumi.yaml arrived with Pulumi 3.120 (mid 2024).
PULUMI_MIN: Version = (3, 120)
# Kubernetes' version skew policy: kubectl within one minor of the clusters' KUBERNETES_MINOR.
CLUSTER_MAJOR, CLUSTER_MINOR = (int(part) for part in KUBERNETES_MINOR.split("."))
KUBECTL_MIN: Version = (CLUSTER_MAJOR, CLUSTER_MINOR - 1)
# Cloud SDKs from 400 ship the gke-gcloud-auth-plugin component that kubectl needs since GKE 1.26.
GCLOUD_MIN: Version = (400, 0)
# The plugin has no minimum of its own: it is a gcloud component, updated with the SDK.
GKE_AUTH_PLUGIN_MIN: Version = ()
# Pulumi's Kubernetes provider builds Kubeflow Trainer's (or the training operator's) kustomize
# overlay (infra/platform.py) from its GitHub URL, and kustomize fetches it with the git on PATH:
# init, remote add, a shallow fetch of the tag, checkout. Those commands predate git 2.0, so no
# minimum: only that it runs.
GIT_MIN: Version = ()


def dotted(text: str) -> Version | None:
    """The first `X.Y[.Z]` in `text` as numbers."""
    match = DOTTED.search(text)
    return tuple(int(part) for part in match.groups() if part is not None) if match else None


def after(label: str) -> Callable[[str], Version | None]:
    """The version following `label` (k3d prints its own version and k3s's: take the right one)."""
    pattern = re.compile(re.escape(label) + r"\s*v?(\d+\.\d+(?:\.\d+)?)")

    def parse(text: str) -> Version | None:
        match = pattern.search(text)
        return dotted(match.group(1)) if match else None

    return parse


def kubectl_json(text: str) -> Version | None:
    try:
        return dotted(json.loads(text)["clientVersion"]["gitVersion"])
    except (ValueError, KeyError, TypeError):
        return None


def gcloud_json(text: str) -> Version | None:
    try:
        return dotted(json.loads(text)["Google Cloud SDK"])
    except (ValueError, KeyError, TypeError):
        return None


@dataclasses.dataclass(frozen=True)
class Probe:
    """One way of asking a tool its version: the arguments, and how to read what it prints."""
    args: tuple[str, ...]
    parse: Callable[[str], Version | None]


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    minimum: Version
    why: str  # why the minimum, said in a problem line
    install: str  # how to install it: the upstream install page, by name
    probes: tuple[Probe, ...]  # tried in order until one gives a version


DOCKER = Tool("docker", DOCKER_MIN, "BuildKit builds",
              'see Docker docs "Install Docker Engine" or "Install Docker Desktop"',
              (Probe(("version", "--format", "{{.Client.Version}}"), dotted),
               Probe(("--version",), after("Docker version"))))
K3D = Tool("k3d", K3D_MIN, f"k3s {KUBERNETES_MINOR} images", 'see k3d.io "Installation"',
           (Probe(("version",), after("k3d version")),))
PULUMI = Tool("pulumi", PULUMI_MIN, "`toolchain: pip` in Pulumi.yaml",
              'see Pulumi docs "Download & install Pulumi"',
              (Probe(("version",), dotted),))
KUBECTL = Tool("kubectl", KUBECTL_MIN, f"Kubernetes {KUBERNETES_MINOR}, one minor of skew",
               'see Kubernetes docs "Install and Set Up kubectl"',
               (Probe(("version", "--client", "-o", "json"), kubectl_json),
                Probe(("version", "--client"), after("Client Version:"))))
GCLOUD = Tool("gcloud", GCLOUD_MIN, "the gke-gcloud-auth-plugin component",
              'see Google Cloud docs "Install the gcloud CLI"',
              (Probe(("version", "--format", "json"), gcloud_json),
               Probe(("--version",), after("Google Cloud SDK"))))
GKE_AUTH_PLUGIN = Tool("gke-gcloud-auth-plugin", GKE_AUTH_PLUGIN_MIN, "",
                       "run `gcloud components install gke-gcloud-auth-plugin` (GKE docs "
                       '"Install kubectl and configure cluster access")',
                       (Probe(("--version",), dotted),))
GIT = Tool("git", GIT_MIN, "", 'see git-scm.com "Downloads"', (Probe(("--version",), after("git version")),))

TOOLS_BY_STACK: dict[str, tuple[Tool, ...]] = {
    "local": (DOCKER, K3D, PULUMI, KUBECTL, GIT),
    # GKE still builds the images with Docker and pushes them; no k3d.
    "gke": (DOCKER, PULUMI, KUBECTL, GCLOUD, GKE_AUTH_PLUGIN, GIT),
    # A cluster you already have (cluster.kind existing): every wait is the provider's own, so no
    # kubectl; Docker only when the stack builds the images (images.registry), which `pulumi up` says.
    "existing": (PULUMI, GIT),
}


@dataclasses.dataclass(frozen=True)
class Finding:
    ok: bool
    line: str


def show(version: Version) -> str:
    return ".".join(map(str, version))


def run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess | str:
    """The finished process, or why it could not run (one phrase)."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"did not answer in {timeout:.0f}s"
    except OSError as error:
        return f"could not run ({error.strerror or error})"


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def read_version(path: str, tool: Tool) -> Version | str:
    """The tool's version, or what went wrong with the last way we asked."""
    failure = "printed nothing"
    for probe in tool.probes:
        result = run([path, *probe.args], VERSION_TIMEOUT_SECONDS)
        if isinstance(result, str):
            failure = result
            continue
        # Read stdout whatever the exit status: `docker version` prints the client's version
        # and then fails when the daemon is down.
        version = probe.parse(result.stdout)
        if version is not None:
            return version
        if not tool.minimum and result.returncode == 0:
            return ()  # no minimum to hold it to: that it runs is enough
        said = first_line(result.stdout) or first_line(result.stderr)
        failure = f"`{tool.name} {' '.join(probe.args)}` printed no version" + (f" ({said})" if said else "")
    return failure


def docker_daemon_problem(path: str) -> str | None:
    """None when `docker info` succeeds, else why not (its first line of error)."""
    result = run([path, "info", "--format", "{{.ServerVersion}}"], DOCKER_INFO_TIMEOUT_SECONDS)
    if isinstance(result, str):
        return result
    if result.returncode == 0:
        return None
    said = first_line(result.stderr) or first_line(result.stdout)
    return f"exit status {result.returncode}" + (f": {said}" if said else "")


def check(tool: Tool) -> Finding:
    path = shutil.which(tool.name)
    if path is None:
        wanted = f" >= {show(tool.minimum)}" if tool.minimum else ""
        return Finding(False, f"problem: {tool.name} is not on PATH; install "
                              f"{tool.name}{wanted}: {tool.install}")
    version = read_version(path, tool)
    if isinstance(version, str):
        return Finding(False, f"problem: {tool.name} at {path}: {version}; reinstall it: {tool.install}")
    if version < tool.minimum:
        return Finding(False, f"problem: {tool.name} {show(version)} is older than {show(tool.minimum)} "
                              f"(needed for {tool.why}); upgrade it: {tool.install}")
    if tool is DOCKER:
        trouble = docker_daemon_problem(path)
        if trouble is not None:
            return Finding(False, f"problem: docker {show(version)} is installed but its daemon does not "
                                  f"answer (`docker info`: {trouble}); start Docker Desktop or the "
                                  "docker service (`sudo systemctl start docker`)")
        return Finding(True, f"ok: docker {show(version)} (>= {show(tool.minimum)}), daemon answers")
    floor = f" (>= {show(tool.minimum)})" if tool.minimum else ""
    return Finding(True, f"ok: {tool.name} {show(version) or 'runs'}{floor}")


def preflight(stack: str) -> list[Finding]:
    return [check(tool) for tool in TOOLS_BY_STACK[stack]]


def parse_args(argv: Sequence[str] | None) -> str:
    parser = cli.OneLineParser(prog="preflight", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", choices=tuple(TOOLS_BY_STACK), default="local",
                        help="the Pulumi stack you will deploy (default local)")
    return parser.parse_args(argv).stack


def main(argv: Sequence[str] | None = None) -> int:
    stack = parse_args(argv)
    findings = preflight(stack)
    for finding in findings:  # in the stack's order, on stdout, so that they stay in order
        print(finding.line, flush=True)
    problems = sum(not finding.ok for finding in findings)
    if problems:
        print(f"preflight: {problems} problem(s) for `pulumi up --stack {stack}`; fix them and run "
              f"`make preflight STACK={stack}` again", file=sys.stderr)
        return 1
    print(f"preflight: ready for `pulumi up --stack {stack}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
