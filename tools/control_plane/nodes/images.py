"""The images the control-plane tier's node runs, built on this machine with buildah (no Docker engine,
no registry), which the node's containerd loads from buildah's own storage (`buildah push` of a
docker-archive to `ctr -n k8s.io images import -`, streamed: an archive on disk would be a third copy
of every image's gigabytes). One table, IMAGES, a row per image: adding an image is adding its row.

- a STAND-IN for python:3.11-slim, which no registry here serves: Debian bookworm's own Python 3.11
  (python3, python3-pip, python-is-python3, passwd for useradd, ca-certificates), laid out by
  mmdebstrap from this machine's apt sources, with Debian's EXTERNALLY-MANAGED marker removed so pip
  installs into it as into python:3.11-slim. The project's images are built on it, not on the
  image the stacks build on;
- the project's images (ProjectImage: infra.images.BASE_IMAGES) from their own Dockerfiles, on the
  stand-in (--build-arg BASE_IMAGE), named as the rendered stack names them (infra.images.image_ref),
  fully qualified as the kubelet asks for them (dist-ml/trainer:<tag> is docker.io/dist-ml/trainer:<tag>);
- the sandboxes' pause image (PauseImage): Kubernetes' own build/pause/linux/pause.c from the
  k8s.io/kubernetes module the tier builds, compiled with its Makefile's flags, in its own Dockerfile,
  named as upstream names it (registry.k8s.io/pause:<its Makefile's TAG>);
- the helper image of rancher/local-path-provisioner's helper pods (HelperImage: its deploy manifest's
  helperPod.yaml runs docker.io/library/busybox): Debian's busybox-static and its applets' links;
- upstream programs' images (ProgramImage): the platform's controllers, Argo's executor (argoexec, from
  the module of the workflow controller the tier runs) and KServe's agent (the predictor's request
  logger), static programs of the tier's Go build (so built after it: `program_images`), laid out as
  their upstream Dockerfiles lay them out, named as the cluster's manifests and config (the stacks' Argo
  config map, KServe's chart) name them.

    python -m tools.control_plane.nodes.images [IMAGE ...]   # all, or those named: trainer, pause, ...

It runs outside the tier's namespaces: pip needs PyPI in the Dockerfiles' RUN steps (--network host).
Caches are outside the clone: buildah's storage (its layer cache, --layers) and ~/.cache/dist-ml/images
(the stand-in's and pause's build contexts; a program's goes once its image holds it). A warm run
builds every layer from the cache. Prints a line per image. Once a run's images are all built, the
launcher prunes buildah's storage of what no checkout on the machine uses (prune).

Under CI=true a missing buildah, mmdebstrap, gcc, busybox-static or an unreachable PyPI or Debian
mirror fails, naming it; elsewhere it says so and exits 0, and the caller skips
(tools.control_plane.build.Unavailable).
Standard library and PyYAML (KServe's chart values), besides the project's own image names (infra.images);
it runs in the dev venv.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from common.installs import qualified, split_tag
from infra.images import TRACKING_SERVER_IMAGE, image_ref
from tools.control_plane import build, components
from tools.control_plane.build import ROOT, BuildError, Unavailable, in_ci

CACHE = build.MACHINE_CACHE / "images"
# What build_images built for this checkout (beside the Go build's manifest), which the real node loads
# and the end-to-end tier pushes.
MANIFEST = build.CACHE / "node-images.json"
BUILDAH_TIMEOUT_SECONDS = 3600
BUILDAH_ROLE = "it builds the tier's images"  # said when it is missing
# Every build: the layer cache, and no working container left behind by a failed one.
BUILD = ("build", "--layers", "--force-rm")

STANDIN = "localhost/dist-ml/python-standin:3.11"
DEBIAN_SUITE = "bookworm"  # its python3 is 3.11, python:3.11-slim's
STANDIN_PACKAGES = ("python3", "python3-pip", "python-is-python3", "passwd", "ca-certificates")
# Debian's PEP 668 marker: without it pip installs system-wide, as in python:3.11-slim.
EXTERNALLY_MANAGED = "usr/lib/python3.11/EXTERNALLY-MANAGED"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
# Labelled on the stand-in: a change of its recipe (packages, suite, sources) builds it again.
RECIPE_LABEL = "dist-ml.recipe"
# apt's words, through mmdebstrap, for a mirror it cannot reach.
APT_UNREACHABLE = re.compile(r"Temporary failure resolving|Could not resolve|Could not connect|"
                             r"Connection timed out|Network is unreachable")
STANDIN_CONTAINERFILE = """\
FROM scratch
ADD rootfs.tar /
ENV LANG=C.UTF-8
CMD ["python3"]
"""

PAUSE_REPOSITORY = "registry.k8s.io/pause"
PAUSE_DIR = "build/pause"  # in the k8s.io/kubernetes module: Makefile, Dockerfile, linux/pause.c

# rancher/local-path-provisioner's deploy/local-path-storage.yaml (and its chart's helperImage):
# its helper pods run docker.io/library/busybox, untagged, so :latest.
HELPER_IMAGE = "docker.io/library/busybox:latest"
BUSYBOX = Path("/bin/busybox")
BUSYBOX_PACKAGE = "busybox-static"  # Debian's busybox is linked dynamically: not for a scratch image
HELPER_CONTAINERFILE = """\
FROM scratch
COPY rootfs/ /
CMD ["sh"]
"""

PYPI = "https://pypi.org/simple/"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian's, this machine's and the stand-in's


# Where each image goes: into the node's containerd (its sandboxes' pause, the volume helper: the
# node's own, as k3s ships them), or into the tier's registry, where the stack's config names the
# project's images and the platform's manifests (through its image mirror) name the platform's.
NODE, PROJECT, PLATFORM = "node", "project", "platform"


@dataclasses.dataclass(frozen=True)
class BuiltImage:
    """An image the tier built, as the kubelet asks for it."""

    key: str  # its row's in IMAGES
    name: str  # fully qualified, as the kubelet asks for it (the project's: as they are named before a push)
    image_id: str  # buildah's ID of the build: the node's store reloads `name` when it changes
    role: str  # its row's: NODE, PROJECT or PLATFORM


def require(program: str, why: str) -> str:
    found = shutil.which(program)
    if found is None:
        raise Unavailable(f"{program} is not on PATH ({why})")
    return found


def check_pypi() -> None:
    """PyPI, as the Dockerfiles' pip reaches it (they name no other index), from this machine."""
    try:
        urllib.request.urlopen(PYPI, timeout=20).close()
    except (urllib.error.URLError, TimeoutError) as error:
        raise Unavailable(f"PyPI ({PYPI}) cannot be reached, and the images' pip install needs it: {error}")


