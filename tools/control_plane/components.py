"""What the tier runs and at which version: each upstream program at the version the stacks install,
read from the stacks' own config (Pulumi.local.yaml, parsed as `pulumi up` parses it), never a second
copy. Where a version follows from another (JobSet from Trainer's overlay, etcd from Kubernetes'
go.mod), it is read from there.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STACKS = ("local", "gke")
# KWOK simulates the nodes and the pods' lifecycle: the tier's own tool, not something a stack installs.
KWOK_VERSION = "v0.8.0"
ARGO_MODULE = "github.com/argoproj/argo-workflows/v4"  # its workflow controller and executor
KSERVE_MODULE = "github.com/kserve/kserve"  # its controller and agent
# The only components the tier may run at another version than the stacks pin, each with why. Any
# other that the module proxy does not serve at its pin fails the tier under CI=true: a silent
# substitute would judge our objects with other code than the cluster runs.
SUBSTITUTES = {
    "argo": "the module proxy serves no v4.1.x of the module (checked 2026-11-28); the tier installs the "
            "stacks' v4.1.2 CRDs and runs the newest v4.0.x controller and executor",
}
# k3s' storage class (local-path) is served by rancher/local-path-provisioner, which k3s ships built in;
# the tier runs it from its module: v0.0.30, the newest release the module proxy serves whose checksum
# the checksum database verifies (v0.0.31 and v0.0.32 are not served, v0.0.33 is not in sum.golang.org).
LOCAL_PATH_VERSION = "v0.0.30"
# Helm renders the charts the stacks install (Kueue's, KServe's) with the values the stacks give them,
# as Pulumi's helm.v4.Chart does with Helm v3's engine.
HELM_VERSION = "v3.22.0"
# Trainer's manager overlay installs JobSet from its release manifests; the tag names the version
# (kubeflow/trainer manifests/third-party/jobset/kustomization.yaml).
JOBSET_RELEASE = re.compile(r"kubernetes-sigs/jobset/releases/download/(v[0-9]+\.[0-9]+\.[0-9]+)/")
K3S_IMAGE = re.compile(r"^rancher/k3s:(v[0-9]+\.[0-9]+\.[0-9]+)-k3s[0-9]+$")
# What kubeadm of the pinned Kubernetes installs beside it (cmd/kubeadm/app/constants/constants.go): the
# real node's cluster DNS.
KUBEADM_CONSTANTS = Path("cmd", "kubeadm", "app", "constants", "constants.go")
KUBEADM_CONSTANT = r'^\s*{name}\s*=\s*"([^"]+)"'
# The real node's NetworkPolicy controller, as k3s runs it: k3s' agent embeds kube-router's
# (pkg/agent/netpol), built from k3s' fork of the module, which k3s' go.mod names in a replace directive
# (github.com/k3s-io/kube-router/v2 v2.6.3-k3s1 on its release-1.33 branch and on main). The fork is not
# in the checksum database (sum.golang.org answers 404 for it), so the tier checks the module's hash
# against the one k3s' go.sum records for it.
KUBE_ROUTER_MODULE = "github.com/cloudnativelabs/kube-router/v2"
KUBE_ROUTER_FORK = "github.com/k3s-io/kube-router/v2"
KUBE_ROUTER_VERSION = "v2.6.3-k3s1"
# Module -> the h1: hash of its zip that its consumer's go.sum records, for modules sum.golang.org lacks.
RECORDED_SUMS = {
    f"{KUBE_ROUTER_FORK}@{KUBE_ROUTER_VERSION}": "h1:RZjUBIuitXCuYoCzm1aM6p5EgQFC5k3N72j4pBIc2j4=",
}
# k3s' go.mod replaces genproto with the release after googleapis/api left it, without which the fork's
# requirements import that package from two modules.
K3S_GENPROTO = "google.golang.org/genproto => google.golang.org/genproto v0.0.0-20230525234035-dd9d682886f9"


class PinError(RuntimeError):
    """The stacks' pins cannot be read, or disagree; the message says which."""


