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
# The registry the end-to-end tier pushes the images to, as CI pushes them to a cluster's: the CNCF's
# Distribution (registry:3), the tier's own.
REGISTRY_VERSION = "v3.1.2"
ARGO_MODULE = "github.com/argoproj/argo-workflows/v4"  # its workflow controller and executor
KSERVE_MODULE = "github.com/kserve/kserve"  # its controller and agent
# The only components the tier may run at another version than the stacks pin, each with why. Any
# other that the module proxy does not serve at its pin fails the tier under CI=true: a silent
# substitute would judge our objects with other code than the cluster runs.
SUBSTITUTES = {
    "argo": "the module proxy serves no v4.1.x of the module (checked 2026-11-28); the tier installs the "
            "stacks' v4.1.2 CRDs and runs the newest v4.0.x controller and executor",
    "pulumi": "the module proxy serves no pkg/v3 v3.272.0 or v3.273.0 (checked 2026-11-29): the engine is "
              "the nearest release after the Python SDK's, which an engine of a later release runs",
    "pulumi-kubernetes": "the module proxy serves the provider's module at one commit only, f47bc2d6f "
                         "(2026-01-15), which is its git tag v4.25.0 (checked 2026-11-29): built and stamped "
                         "4.25.0, installed as the plugin the Python SDK asks for",
}
# A substitute that is not the newest release before the pin (the default): the version itself.
SUBSTITUTE_VERSIONS = {
    "pulumi": "v3.274.0",
    "pulumi-kubernetes": "v4.0.0-20260115033456-f47bc2d6f199",
}
# The release a commit of the provider is tagged as (git tag v4.25.0 at f47bc2d6f): its version stamp.
PULUMI_KUBERNETES_RELEASES = {"v4.0.0-20260115033456-f47bc2d6f199": "4.25.0"}
# The Python SDKs' pins in the dev lock: the engine and the provider plugin the program asks for.
LOCK = ROOT / "requirements.txt"
PULUMI_SDK, PULUMI_KUBERNETES_SDK = "pulumi", "pulumi_kubernetes"
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
    # Upstream's release build stamps its version: -X settings, with {version} (the tag) or {bare} (no v).
    ldflags: tuple[str, ...] = ()
    # Files upstream's build makes before it compiles, which the module zip lacks: (path, content).
    files: tuple[tuple[str, str], ...] = ()
    # `go generate` of these packages of the module (relative directories), with this environment.
    generate: tuple[str, ...] = ()
    generate_env: tuple[tuple[str, str], ...] = ()
    # Modules of the same repository that its go.mod replaces by a relative path, laid out beside the
    # copy as in the repository: (relative path, module, version).
    siblings: tuple[tuple[str, str, str], ...] = ()

    @property
    def served_module(self) -> str:
        return self.source or self.module

    @property
    def copied(self) -> bool:
        """Built from a copy of its module: with links restored, files made or code generated."""
        return bool(self.links or self.files or self.generate or self.siblings)

    def stamps(self) -> str:
        """The -ldflags value of its release build ("" when upstream stamps nothing)."""
        return " ".join(flag.format(version=self.version, bare=self.version.removeprefix("v"))
                        for flag in self.ldflags)

    def command(self, package_suffix: str) -> str:
        """The full package path of the command whose path ends with `package_suffix`."""
        (found,) = [command for command in self.commands if command.endswith(package_suffix)]
        return found


# Kubernetes' release build stamps its version into every binary (hack/lib/version.sh: gitVersion,
# gitMajor, gitMinor of component-base and client-go); controllers read it from the API server's
# /version (Kueue refuses the unstamped v0.0.0-master, KEDA reads the minor version).
KUBERNETES_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")


def kubernetes_stamps(version: str) -> tuple[str, ...]:
    major, minor = version.removeprefix("v").split(".")[:2]
    values = {"gitMajor": major, "gitMinor": minor, "gitVersion": "{version}"}
    return tuple(f"-X {package}.{key}={value}" for package in KUBERNETES_VERSION_PACKAGES
                 for key, value in values.items())


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
        ldflags=kubernetes_stamps(version),
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