def run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILDAH_TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv)}: {build.last_lines(done.stderr.strip() or done.stdout.strip())}")
    return done.stdout


def buildah(*args: str) -> str:
    return run(require("buildah", BUILDAH_ROLE), *args)


def image_config(name: str) -> dict | None:
    """buildah's record of the image `name` (its ID under FromImageID), or None if there is none."""
    found = subprocess.run([require("buildah", BUILDAH_ROLE), "inspect", "--type", "image", name],
                           capture_output=True, text=True)
    return json.loads(found.stdout) if found.returncode == 0 else None


def image_id(name: str) -> str | None:
    config = image_config(name)
    return config["FromImageID"] if config else None


def built(name: str, build_image: Callable[[], None], say: Callable[[str], None]) -> str:
    """Runs `build_image()`, says how long it took and whether it left the image as it was, and returns
    buildah's ID of the image `name`."""
    before, started = image_id(name), time.monotonic()
    build_image()
    identity = image_id(name)
    if identity is None:
        raise BuildError(f"buildah holds no image {name} after building it")
    cached = " (cached)" if identity == before else ""
    say(f"images: {name} ready in {time.monotonic() - started:.0f} s{cached}")
    return identity


# --- The stand-in base -------------------------------------------------------------------------------

def apt_sources(places: tuple[Path, ...] = APT_SOURCES) -> list[Path]:
    """This machine's apt source files that name Debian's DEBIAN_SUITE or its updates and security
    suites (bookworm-updates, bookworm-security), one-line or deb822."""
    files = []
    for place in places:
        if place.is_file():
            files.append(place)
        elif place.is_dir():
            files += sorted(path for path in place.iterdir() if path.suffix in (".list", ".sources"))
    return [path for path in files if any(suite == DEBIAN_SUITE or suite.startswith(f"{DEBIAN_SUITE}-")
                                          for suite in source_suites(path.read_text()))]


