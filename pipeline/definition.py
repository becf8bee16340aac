"""The pipeline as data: ingest -> train-<variant> (in parallel) -> select -> serve -> rollout.

Both engines read these steps: the local engine runs each as processes under a local directory, the
Argo renderer turns each into a template whose pods see the same layout under the volume's mount.
Each step says what it is (`StepKind`), and each engine maps a kind to how it runs or renders it, so
a step is never taken for something else because of its name. `build_steps` orders the steps by
their dependencies (graphlib): a cycle, a dependency on no step or a name used twice is an error
here, before any engine sees the pipeline.
"""

from __future__ import annotations

import dataclasses
import enum
import graphlib
import hashlib
import json
import posixpath
from typing import Iterable, Mapping

from common.cluster_names import train_step_name
from pipeline.config import PipelineConfig, Resources
from trainer.dataset_files import OFFICIAL_MD5

TRAINER_IMAGE = "trainer"
SERVING_IMAGE = "serving"

INGEST = "ingest"
SELECT = "select"
SERVE = "serve"
ROLLOUT = "rollout"



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


class PipelineError(ValueError):
    """The steps do not make a pipeline (a cycle, an unknown dependency or kind); names the step."""


class StepKind(enum.Enum):
    """What a step is, whatever its name: each engine has one handler per kind (argo.TEMPLATES,
    local.HANDLERS)."""
    INGEST = "ingest"  # fetches and verifies the dataset
    TRAIN = "train"  # trains one variant on distributed workers
    SELECT = "select"  # evaluates the trained variants, publishes the best
    SERVE = "serve"  # serves the published model (a canary beside the stable version)
    ROLLOUT = "rollout"  # promotes the canary or rolls it back, on the server's metrics


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    kind: StepKind
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
    # Beside the `replicas` workers, a chief and this many parameter servers (TFJob Chief, PS).
    parameter_servers: int = 0
    memoize: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.kind, StepKind):
            raise PipelineError(f"step {self.name}: kind {self.kind!r} is not a StepKind "
                                f"({', '.join(kind.value for kind in StepKind)})")

    @property
    def command(self) -> list[str]:
        return ["python", "-m", self.module, *self.args]


def in_dependency_order(steps: Iterable[Step]) -> list[Step]:
    """`steps` ordered so that each comes after what it depends on; among steps free to go, the order
    they were given in (so renders are stable). A cycle, an unknown dependency or a name used twice
    is a PipelineError."""
    by_name: dict[str, Step] = {}
    for step in steps:
        if step.name in by_name:
            raise PipelineError(f"step {step.name}: defined twice")
        by_name[step.name] = step
    position = {name: index for index, name in enumerate(by_name)}
    for step in by_name.values():
        for name in step.depends:
            if name not in by_name:
                raise PipelineError(f"step {step.name}: depends on {name!r}, which is no step")
    sorter = graphlib.TopologicalSorter({step.name: step.depends for step in by_name.values()})
    try:
        sorter.prepare()
    except graphlib.CycleError as error:
        raise PipelineError(f"steps form a cycle: {' -> '.join(error.args[1])}") from None
    ordered: list[Step] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=position.__getitem__)
        ordered.extend(by_name[name] for name in ready)
        sorter.done(*ready)
    return ordered


def require_handlers(steps: Iterable[Step], handlers: Mapping[StepKind, object], engine: str) -> None:
    """A PipelineError naming the first step whose kind `engine` has no handler for."""
    for step in steps:
        if step.kind not in handlers:
            raise PipelineError(f"step {step.name}: the {engine} engine cannot run kind "
                                f"{step.kind.value!r}; give it a handler")


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


def rollout_flags(config: PipelineConfig) -> list[str]:
    """The canary's decision policy (`pipeline.rollout`) as flags of `cluster_steps.release decide`."""
    rollout = config.rollout
    return ["--min-requests", str(rollout.min_requests),
            "--max-wait-seconds", str(rollout.max_wait_seconds),
            "--max-error-rate-increase", f"{rollout.max_error_rate_increase:g}",
            "--max-latency-ratio", f"{rollout.max_latency_ratio:g}"]


def ingest_step(config: PipelineConfig, layout: Layout) -> Step:
    args = ["--source", config.data_source, "--out", layout.data]
    if config.fallback_data_source:
        args += ["--fallback-source", config.fallback_data_source]
    return Step(name=INGEST, kind=StepKind.INGEST, image=TRAINER_IMAGE, module="trainer.ingest",
                args=tuple(args), inputs=(), outputs=(layout.data,), depends=(),
                resources=config.step_resources, retries=config.retries, memoize=True)


def train_step(config: PipelineConfig, layout: Layout, variant: str) -> Step:
    args = ["--model", variant, "--data-dir", layout.data,
            "--checkpoint-dir", layout.checkpoints(variant), "--export-dir", layout.export(variant),
            "--batch-size-per-replica", str(config.batch_size_per_replica),
            "--mixed-precision", config.mixed_precision]
    if config.epochs is not None:
        args += ["--epochs", str(config.epochs)]
    if config.steps_per_epoch is not None:
        args += ["--steps-per-epoch", str(config.steps_per_epoch)]
    return Step(name=train_step_name(variant), kind=StepKind.TRAIN, image=TRAINER_IMAGE,
                module="trainer.train", args=tuple(args), inputs=(layout.data,),
                outputs=(layout.checkpoints(variant), layout.export(variant)), depends=(INGEST,),
                resources=config.trainer_resources, retries=config.retries,
                replicas=config.workers, distributed=True,
                parameter_servers=config.parameter_servers_of(variant), memoize=True)


def select_step(config: PipelineConfig, layout: Layout) -> Step:
    exports = [layout.export(variant) for variant in config.variants]
    args = ["--candidates", *exports, "--data-dir", layout.data, "--model-repo", layout.models,
            "--model-name", config.model_name, "--releases-dir", layout.releases,
            "--min-improvement", f"{config.promotion.min_improvement:g}"]
    return Step(name=SELECT, kind=StepKind.SELECT, image=TRAINER_IMAGE, module="trainer.select",
                args=tuple(args), inputs=(layout.data, *exports), outputs=(layout.models, layout.releases),
                depends=tuple(train_step_name(v) for v in config.variants),
                resources=config.step_resources, retries=config.retries, memoize=True)


def serve_step(config: PipelineConfig, layout: Layout) -> Step:
    return Step(name=SERVE, kind=StepKind.SERVE, image=SERVING_IMAGE, module="serving.server",
                args=tuple(serve_args(config, layout.models)), inputs=(layout.models,), outputs=(),
                depends=(SELECT,), resources=config.serving.resources, retries=config.retries)


def rollout_step(config: PipelineConfig, layout: Layout) -> Step:
    """After serve: the canary's evidence decides; the served versions (rollout state) change."""
    return Step(name=ROLLOUT, kind=StepKind.ROLLOUT, image=SERVING_IMAGE, module="cluster_steps.release",
                args=("decide", *rollout_flags(config)), inputs=(layout.models,), outputs=(layout.models,),
                depends=(SERVE,), resources=config.step_resources, retries=config.retries)


def build_steps(config: PipelineConfig, root: str) -> list[Step]:
    """Every step in dependency order, its paths under `root`."""
    layout = Layout(root)
    return in_dependency_order([ingest_step(config, layout),
                                *(train_step(config, layout, variant) for variant in config.variants),
                                select_step(config, layout),
                                serve_step(config, layout),
                                rollout_step(config, layout)])
