"""An Artifact Registry repository, and the trainer and serving images built and pushed to it; pods
use them by digest, so what runs is exactly what was pushed."""

from __future__ import annotations

import dataclasses
import shlex

import pulumi
import pulumi_gcp as gcp
from pulumi_command import local

from infra.images import IMAGE_INPUTS, REPO_ROOT, content_tag
from pipeline.manifests import Images

REPOSITORY_ID = "dist-ml"
# The pushed image's digest: what `docker push` registered, as REPOSITORY@sha256:...
DIGEST_OF = "docker inspect --format '{{index .RepoDigests 0}}' \"$IMAGE\""
# What GKE's nodes run (the e2, n1 and g2 machine types are x86): set, not left to the builder's
# machine, since an image built on an ARM laptop would not start on them ("exec format error").
IMAGE_PLATFORM = "linux/amd64"


@dataclasses.dataclass(frozen=True)
class RegistryImagesArgs:
    project: str
    region: str


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
        digests = {}
        for image, inputs in IMAGE_INPUTS.items():
            ref = f"{host}/{args.project}/{REPOSITORY_ID}/{image}:{content_tag(inputs)}"
            steps = [shlex.join(["gcloud", "auth", "configure-docker", host, "--quiet"]),
                     shlex.join(["docker", "build", "--platform", IMAGE_PLATFORM, "-f", f"{image}/Dockerfile",
                                 "-t", ref, "."]),
                     shlex.join(["docker", "push", "--quiet", ref]) + " >&2",
                     DIGEST_OF]
            push = local.Command(
                f"{name}-{image}", create=" && ".join(steps), dir=str(REPO_ROOT),
                # The platform too: an image pushed before it was set may be for another one.
                environment={"IMAGE": ref}, triggers=[ref, IMAGE_PLATFORM],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[repository]))
            digests[image] = push.stdout.apply(str.strip)
        self.images = pulumi.Output.all(digests["trainer"], digests["serving"]).apply(
            lambda refs: Images(trainer=refs[0], serving=refs[1]))
        self.register_outputs({"repository": repository.name, "trainer": digests["trainer"],
                               "serving": digests["serving"]})