def source_suites(text: str) -> set[str]:
    suites = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("Suites:"):
            suites.update(line.removeprefix("Suites:").split())
        elif line.startswith(("deb ", "deb-src ")):
            fields = re.sub(r"\[[^]]*\]", "", line).split()
            if len(fields) >= 3:
                suites.add(fields[2])
    return suites


def mmdebstrap_argv(target: Path, sources: list[Path]) -> list[str]:
    """mmdebstrap's command for the stand-in's root filesystem; with no sources of this machine's for
    the suite, mmdebstrap's own default (deb.debian.org, with updates and security)."""
    return [
        "mmdebstrap", "--variant=minbase", f"--include={','.join(STANDIN_PACKAGES)}",
        f"--customize-hook=rm -f \"$1\"/{EXTERNALLY_MANAGED}",
        DEBIAN_SUITE, str(target), *(str(path) for path in sources),
    ]


def standin_recipe(sources: list[Path]) -> str:
    recipe = [mmdebstrap_argv(Path("rootfs.tar"), []), STANDIN_CONTAINERFILE,
              *(path.read_text() for path in sources)]
    return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:16]


def build_standin() -> None:
    sources = apt_sources()
    recipe = standin_recipe(sources)
    config = image_config(STANDIN)
    if config and (config["OCIv1"]["config"].get("Labels") or {}).get(RECIPE_LABEL) == recipe:
        return
    require("mmdebstrap", "it lays out the stand-in Python base from Debian's packages")
    directory = CACHE / "python-standin"
    directory.mkdir(parents=True, exist_ok=True)
    rootfs = directory / "rootfs.tar"
    try:
        run(*mmdebstrap_argv(rootfs, sources))
    except BuildError as error:
        if APT_UNREACHABLE.search(str(error)):
            raise Unavailable(f"Debian's mirror cannot be reached (mmdebstrap): {error}") from error
        raise
    (directory / "Containerfile").write_text(STANDIN_CONTAINERFILE)
    try:
        buildah("build", "--label", f"{RECIPE_LABEL}={recipe}", "-t", STANDIN, "-f",
                str(directory / "Containerfile"), str(directory))
    finally:
        rootfs.unlink(missing_ok=True)  # the image holds it


# --- The project's images ----------------------------------------------------------------------------

def project_build_argv(image: str, name: str, ca_bundle: Path = CA_BUNDLE) -> list[str]:
    """buildah's command for the project image `image`, named `name`: its own Dockerfile on the
    stand-in, the repository as the context, the layer cache, and the host's network for pip. The RUN
    steps trust what this machine trusts: its CA bundle (Debian's pip reads that path) is mounted over
    the image's while they run, and is not in the image; a proxy that inspects TLS on the way to PyPI
    signs with a CA only the machine has."""
    trust = ["--volume", f"{ca_bundle}:{ca_bundle}:ro"] if ca_bundle.is_file() else []
    return [
        *BUILD, "--network", "host", *trust, "--build-arg", f"BASE_IMAGE={STANDIN}",
        "-f", str(ROOT / image / "Dockerfile"), "-t", name, str(ROOT),
    ]


@dataclasses.dataclass(frozen=True)
class ProjectImage:
    """One of the project's images (infra.images), from its own Dockerfile on the stand-in, named as the
    rendered stack names it."""

    key: str  # its directory, and its name in infra.images
    entry_module: str  # what its entry point runs (the real node's test imports it in the image)
    role: str = PROJECT

    def name(self, inputs: Inputs) -> str:
        return qualified(image_ref(self.key))

    def build(self, inputs: Inputs, name: str) -> None:
        buildah(*project_build_argv(self.key, name))


# --- The pause image ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PauseSource:
    directory: Path  # build/pause of the k8s.io/kubernetes module
    tag: str  # its Makefile's TAG: the image's tag upstream
    cflags: tuple[str, ...]  # its Makefile's CFLAGS, with TAG and REV


def pause_source(module_dir: Path, kubernetes_version: str) -> PauseSource:
    """Upstream's pause build, read from its Makefile. Its REV (`git describe --contains` of the
    release's commit) is the release tag, since the module is that release's tree."""
    directory = module_dir / PAUSE_DIR
    makefile = directory / "Makefile"
    if not (directory / "linux" / "pause.c").is_file() or not makefile.is_file():
        raise BuildError(
            f"k8s.io/kubernetes {kubernetes_version} has no {PAUSE_DIR}/linux/pause.c and Makefile")
    text = makefile.read_text()
    tag = re.search(r"^TAG \?= (\S+)$", text, re.MULTILINE)
    cflags = re.search(r"^CFLAGS = (.+)$", text, re.MULTILINE)
    if not tag or not cflags:
        raise BuildError(
            f"{makefile} no longer sets TAG and CFLAGS as tools/control_plane/nodes/images.py reads them")
    flags = cflags.group(1).replace("$(TAG)", tag.group(1)).replace("$(REV)", kubernetes_version)
    return PauseSource(directory, tag.group(1), tuple(flags.split()))