# The controllers run as host processes in the tier of tests/cluster/ and in the images the end-to-end
# tier's node runs; both are built as upstream builds them, without cgo (CGO_ENABLED=0 in each
# Makefile or Dockerfile), for images without a C library, with the version stamps of its release build.

def jobset(version: str) -> Component:
    return Component(
        "jobset", "sigs.k8s.io/jobset", version, ("sigs.k8s.io/jobset",),
        "Kubeflow Trainer's manager overlay", static=True,
        ldflags=("-X sigs.k8s.io/jobset/pkg/version.GitVersion={version}",),
    )


def trainer(version: str) -> Component:
    return Component(
        "trainer",
        "github.com/kubeflow/trainer/v2",
        version,
        ("github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",),
        "platform.trainerVersion",
        static=True,
    )


def kueue(version: str) -> Component:
    return Component(
        "kueue", "sigs.k8s.io/kueue", version, ("sigs.k8s.io/kueue/cmd/kueue",), "platform.kueueVersion",
        static=True, ldflags=("-X sigs.k8s.io/kueue/pkg/version.GitVersion={version}",),
    )


def kserve(version: str) -> Component:
    return Component(
        "kserve",
        KSERVE_MODULE,
        version,
        (f"{KSERVE_MODULE}/cmd/manager",),
        "platform.kserveVersion",
        static=True,
    )


def kube_rbac_proxy(version: str) -> Component:
    """The sidecar of KServe's controller pod (its chart's kserve.controller.rbacProxyImage)."""
    return Component(
        "kube-rbac-proxy", "github.com/brancz/kube-rbac-proxy", version,
        ("github.com/brancz/kube-rbac-proxy/cmd/kube-rbac-proxy",), "KServe's chart (rbacProxyImage)",
        static=True, ldflags=("-X k8s.io/component-base/version.gitVersion={version}",),
    )


ARGO_STAMPS = ("-X github.com/argoproj/argo-workflows/v4.version={version}",)


def argo(version: str) -> Component:
    return Component(
        "argo",
        ARGO_MODULE,
        version,
        (f"{ARGO_MODULE}/cmd/workflow-controller",),
        "platform.argoVersion",
        static=True,
        ldflags=ARGO_STAMPS,
    )


# Argo's server embeds its web UI (ui/embed.go: //go:embed dist/app), which yarn builds and which the
# module zip lacks; its own Makefile makes this one file when built without the UI (STATIC_FILES=false:
# `touch ui/dist/app/index.html`). The server then serves its API, and this page at /.
ARGO_UI_PLACEHOLDER = (
    ("ui/dist/app/index.html",
     "<!doctype html><title>Argo Workflows</title><p>This argo-server was built from Argo's Go module, "
     "without its web UI (yarn builds it; the module does not carry it). Its API answers.</p>\n"),
)