@dataclasses.dataclass(frozen=True)
class Component:
    """One upstream Go module and the programs the tier builds from it."""

    name: str
    module: str
    version: str
    commands: tuple[str, ...]  # main packages, built with `go tool`
    pinned_by: str  # where the version comes from, for the start line
    static: bool = False  # built without cgo: the program runs in an image without a C library
    links: tuple[tuple[str, str], ...] = ()  # (path, target): upstream's symbolic links, restored
    source: str = ""  # the module the proxy serves it as, when upstream builds it from a fork
    replaces: tuple[str, ...] = ()  # replace directives of the program upstream builds it into

    @property
    def served_module(self) -> str:
        return self.source or self.module

    def command(self, package_suffix: str) -> str:
        """The full package path of the command whose path ends with `package_suffix`."""
        (found,) = [command for command in self.commands if command.endswith(package_suffix)]
        return found


def kubernetes(version: str) -> Component:
    cmd = "k8s.io/kubernetes/cmd/"
    return Component(
        "kubernetes",
        "k8s.io/kubernetes",
        version,
        tuple(
            cmd + name
            for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
            + ("kubelet", "kube-proxy")  # the real node's
        ),
        "cluster.k3sImage",
    )


def etcd(version: str) -> Component:
    # etcd's server module is its binary's main package (go.etcd.io/etcd/server/v3/main.go).
    return Component(
        "etcd",
        "go.etcd.io/etcd/server/v3",
        version,
        ("go.etcd.io/etcd/server/v3",),
        "the etcd client Kubernetes' go.mod requires",
    )


def jobset(version: str) -> Component:
    return Component(
        "jobset", "sigs.k8s.io/jobset", version, ("sigs.k8s.io/jobset",), "Kubeflow Trainer's manager overlay"
    )


def trainer(version: str) -> Component:
    return Component(
        "trainer",
        "github.com/kubeflow/trainer/v2",
        version,
        ("github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",),
        "platform.trainerVersion",
    )


def kueue(version: str) -> Component:
    return Component(
        "kueue", "sigs.k8s.io/kueue", version, ("sigs.k8s.io/kueue/cmd/kueue",), "platform.kueueVersion"
    )


def kserve(version: str) -> Component:
    return Component(
        "kserve",
        KSERVE_MODULE,
        version,
        (f"{KSERVE_MODULE}/cmd/manager",),
        "platform.kserveVersion",
    )


def argo(version: str) -> Component:
    return Component(
        "argo",
        ARGO_MODULE,
        version,
        (f"{ARGO_MODULE}/cmd/workflow-controller",),
        "platform.argoVersion",
    )


# Files Argo keeps as symbolic links, which Go's module zips leave out (golang.org/x/mod/zip takes
# regular files only): as served, the module's argoexec does not build on Linux (undefined: Setpgid).
ARGOEXEC_LINKS = (("workflow/executor/osspecific/signal_linux.go", "signal_darwin.go"),)


def argoexec(version: str) -> Component:
    """Argo's executor, from the module of the workflow controller the tier runs, its links restored."""
    return Component(
        "argoexec",
        ARGO_MODULE,
        version,
        (f"{ARGO_MODULE}/cmd/argoexec",),
        "the workflow controller the tier runs",
        static=True,  # copied into every step's container, whatever its C library (upstream: CGO_ENABLED=0)
        links=ARGOEXEC_LINKS,
    )


def kserve_agent(version: str) -> Component:
    """KServe's agent (the predictor's logger sidecar), static as its agent.Dockerfile builds it."""
    return Component(
        "kserve-agent", KSERVE_MODULE, version, (f"{KSERVE_MODULE}/cmd/agent",),
        "platform.kserveVersion", static=True,
    )


def keda(version: str) -> Component:
    keda_cmd = "github.com/kedacore/keda/v2/cmd/"
    return Component(
        "keda",
        "github.com/kedacore/keda/v2",
        version,
        (keda_cmd + "operator", keda_cmd + "webhooks", keda_cmd + "adapter"),
        "platform.kedaVersion",
    )


def coredns(version: str) -> Component:
    # CoreDNS's main package is its module's root (coredns.go), its plugins the ones plugin.cfg lists.
    return Component(
        "coredns", "github.com/coredns/coredns", version, ("github.com/coredns/coredns",),
        "kubeadm's CoreDNSVersion in the Kubernetes module",
    )