def pause_name(source: PauseSource) -> str:
    return f"{PAUSE_REPOSITORY}:{source.tag}"


def kubernetes_source() -> tuple[Path, str]:
    version = build.served_version(build.KUBERNETES, components.pins().kubernetes)
    return Path(build.download(build.KUBERNETES, version)["Dir"]), version


@dataclasses.dataclass(frozen=True)
class PauseImage:
    """The sandboxes' pause, Kubernetes' own, named as upstream names it."""

    key: str = "pause"
    role: str = NODE

    def name(self, inputs: Inputs) -> str:
        return pause_name(inputs.pause)

    def build(self, inputs: Inputs, name: str) -> None:
        build_pause(inputs.pause)


def build_pause(source: PauseSource) -> None:
    """pause.c compiled (statically, upstream's flags, stripped) into the context upstream's Dockerfile
    takes, bin/pause-linux-<arch>, then that Dockerfile on scratch, as its Makefile builds it."""
    gcc = require("gcc", "it compiles Kubernetes' pause.c for the sandboxes' pause image")
    arch = build.go("env", "GOARCH").strip()
    context = CACHE / "pause"
    binary = context / "bin" / f"pause-linux-{arch}"
    stamp = binary.with_suffix(".flags")
    source_file = source.directory / "linux" / "pause.c"
    recipe = json.dumps([source.cflags, hashlib.sha256(source_file.read_bytes()).hexdigest()])
    if not binary.is_file() or not stamp.is_file() or stamp.read_text() != recipe:
        binary.parent.mkdir(parents=True, exist_ok=True)
        run(gcc, *source.cflags, "-o", str(binary), str(source_file))
        run("strip", str(binary))
        stamp.write_text(recipe)
    buildah(*BUILD, "--build-arg", "BASE=scratch", "--build-arg", f"ARCH={arch}",
            "-f", str(source.directory / "Dockerfile"), "-t", pause_name(source), str(context))


# --- The local-path helper image -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HelperImage:
    """The image of local-path-provisioner's helper pods, named as its install names it."""

    key: str = "busybox"
    role: str = NODE

    def name(self, inputs: Inputs) -> str:
        return HELPER_IMAGE

    def build(self, inputs: Inputs, name: str) -> None:
        build_helper()


def build_helper() -> None:
    """A scratch image of busybox-static and a link per applet (busybox --list) in /bin."""
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Status}", BUSYBOX_PACKAGE], capture_output=True,
                               text=True).stdout
    if installed != "install ok installed" or not BUSYBOX.is_file():
        raise Unavailable(f"Debian's {BUSYBOX_PACKAGE} is not installed (apt-get install {BUSYBOX_PACKAGE}): "
                          f"the local-path helper image is its {BUSYBOX}")
    context = CACHE / "busybox"
    bin_dir = context / "rootfs" / "bin"
    if bin_dir.exists():
        shutil.rmtree(bin_dir)
    bin_dir.mkdir(parents=True)
    shutil.copy2(BUSYBOX, bin_dir / "busybox")
    for applet in run(str(BUSYBOX), "--list").split():
        if applet != "busybox":
            (bin_dir / applet).symlink_to("busybox")
    (context / "Containerfile").write_text(HELPER_CONTAINERFILE)
    buildah(*BUILD, "-t", HELPER_IMAGE, "-f", str(context / "Containerfile"), str(context))


# --- Upstream programs' images: the platform's controllers, Argo's executor, KServe's agent -------------