def argocli(version: str) -> Component:
    """Argo's CLI, whose `argo server` is the cluster install's argo-server, from the module of the
    workflow controller the tier runs, built as upstream builds it without its UI."""
    return Component(
        "argocli", ARGO_MODULE, version, (f"{ARGO_MODULE}/cmd/argo",),
        "the workflow controller the tier runs", static=True, ldflags=ARGO_STAMPS, files=ARGO_UI_PLACEHOLDER,
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
        ldflags=ARGO_STAMPS,
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
        static=True,
        ldflags=("-X github.com/kedacore/keda/v2/version.Version={bare}",),
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


def kserve_rbac_proxy_version(kserve_module_dir: Path) -> str:
    """The kube-rbac-proxy release KServe's chart runs beside its controller (kserve.controller's
    rbacProxyImage in charts/kserve-resources/values.yaml)."""
    values = kserve_module_dir / "charts" / "kserve-resources" / "values.yaml"
    found = re.findall(r"^\s*rbacProxyImage:\s*\S+/kube-rbac-proxy:(v[0-9.]+)\s*$", values.read_text(),
                       re.MULTILINE)
    if len(found) != 1:
        raise PinError(f"{values}: expected one kube-rbac-proxy image, found {found or 'none'}")
    return found[0]


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


# Modules the tier reads but builds nothing from. cert-manager's: its chart and CRDs (its programs' modules
# are not served: tools/control_plane/cert_manager.py). The Prometheus Operator's: the CRDs of the
# monitors the stacks declare, which a cluster's own Prometheus Operator serves (its newest release the
# module proxy serves; the stacks' monitors are its v1 kinds, unchanged across its releases).
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"


def cert_manager(version: str) -> Component:
    return Component("cert-manager", "github.com/cert-manager/cert-manager", version, (),
                     "platform.certManagerVersion")


def prometheus_operator(version: str = PROMETHEUS_OPERATOR_VERSION) -> Component:
    return Component("prometheus-operator", "github.com/prometheus-operator/prometheus-operator", version, (),
                     "the tier (PROMETHEUS_OPERATOR_VERSION)")


AUTOSCALER_APIS = "k8s.io/autoscaler/cluster-autoscaler/apis"


def autoscaler_apis(version: str) -> Component:
    """The cluster autoscaler's API module: its ProvisioningRequest CRD, which Kueue's provisioning
    admission check needs served when it starts (GKE serves it; kueue cmd/kueue/main.go)."""
    return Component("autoscaler-apis", AUTOSCALER_APIS, version, (), "Kueue's go.mod")


def registry(version: str = REGISTRY_VERSION) -> Component:
    return Component(
        "registry", "github.com/distribution/distribution/v3", version,
        ("github.com/distribution/distribution/v3/cmd/registry",), "the tier (REGISTRY_VERSION)",
    )


def pulumi(version: str) -> Component:
    """Pulumi's engine, the CLI the Automation API runs (pkg/v3's go.mod replaces the sdk with its
    repository's copy, which is the sdk of the same release, and one module with a fork)."""
    return Component(
        "pulumi", "github.com/pulumi/pulumi/pkg/v3", version, ("github.com/pulumi/pulumi/pkg/v3/cmd/pulumi",),
        f"{PULUMI_SDK} in the dev lock",
        ldflags=("-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version={version}",),
    )


PULUMI_KUBERNETES_MODULE = "github.com/pulumi/pulumi-kubernetes/provider/v4"
PULUMI_KUBERNETES_PROVIDER = "cmd/pulumi-resource-kubernetes"
# The provider's go.mod replaces its repository's Go SDK by `../sdk`, which its generator (go:generate
# in cmd/pulumi-resource-kubernetes/main.go) builds against: the SDK module its go.mod requires, beside it.
PULUMI_KUBERNETES_SDK_MODULE = "github.com/pulumi/pulumi-kubernetes/sdk/v4"


def pulumi_kubernetes_release(version: str) -> str:
    """The release a version of the provider's module is (4.25.0), without its v."""
    return PULUMI_KUBERNETES_RELEASES.get(version, version.removeprefix("v"))


def pulumi_kubernetes(version: str, sdk_version: str) -> Component:
    """Pulumi's Kubernetes provider: its schema embedded by its own generator (the module zip carries
    schema.json, not the schema-embed.json that main.go embeds), stamped with its release."""
    release = pulumi_kubernetes_release(version)
    return Component(
        "pulumi-kubernetes", PULUMI_KUBERNETES_MODULE, version,
        (f"{PULUMI_KUBERNETES_MODULE}/{PULUMI_KUBERNETES_PROVIDER}",),
        f"{PULUMI_KUBERNETES_SDK} in the dev lock",
        ldflags=(f"-X {PULUMI_KUBERNETES_MODULE}/pkg/version.Version={release}",),
        generate=(PULUMI_KUBERNETES_PROVIDER,), generate_env=(("VERSION", release),),
        siblings=(("../sdk", PULUMI_KUBERNETES_SDK_MODULE, sdk_version),),
    )


def locked_version(package: str, lock: Path = LOCK) -> str:
    """The version of `package` in the dev lock (requirements.txt), as a tag (v3.272.0)."""
    found = re.findall(rf"^{re.escape(package)}==([0-9][^\s;]*)", lock.read_text(), re.MULTILINE)
    if len(found) != 1:
        raise PinError(f"{lock.name}: expected one {package}==..., found {found or 'none'}")
    return f"v{found[0]}"


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
    cert_manager: str = ""


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
        cert_manager=platform.cert_manager_version,
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
