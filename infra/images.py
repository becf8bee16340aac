"""The trainer and serving images (and, for training pools with GPUs, the GPU trainer image), built
with pulumi-docker-build (BuildKit: its cache, the image's digest) and imported into the k3d cluster.

Each image is tagged with a digest of what goes into it, so a code change is a new tag: the pods'
specs change and roll, and an unchanged tree rebuilds nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from pathlib import Path

import pulumi
import pulumi_docker_build as docker_build
from pulumi_command import local

from common.cluster_target import Images

REPO_ROOT = Path(__file__).resolve().parents[1]
# The trainer with TensorFlow's CUDA libraries (gigabytes more), for training pods given GPUs: only
# a stack whose training pool has GPUs builds it (k3d never does).
GPU_TRAINER_IMAGE = "trainer-gpu"
TRACKING_SERVER_IMAGE = "tracking-server"  # MLflow's server (infra/tracking.py)
# What each image's Dockerfile (<image>/Dockerfile) copies in.
IMAGE_INPUTS = {
    "trainer": ("trainer/Dockerfile", "requirements/trainer.txt", "common", "trainer"),
    "serving": ("serving/Dockerfile", "requirements/serving.txt", "common", "trainer", "serving",
                "engines", "cluster_steps"),
    GPU_TRAINER_IMAGE: ("trainer-gpu/Dockerfile", "requirements/trainer-gpu.txt", "common", "trainer"),
    TRACKING_SERVER_IMAGE: ("tracking-server/Dockerfile", "requirements/tracking-server.txt"),
}
# What every stack builds.
BASE_IMAGES = ("trainer", "serving", TRACKING_SERVER_IMAGE)
IMAGE_REPOSITORY = "dist-ml/{image}"
BASE_IMAGE_ARG = "BASE_IMAGE"  # every Dockerfile's base (default python:3.11-slim)


def content_tag(paths: tuple[str, ...], root: Path = REPO_ROOT) -> str:
    """A digest of the files under `paths` (names and bytes; caches excluded)."""
    digest = hashlib.sha256()
    for top in paths:
        files = [root / top] if (root / top).is_file() else sorted((root / top).rglob("*"))
        for path in files:
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def image_ref(image: str) -> str:
    return f"{IMAGE_REPOSITORY.format(image=image)}:{content_tag(IMAGE_INPUTS[image])}"


@dataclasses.dataclass(frozen=True)
class LocalImagesArgs:
    cluster_name: str
    cluster: pulumi.Resource  # the images are imported into it once it exists
    cluster_id: pulumi.Input[str]  # a new cluster has none of the images: they are imported again
    base_image: str | None = None  # the Dockerfiles' BASE_IMAGE; None: their default, python:3.11-slim


def image_build(name: str, image: str, tags: list[str], opts: pulumi.ResourceOptions,
                base_image: str | None = None, **settings: object) -> docker_build.Image:
    """A BuildKit build of `image`'s Dockerfile with the repository as its context, on `base_image`
    when one is named (else the Dockerfile's own). Not on preview: a PR check's `pulumi preview` would
    build TensorFlow images to show a digest."""
    if base_image is not None:
        settings["build_args"] = {BASE_IMAGE_ARG: base_image}
    return docker_build.Image(
        name, context={"location": str(REPO_ROOT)},
        dockerfile={"location": str(REPO_ROOT / image / "Dockerfile")}, tags=tags, build_on_preview=False,
        opts=opts, **settings)


class LocalImages(pulumi.ComponentResource):
    """Each image built into the local Docker engine, then `k3d image import`ed; pods use them with
    IfNotPresent."""

    images: Images
    imported: list[pulumi.Resource]  # what pods that run these images must depend on

    def __init__(self, name: str, args: LocalImagesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:LocalImages", name, None, opts)
        refs = {image: image_ref(image) for image in BASE_IMAGES}
        self.imported = []
        for image, ref in refs.items():
            build = image_build(f"{name}-{image}-build", image, [ref], pulumi.ResourceOptions(parent=self),
                                args.base_image, push=False, load=True)
            self.imported.append(local.Command(
                f"{name}-{image}",
                create=shlex.join(["k3d", "image", "import", ref, "--cluster", args.cluster_name]),
                # Again when the image changes, and into every new cluster.
                triggers=[build.digest, args.cluster_id],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[args.cluster, build]),
            ))
        self.images = Images(trainer=refs["trainer"], serving=refs["serving"],
                             tracking_server=refs[TRACKING_SERVER_IMAGE])
        self.register_outputs({"trainer": refs["trainer"], "serving": refs["serving"],
                               "tracking_server": refs[TRACKING_SERVER_IMAGE]})


@dataclasses.dataclass(frozen=True)
class PushedImagesArgs:
    registry: str  # host[:port][/path]
    images: tuple[str, ...]  # which of IMAGE_INPUTS
    base_image: str | None = None  # the Dockerfiles' BASE_IMAGE; None: their default, python:3.11-slim


class PushedImages(pulumi.ComponentResource):
    """Each image built (BuildKit) and pushed to a registry the cluster pulls from, with the credentials
    `docker login` stored; pods run them by digest, so what runs is exactly what was pushed."""

    images: pulumi.Output[Images]

    def __init__(self, name: str, args: PushedImagesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:PushedImages", name, None, opts)
        refs = {}
        for image in args.images:
            tag = f"{args.registry.rstrip('/')}/{image_ref(image)}"
            refs[image] = image_build(f"{name}-{image}", image, [tag], pulumi.ResourceOptions(parent=self),
                                      args.base_image, push=True).ref  # the tag with the pushed digest
        self.images = pulumi.Output.all(**refs).apply(lambda pushed: Images(
            trainer=pushed["trainer"], serving=pushed["serving"],
            tracking_server=pushed[TRACKING_SERVER_IMAGE]))
        self.register_outputs({image: ref for image, ref in refs.items()})