def kube_router(version: str = KUBE_ROUTER_VERSION) -> Component:
    """kube-router from k3s' fork, with k3s' replace directives; the tier runs its network policy
    controller alone, as k3s does."""
    return Component(
        "kube-router", KUBE_ROUTER_MODULE, version, (f"{KUBE_ROUTER_MODULE}/cmd/kube-router",),
        "k3s' go.mod (KUBE_ROUTER_VERSION)", source=KUBE_ROUTER_FORK,
        replaces=(f"{KUBE_ROUTER_MODULE} => {KUBE_ROUTER_FORK} {version}", K3S_GENPROTO),
    )


def kubeadm_constant(kubernetes_module_dir: Path, name: str) -> str:
    """A version kubeadm pins (CoreDNSVersion), read from the Kubernetes module."""
    source = kubernetes_module_dir / KUBEADM_CONSTANTS
    found = re.findall(KUBEADM_CONSTANT.format(name=name), source.read_text(), re.MULTILINE)
    if len(found) != 1:
        raise PinError(f"{source}: expected one {name}, found {found or 'none'}")
    return found[0]


def helm(version: str = HELM_VERSION) -> Component:
    return Component(
        "helm", "helm.sh/helm/v3", version, ("helm.sh/helm/v3/cmd/helm",), "the tier (HELM_VERSION)"
    )


def local_path_provisioner(version: str = LOCAL_PATH_VERSION) -> Component:
    return Component(
        "local-path-provisioner", "github.com/rancher/local-path-provisioner", version,
        ("github.com/rancher/local-path-provisioner",), "the tier (LOCAL_PATH_VERSION; k3s ships it)",
    )


def kwok(version: str = KWOK_VERSION) -> Component:
    return Component(
        "kwok", "sigs.k8s.io/kwok", version, ("sigs.k8s.io/kwok/cmd/kwok",), "the tier (KWOK_VERSION)"
    )


@dataclasses.dataclass(frozen=True)
class StackPins:
    """The versions one stack's config installs."""

    kubernetes: str | None  # a k3d stack's k3s image; None where the cloud picks it (GKE's channel)
    trainer: str
    kueue: str
    kserve: str
    argo: str
    keda: str


def stack_pins(stack: str) -> StackPins:
    """Pulumi.<stack>.yaml's versions, parsed and defaulted as the Pulumi program parses them."""
    from stacks.config import from_pulumi_values, parse_stack_config
    from stacks.render import pulumi_values

    values = pulumi_values(ROOT / f"Pulumi.{stack}.yaml")
    if stack == "gke":  # the provider's keys the gke stack requires; no version depends on them
        values = {"gcp:project": "dist-ml-pins", "gcp:region": "us-central1", **values}
    config = parse_stack_config(from_pulumi_values(values))
    platform = config.platform
    image = getattr(config.cluster, "k3s_image", None)
    if image is not None and not (match := K3S_IMAGE.match(image)):
        raise PinError(f"Pulumi.{stack}.yaml: cluster.k3sImage {image!r} names no Kubernetes release")
    return StackPins(
        kubernetes=match.group(1) if image else None,
        trainer=platform.trainer_version,
        kueue=platform.kueue_version,
        kserve=platform.kserve_version,
        argo=platform.argo_version,
        keda="v" + platform.keda_version.removeprefix("v"),
    )


def pins() -> StackPins:
    """The versions every stack installs: one tier judges both stacks' objects, so they must agree."""
    local, *others = [stack_pins(stack) for stack in STACKS]
    for stack, other in zip(STACKS[1:], others):
        for field in dataclasses.fields(StackPins):
            mine, theirs = getattr(local, field.name), getattr(other, field.name)
            if theirs is not None and theirs != mine:
                raise PinError(
                    f"Pulumi.{stack}.yaml installs {field.name} {theirs} and Pulumi.local.yaml "
                    f"{mine}: the tier runs one version of each"
                )
    if local.kubernetes is None:
        raise PinError("Pulumi.local.yaml: no k3s image, so no Kubernetes version to run")
    return local


def jobset_version(trainer_module_dir: Path) -> str:
    """The JobSet release Trainer's manager overlay installs, read from that overlay."""
    overlay = trainer_module_dir / "manifests" / "third-party" / "jobset" / "kustomization.yaml"
    found = JOBSET_RELEASE.findall(overlay.read_text())
    if len(set(found)) != 1:
        raise PinError(f"{overlay}: expected one JobSet release, found {found or 'none'}")
    return found[0]