@dataclasses.dataclass(frozen=True)
class ProgramImage:
    """One program of the tier's Go build in a scratch image, laid out as its upstream Dockerfile lays it
    out on distroless static (its path, its numeric user, which the kubelet checks under runAsNonRoot),
    named as the stack's manifests name it. Built after the Go build that makes the program."""

    reference: str  # as the platform's manifests name it: {pinned} the stack's version, {bare} without v
    component: str  # of tools.control_plane.components
    program: str  # the program's name (the last element of its main package)
    path: str  # where upstream's Dockerfile puts it
    user: int  # upstream's USER (distroless' `nonroot` is 65532)
    role: str = PLATFORM

    @property
    def key(self) -> str:
        return split_tag(self.reference)[0].rpartition("/")[2]

    def name(self, inputs: Inputs) -> str:
        pinned = inputs.programs[self.component].pinned
        return qualified(self.reference.format(pinned=pinned, bare=pinned.removeprefix("v")))

    def build(self, inputs: Inputs, name: str) -> None:
        component = inputs.programs[self.component]
        (binary,) = [path for package, path in component.binaries.items()
                     if build.program_name(component.name, package) == self.program]
        build_program_image(self, name, Path(binary))


NONROOT = 65532
ARGO_USER = 8737  # Argo's Dockerfile: USER 8737
PROGRAM_CONTAINERFILE = """\
FROM scratch
COPY rootfs/ /
ENV PATH=/bin:{directory}
USER {user}
ENTRYPOINT ["{path}"]
"""


