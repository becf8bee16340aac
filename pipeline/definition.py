"""The pipeline as data: ingest -> train-<variant> (in parallel) -> select -> serve.

Both engines read these steps: the local engine runs each as processes under a local directory, the
Argo renderer turns each into a template whose pods see the same layout under the volume's mount.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath

from pipeline.config import PipelineConfig, Resources
from trainer.fashion_mnist import OFFICIAL_MD5

TRAINER_IMAGE = "trainer"
SERVING_IMAGE = "serving"

INGEST = "ingest"
SELECT = "select"
SERVE = "serve"
TRAIN_PREFIX = "train-"

# Where every pod mounts the storage volume, on every cluster: the steps' paths are under it.
CLUSTER_STORAGE_ROOT = "/mnt/dist-ml"


@dataclasses.dataclass(frozen=True)
class Layout:
    """The paths of the pipeline's data under one storage root."""
    root: str

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    @property
    def data(self) -> str:
        return self.path("data")

    @property
    def models(self) -> str:
        return self.path("models")

    @property
    def releases(self) -> str:
        """Each published version alone, `<name>/<N>/<N>/`: `<name>/<N>` is a storageUri."""
        return self.path("releases")

    def checkpoints(self, variant: str) -> str:
        return self.path("checkpoints", variant)

    def export(self, variant: str) -> str:
        return self.path("exports", variant)


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    image: str  # TRAINER_IMAGE or SERVING_IMAGE
    module: str  # run as `python -m module *args`
    args: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    depends: tuple[str, ...]
    resources: Resources
    retries: int
    replicas: int = 1
    distributed: bool = False  # replicas get TF_CONFIG, as TFJob workers do
    memoize: bool = False

    @property
    def command(self) -> list[str]:
        return ["python", "-m", self.module, *self.args]


def train_step_name(variant: str) -> str:
    """`train-cnn-dropout`: step, template and TFJob names must be DNS labels (no underscores)."""
    return TRAIN_PREFIX + variant.replace("_", "-")


def ingest_memo_key(config: PipelineConfig) -> str:
    """The data source(s) and the dataset's published checksums: a new source or checksum re-ingests."""
    identity = json.dumps({"source": config.data_source, "fallback": config.fallback_data_source,
                           "checksums": OFFICIAL_MD5}, sort_keys=True)
    return "ingest-" + hashlib.sha256(identity.encode()).hexdigest()[:16]


def serving_flags(config: PipelineConfig) -> list[str]:
    """The flags of `serving.server` for this config, other than where the model is."""
    serving = config.serving
    return ["--model-name", config.model_name, "--max-batch-size", str(serving.max_batch_size),
            "--max-batch-wait-ms", f"{serving.max_batch_wait_ms:g}"]


def serve_args(config: PipelineConfig, model_repo: str) -> list[str]:
    """The flags of `serving.server` for this config, serving from `model_repo`."""
    return ["--model-repo", model_repo, *serving_flags(config)]


def ingest_step(config: PipelineConfig, layout: Layout) -> Step:
    args = ["--source", config.data_source, "--out", layout.data]
    if config.fallback_data_source:
        args += ["--fallback-source", config.fallback_data_source]
    return Step(name=INGEST, image=TRAINER_IMAGE, module="trainer.ingest", args=tuple(args),
                inputs=(), outputs=(layout.data,), depends=(), resources=config.step_resources,
                retries=config.retries, memoize=True)


def train_step(config: PipelineConfig, layout: Layout, variant: str) -> Step:
    args = ["--model", variant, "--data-dir", layout.data,
            "--checkpoint-dir", layout.checkpoints(variant), "--export-dir", layout.export(variant),
            "--batch-size-per-replica", str(config.batch_size_per_replica)]
    if config.epochs is not None:
        args += ["--epochs", str(config.epochs)]
    if config.steps_per_epoch is not None:
        args += ["--steps-per-epoch", str(config.steps_per_epoch)]
    return Step(name=train_step_name(variant), image=TRAINER_IMAGE, module="trainer.train",
                args=tuple(args), inputs=(layout.data,),
                outputs=(layout.checkpoints(variant), layout.export(variant)), depends=(INGEST,),
                resources=config.trainer_resources, retries=config.retries,
                replicas=config.workers, distributed=True, memoize=True)


def select_step(config: PipelineConfig, layout: Layout) -> Step:
    exports = [layout.export(variant) for variant in config.variants]
    args = ["--candidates", *exports, "--data-dir", layout.data, "--model-repo", layout.models,
            "--model-name", config.model_name, "--releases-dir", layout.releases]
    return Step(name=SELECT, image=TRAINER_IMAGE, module="trainer.select", args=tuple(args),
                inputs=(layout.data, *exports), outputs=(layout.models, layout.releases),
                depends=tuple(train_step_name(v) for v in config.variants),
                resources=config.step_resources, retries=config.retries, memoize=True)


def serve_step(config: PipelineConfig, layout: Layout) -> Step:
    return Step(name=SERVE, image=SERVING_IMAGE, module="serving.server",
                args=tuple(serve_args(config, layout.models)), inputs=(layout.models,), outputs=(),
                depends=(SELECT,), resources=config.serving.resources, retries=config.retries)


def build_steps(config: PipelineConfig, root: str) -> list[Step]:
    """Every step in dependency order, its paths under `root`."""
    layout = Layout(root)
    return [ingest_step(config, layout),
            *(train_step(config, layout, variant) for variant in config.variants),
            select_step(config, layout),
            serve_step(config, layout)]
