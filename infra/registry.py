"""An Artifact Registry repository, and the trainer and serving images (and the GPU trainer image when
training runs on GPUs) built (pulumi-docker-build) and pushed to it; pods use them by digest, so what
runs is exactly what was pushed."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_gcp as gcp

from common.cluster_target import Images
from infra.images import (
    BASE_IMAGES,
    GPU_TRAINER_IMAGE,
    IMAGE_INPUTS,
    TRACKING_SERVER_IMAGE,
    content_tag,
    image_build,
)

REPOSITORY_ID = "dist-ml"
# Artifact Registry takes a Google access token as the password of this user.
TOKEN_USER = "oauth2accesstoken"
# What GKE's nodes run (the e2, n1 and g2 machine types are x86): set, not left to the builder's
# machine, since an image built on an ARM laptop would not start on them ("exec format error").
IMAGE_PLATFORM = "linux/amd64"


@dataclasses.dataclass(frozen=True)
class RegistryImagesArgs:
    project: str
    region: str
    gpu_training: bool = False  # training pods are given GPUs: build the GPU trainer image too
    base_image: str | None = None  # the Dockerfiles' BASE_IMAGE; None: their default, python:3.11-slim


class RegistryImages(pulumi.ComponentResource):
    images: pulumi.Output[Images]
    repository: gcp.artifactregistry.Repository

    def __init__(self, name: str, args: RegistryImagesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:RegistryImages", name, None, opts)
        repository = gcp.artifactregistry.Repository(
            f"{name}-repository", project=args.project, location=args.region,
            repository_id=REPOSITORY_ID, format="DOCKER",
            description="dist-ml trainer and serving images", opts=pulumi.ResourceOptions(parent=self))
        self.repository = repository
        host = f"{args.region}-docker.pkg.dev"
        # The credentials Pulumi's Google provider runs with (gcloud's application default).
        registry = {"address": host, "username": TOKEN_USER,
                    "password": gcp.organizations.get_client_config_output().access_token}
        refs = {}
        for image in (*BASE_IMAGES, *([GPU_TRAINER_IMAGE] if args.gpu_training else [])):
            tag = f"{host}/{args.project}/{REPOSITORY_ID}/{image}:{content_tag(IMAGE_INPUTS[image])}"
            pushed = image_build(f"{name}-{image}", image, [tag],
                                 pulumi.ResourceOptions(parent=self, depends_on=[repository]),
                                 args.base_image, platforms=[IMAGE_PLATFORM], push=True,
                                 registries=[registry])
            refs[image] = pushed.ref  # the tag with the pushed digest: <tag>@sha256:...
        self.images = pulumi.Output.all(**refs).apply(lambda pushed: Images(
            trainer=pushed["trainer"], serving=pushed["serving"], trainer_gpu=pushed.get(GPU_TRAINER_IMAGE),
            tracking_server=pushed[TRACKING_SERVER_IMAGE]))
        self.register_outputs({"repository": repository.name, **refs})