def build_program_image(image: ProgramImage, name: str, binary: Path) -> None:
    """`binary` at its upstream path in a scratch image, with what distroless gives its programs: a /tmp
    they may write to, and /etc/passwd and /etc/group naming their user."""
    context = CACHE / "programs" / re.sub(r"[^a-z0-9.-]+", "-", name)
    rootfs = context / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    target = rootfs / image.path.lstrip("/")
    target.parent.mkdir(parents=True)
    (rootfs / "tmp").mkdir(exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    (rootfs / "etc").mkdir(exist_ok=True)
    (rootfs / "etc" / "passwd").write_text(f"root:x:0:0:root:/root:/sbin/nologin\n"
                                           f"nonroot:x:{image.user}:{image.user}:nonroot:/home/nonroot:/sbin/nologin\n")
    (rootfs / "etc" / "group").write_text(f"root:x:0:\nnonroot:x:{image.user}:\n")
    shutil.copy2(binary, target)
    (context / "Containerfile").write_text(PROGRAM_CONTAINERFILE.format(
        directory=Path(image.path).parent, user=image.user, path=image.path))
    try:
        buildah(*BUILD, "-t", name, "-f", str(context / "Containerfile"), str(context))
    finally:
        shutil.rmtree(context)  # the image holds it; the next build copies the program again


# --- The table: every image of the tier's ---------------------------------------------------------------

TierImage = PauseImage | HelperImage | ProjectImage | ProgramImage
PAUSE, HELPER = PauseImage(), HelperImage()
# Every image the tier builds, one row each, in the order a pod needs them: the sandbox's pause, the
# volume's helper, the project's (infra.images.BASE_IMAGES, each with the module its entry point
# runs), then each image the platform's manifests name that a program of the tier's Go build makes,
# and where its upstream Dockerfile puts it. The manifests (Trainer's overlay, JobSet's release,
# Kueue's, KServe's and cert-manager's charts with the stack's values, KEDA's and Argo's release
# kustomizations with their tags) name exactly these: the end-to-end tier's registry holds nothing
# else, and every platform pod runs from it (tests/e2e_node/test_pulumi.py). cert-manager's are not
# here: the module proxy serves none of its programs (docs/development.md).
IMAGES: tuple[TierImage, ...] = (
    PAUSE,
    HELPER,
    ProjectImage("trainer", "trainer.train"),
    ProjectImage("serving", "serving.server"),
    ProjectImage(TRACKING_SERVER_IMAGE, "mlflow"),
    ProgramImage("registry.k8s.io/jobset/jobset:{pinned}", "jobset", "jobset", "/manager", NONROOT),
    ProgramImage("ghcr.io/kubeflow/trainer/trainer-controller-manager:{pinned}", "trainer",
                 "trainer-controller-manager", "/manager", NONROOT),
    ProgramImage("registry.k8s.io/kueue/kueue:{pinned}", "kueue", "kueue", "/manager", NONROOT),
    ProgramImage("kserve/kserve-controller:{pinned}", "kserve", "manager", "/manager", NONROOT),
    ProgramImage("quay.io/brancz/kube-rbac-proxy:{pinned}", "kube-rbac-proxy", "kube-rbac-proxy",
                 "/usr/local/bin/kube-rbac-proxy", NONROOT),
    # KServe's agent.Dockerfile: the predictor's request logger, named as KServe's chart configures it.
    ProgramImage("kserve/agent:{pinned}", "kserve-agent", "agent", "/ko-app/agent", NONROOT),
    ProgramImage("ghcr.io/kedacore/keda:{bare}", "keda", "operator", "/keda", NONROOT),
    ProgramImage("ghcr.io/kedacore/keda-metrics-apiserver:{bare}", "keda", "adapter", "/keda-adapter",
                 NONROOT),
    ProgramImage("ghcr.io/kedacore/keda-admission-webhooks:{bare}", "keda", "webhooks",
                 "/keda-admission-webhooks", NONROOT),
    # Argo's Dockerfile: its programs in /bin, on PATH (the manifests' `command: [workflow-controller]`).
    ProgramImage("quay.io/argoproj/workflow-controller:{pinned}", "argo", "workflow-controller",
                 "/bin/workflow-controller", ARGO_USER),
    ProgramImage("quay.io/argoproj/argocli:{pinned}", "argocli", "argo", "/bin/argo", ARGO_USER),
    # Target argoexec-nonroot, as the stacks' workflow-controller config names it (pipeline.argo).
    ProgramImage("quay.io/argoproj/argoexec:{pinned}-nonroot", "argoexec", "argoexec", "/bin/argoexec",
                 ARGO_USER),
)


def images_of(role: str) -> list[TierImage]:
    return [image for image in IMAGES if image.role == role]


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What the images' names and builds read besides the repository."""

    pause: PauseSource | None = None  # Kubernetes' pause build, from the module the tier builds
    programs: dict[str, build.Built] = dataclasses.field(default_factory=dict)  # the Go build's, by name


def build_rows(rows: list[TierImage], inputs: Inputs, say: Callable[[str], None]) -> list[BuiltImage]:
    ready = []
    for image in rows:
        name = image.name(inputs)
        identity = built(name, functools.partial(image.build, inputs, name), say)
        ready.append(BuiltImage(image.key, name, identity, image.role))
    return ready


def program_images(built_programs: list[build.Built], say=print) -> list[BuiltImage]:
    """The platform's images, from the static programs the tier's Go build made."""
    programs = {item.name: item for item in built_programs}
    return build_rows(images_of(PLATFORM), Inputs(programs=programs), say)


# --- The node's view and the whole -------------------------------------------------------------------------

def export_argv(name: str) -> list[str]:
    """`name` as a docker-archive carrying its name, on standard output."""
    return [require("buildah", BUILDAH_ROLE), "push", "--quiet", name, f"docker-archive:/dev/stdout:{name}"]


def beside_the_go_build() -> list[TierImage]:
    """The images built while Go builds the programs: every one but the platform's (its programs)."""
    return [image for image in IMAGES if image.role != PLATFORM]


def image_names(inputs: Inputs) -> dict[str, str]:
    """Each image's short name (what `python -m tools.control_plane.nodes.images IMAGE` takes) -> its
    name, for the images built beside the Go build, in the table's order."""
    return {image.key: image.name(inputs) for image in beside_the_go_build()}


def build_images(only: tuple[str, ...] = (), say=print) -> list[BuiltImage]:
    """Builds the images built beside the Go build (all, or those `only` names), each with the name the
    kubelet asks for and its ID. Raises Unavailable for what this machine lacks, BuildError for a build
    that failed."""
    require("buildah", BUILDAH_ROLE)
    inputs = Inputs(pause=pause_source(*kubernetes_source()))
    known = [image.key for image in beside_the_go_build()]
    unknown = sorted(set(only) - set(known))
    if unknown:
        raise BuildError(f"no such image: {', '.join(unknown)} (the images: {', '.join(known)})")
    chosen = [image for image in beside_the_go_build() if not only or image.key in only]
    if any(image.role == PROJECT for image in chosen):
        check_pypi()
        built(STANDIN, build_standin, say)
    return build_rows(chosen, inputs, say)


# --- The manifest ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ImageManifest:
    """The images of the manifest (MANIFEST): what build_images and program_images built."""

    built: list[BuiltImage]

    def of(self, role: str) -> list[BuiltImage]:
        return [image for image in self.built if image.role == role]

    def name_of(self, image: TierImage) -> str:
        (name,) = [built.name for built in self.built if built.key == image.key]
        return name

    @property
    def pause(self) -> str:
        return self.name_of(PAUSE)

    @property
    def helper(self) -> str:
        return self.name_of(HELPER)


def write_manifest(built: list[BuiltImage]) -> None:
    MANIFEST.write_text(json.dumps([dataclasses.asdict(image) for image in built], indent=2))


def read_manifest() -> ImageManifest | None:
    if not MANIFEST.is_file():
        return None
    return ImageManifest([BuiltImage(**image) for image in json.loads(MANIFEST.read_text())])


# --- Pruning: buildah's storage keeps only what some checkout's last run named ----------------------------

# Each checkout's names of its last complete run (write_in_use), one file per checkout on the machine,
# which a prune from any checkout keeps.
IN_USE = CACHE / "in-use"


def in_use_record(checkout: Path) -> Path:
    return IN_USE / f"{hashlib.sha256(str(checkout).encode()).hexdigest()[:16]}.json"


def write_in_use(names: list[str], checkout: Path = ROOT) -> None:
    IN_USE.mkdir(parents=True, exist_ok=True)
    in_use_record(checkout).write_text(json.dumps({"checkout": str(checkout), "images": names}, indent=2))


def names_in_use() -> set[str]:
    """The names some checkout on the machine uses (a checkout gone, its record goes too), and the
    stand-in the project's images build on."""
    names = {STANDIN}
    for record in sorted(IN_USE.glob("*.json")) if IN_USE.is_dir() else []:
        kept = json.loads(record.read_text())
        if Path(kept["checkout"]).is_dir():
            names.update(kept["images"])
        else:
            record.unlink()
    return names


@dataclasses.dataclass(frozen=True)
class StoredImage:
    """An image in buildah's storage, as `buildah images --json` lists it (intermediate images, the
    layer cache of the tagged ones, are not listed)."""

    id: str
    names: tuple[str, ...]
    created: int  # seconds since the epoch


def stored_images() -> list[StoredImage]:
    return [StoredImage(image["id"], tuple(image.get("names") or ()), image["created"])
            for image in json.loads(buildah("images", "--json") or "[]")]


def stale(stored: list[StoredImage], in_use: set[str], now: float) -> list[str]:
    """What a prune removes (by name, or by ID when it has none): each name of the tier's repositories
    (those of `in_use`) that is not in use, and each image without a name (an image whose name went to
    a newer build). An image built less than a build's longest time ago is kept whatever it is named: it
    may be a running build's, not yet in its checkout's record."""
    repositories = {split_tag(name)[0] for name in in_use}
    removed = []
    for image in stored:
        if now - image.created < BUILDAH_TIMEOUT_SECONDS:
            continue
        if not image.names:
            removed.append(image.id)
        removed += [name for name in image.names if split_tag(name)[0] in repositories and name not in in_use]
    return removed


def storage_root() -> Path:
    return Path(json.loads(buildah("info"))["store"]["GraphRoot"])


def prune(say: Callable[[str], None] = print) -> None:
    """Removes from buildah's storage what no checkout uses (stale), each image with the layers only it
    held (`buildah rmi` takes its untagged parents too); says what went and the bytes freed."""
    candidates = stale(stored_images(), names_in_use(), time.time())
    if not candidates:
        say("images: pruned nothing: buildah's storage holds only images a checkout uses")
        return
    before = build.disk_bytes(storage_root())
    kept = {}  # one at a time: one that will not go (a container of it, say) keeps no other
    for image in candidates:
        done = subprocess.run([require("buildah", BUILDAH_ROLE), "rmi", image], capture_output=True,
                              text=True)
        if done.returncode != 0:
            kept[image] = done.stderr.strip()
    freed = before - build.disk_bytes(storage_root())
    removed = [image for image in candidates if image not in kept]
    said = "".join(f"; kept {image}: {reason}" for image, reason in kept.items())
    say(f"images: pruned {len(removed)} images no checkout uses from buildah's storage, "
        f"{build.shown_bytes(freed)} freed: {', '.join(removed)}{said}")


def main(argv: list[str]) -> int:
    started = time.monotonic()
    try:
        ready = build_images(tuple(argv))
    except Unavailable as missing:
        print(f"images: cannot build the tier's images: {missing}", file=sys.stderr)
        return 1 if in_ci() else 0
    except (BuildError, components.PinError) as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    for image in ready:
        print(f"images: {image.name} ({image.image_id[:12]})")
    print(f"images: {len(ready)} images ready in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
