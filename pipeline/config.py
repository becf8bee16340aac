"""The pipeline's settings: one typed, validated object for both engines and the Pulumi stacks.

The raw form is a mapping of sections, `pipeline` and `serving`, with camelCase keys: the YAML file of
`python -m pipeline run --config FILE` and the Pulumi stack config (`dist-ml:pipeline`,
`dist-ml:serving`) are parsed by `parse_config`, so a value means the same thing everywhere. A bad
value is a ConfigError naming the key (`pipeline.workers: ...`) before anything starts.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from trainer.fashion_mnist import OFFICIAL_MIRROR
from trainer.variants import VARIANTS

SECTIONS = ("pipeline", "serving")
RUNTIMES = ("custom", "tensorflow")
# What KServe's Standard mode scales on (HPA); concurrency and rps need Knative, which the stacks
# do not install.
SCALE_METRICS = ("cpu", "memory")
RESOURCE_NAMES = ("cpu", "memory")
# Kubernetes quantities as users write them: 500m, 1, 1.5, 2Gi, 512Mi.
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
# Go durations as Argo's memoize.maxAge takes them: 30s, 15m, 24h, 1h30m.
DURATION = re.compile(r"^(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$")
# A Kubernetes object name (DNS-1123 label).
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ConfigError(ValueError):
    """A setting is missing or wrong; the message starts with its key, e.g. `pipeline.workers`."""


@dataclasses.dataclass(frozen=True)
class Resources:
    """Kubernetes requests and limits, each {cpu, memory}."""
    requests: dict[str, str]
    limits: dict[str, str]

    def as_manifest(self) -> dict:
        return {"requests": dict(self.requests), "limits": dict(self.limits)}


DEFAULT_TRAINER_RESOURCES = Resources(requests={"cpu": "1", "memory": "2Gi"},
                                      limits={"cpu": "2", "memory": "4Gi"})
DEFAULT_SERVING_RESOURCES = Resources(requests={"cpu": "500m", "memory": "1Gi"},
                                      limits={"cpu": "1", "memory": "2Gi"})
DEFAULT_STEP_RESOURCES = Resources(requests={"cpu": "250m", "memory": "1Gi"},
                                   limits={"cpu": "1", "memory": "2Gi"})


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    runtime: str = "custom"  # our serving image; "tensorflow" is KServe's TF Serving runtime
    runtime_version: str | None = None
    min_replicas: int = 1
    max_replicas: int = 3
    scale_metric: str = "cpu"
    scale_target: int = 80
    max_batch_size: int = 32
    max_batch_wait_ms: float = 5.0
    http_port: int = 8080
    resources: Resources = DEFAULT_SERVING_RESOURCES


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    variants: tuple[str, ...] = VARIANTS
    workers: int = 2
    epochs: int | None = None  # None: the trainer's default rule
    batch_size_per_replica: int = 16
    steps_per_epoch: int | None = None  # None: one pass over the training images
    data_source: str = OFFICIAL_MIRROR
    fallback_data_source: str | None = None  # used only when data_source is unreachable
    storage_root: str = "runs/pipeline"  # the local engine's root; pods mount storage elsewhere
    model_name: str = "fmnist"
    retries: int = 2  # restarts of a failed step (TFJob backoffLimit, Argo retryStrategy.limit)
    parallelism: int | None = None  # steps at once; None: no limit, as in Argo
    memoize_max_age: str = "24h"
    service_account_name: str = "dist-ml-pipeline"
    trainer_resources: Resources = DEFAULT_TRAINER_RESOURCES
    step_resources: Resources = DEFAULT_STEP_RESOURCES  # ingest and select
    serving: ServingConfig = ServingConfig()

    @property
    def memoize_max_age_seconds(self) -> int:
        hours, minutes, seconds = (int(part or 0) for part in DURATION.match(self.memoize_max_age).groups())
        return hours * 3600 + minutes * 60 + seconds


class Section:
    """Typed reads of one section's keys; every error names `section.key`; unknown keys are errors."""

    def __init__(self, name: str, raw: Any, known: Mapping[str, str]):
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{name}: must be a mapping of settings, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ConfigError(f"{name}.{unknown[0]}: unknown setting; "
                              f"known: {', '.join(sorted(known))}")
        self.name, self.raw = name, raw

    def key(self, key: str) -> str:
        return f"{self.name}.{key}"

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.key(key)}: {problem}")

    def integer(self, key: str, default: int | None, minimum: int) -> int | None:
        value = self.raw.get(key, default)
        if value is None and default is None:
            return None
        # YAML and Pulumi may give 2.0 for 2; bool is an int in Python but never meant here.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def number(self, key: str, default: float, minimum: float) -> float:
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
            raise self.fail(key, f"must be a number >= {minimum}, got {value!r}")
        return float(value)

    def text(self, key: str, default: str | None, *, pattern: re.Pattern | None = None,
             allowed: tuple[str, ...] | None = None, what: str = "") -> str | None:
        value = self.raw.get(key, default)
        if value is None and default is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        if allowed is not None and value not in allowed:
            raise self.fail(key, f"must be one of {', '.join(allowed)}, got {value!r}")
        if pattern is not None and not pattern.match(value):
            raise self.fail(key, f"must be {what}, got {value!r}")
        return value

    def resources(self, key: str, default: Resources) -> Resources:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, Mapping) or set(value) - {"requests", "limits"}:
            raise self.fail(key, "must be a mapping with 'requests' and 'limits'")
        parsed = {}
        for kind in ("requests", "limits"):
            amounts = value.get(kind, getattr(default, kind))
            if not isinstance(amounts, Mapping) or set(amounts) != set(RESOURCE_NAMES):
                raise self.fail(f"{key}.{kind}", f"must set exactly {' and '.join(RESOURCE_NAMES)}")
            for name, amount in amounts.items():
                if not QUANTITY.match(str(amount)):
                    raise self.fail(f"{key}.{kind}.{name}",
                                    f"must be a Kubernetes quantity like 500m, 2 or 4Gi, got {amount!r}")
            parsed[kind] = {name: str(amount) for name, amount in amounts.items()}
        return Resources(**parsed)


PIPELINE_KEYS = {
    "variants": "which CNN variants to train", "workers": "worker replicas per variant",
    "epochs": "training epochs", "batchSizePerReplica": "batch size per worker",
    "stepsPerEpoch": "steps per epoch", "dataSource": "where ingest reads Fashion-MNIST",
    "fallbackDataSource": "used when dataSource is unreachable",
    "storageRoot": "the local engine's storage directory", "modelName": "the served model's name",
    "retries": "restarts of a failed step", "parallelism": "steps running at once",
    "memoizeMaxAge": "how long a memoized step stays valid",
    "serviceAccountName": "the pipeline pods' Kubernetes service account",
    "trainerResources": "requests and limits of each training worker",
    "stepResources": "requests and limits of ingest and select",
}
SERVING_KEYS = {
    "runtime": "custom or tensorflow", "runtimeVersion": "TF Serving image tag",
    "minReplicas": "fewest predictor replicas", "maxReplicas": "most predictor replicas",
    "scaleMetric": "autoscaling metric", "scaleTarget": "autoscaling target per replica",
    "maxBatchSize": "dynamic batch limit",
    "maxBatchWaitMs": "dynamic batch wait", "httpPort": "the local server's port",
    "resources": "predictor requests and limits",
}


def _variants(section: Section) -> tuple[str, ...]:
    value = section.raw.get("variants", list(VARIANTS))
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise section.fail("variants", f"must be a non-empty list of {', '.join(VARIANTS)}")
    for variant in value:
        if variant not in VARIANTS:
            raise section.fail("variants", f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if len(set(value)) != len(value):
        raise section.fail("variants", f"lists a variant twice: {list(value)}")
    return tuple(value)


def _serving(raw: Any) -> ServingConfig:
    section = Section("serving", raw, SERVING_KEYS)
    defaults = ServingConfig()
    serving = ServingConfig(
        runtime=section.text("runtime", defaults.runtime, allowed=RUNTIMES),
        runtime_version=section.text("runtimeVersion", None),
        min_replicas=section.integer("minReplicas", defaults.min_replicas, 0),
        max_replicas=section.integer("maxReplicas", defaults.max_replicas, 1),
        scale_metric=section.text("scaleMetric", defaults.scale_metric, allowed=SCALE_METRICS),
        scale_target=section.integer("scaleTarget", defaults.scale_target, 1),
        max_batch_size=section.integer("maxBatchSize", defaults.max_batch_size, 1),
        max_batch_wait_ms=section.number("maxBatchWaitMs", defaults.max_batch_wait_ms, 0),
        http_port=section.integer("httpPort", defaults.http_port, 1),
        resources=section.resources("resources", defaults.resources),
    )
    if serving.max_replicas < serving.min_replicas:
        raise section.fail("maxReplicas", f"must be >= minReplicas ({serving.min_replicas}), "
                                          f"got {serving.max_replicas}")
    if serving.runtime_version is not None and serving.runtime != "tensorflow":
        raise section.fail("runtimeVersion", "applies only to runtime 'tensorflow'")
    if serving.http_port > 65535:
        raise section.fail("httpPort", f"must be a port number 1..65535, got {serving.http_port}")
    return serving


def parse_config(raw: Mapping[str, Any] | None) -> PipelineConfig:
    """The validated config of a raw mapping {pipeline: {...}, serving: {...}}; missing keys default."""
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config: must be a mapping with sections {', '.join(SECTIONS)}")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section; known: {', '.join(SECTIONS)}")
    section = Section("pipeline", raw.get("pipeline"), PIPELINE_KEYS)
    defaults = PipelineConfig()
    return PipelineConfig(
        variants=_variants(section),
        workers=section.integer("workers", defaults.workers, 1),
        epochs=section.integer("epochs", defaults.epochs, 1),
        batch_size_per_replica=section.integer("batchSizePerReplica", defaults.batch_size_per_replica, 1),
        steps_per_epoch=section.integer("stepsPerEpoch", defaults.steps_per_epoch, 1),
        data_source=section.text("dataSource", defaults.data_source),
        fallback_data_source=section.text("fallbackDataSource", None),
        storage_root=section.text("storageRoot", defaults.storage_root),
        model_name=section.text("modelName", defaults.model_name, pattern=DNS_LABEL, what="a DNS-1123 label"),
        retries=section.integer("retries", defaults.retries, 0),
        parallelism=section.integer("parallelism", defaults.parallelism, 1),
        memoize_max_age=section.text("memoizeMaxAge", defaults.memoize_max_age, pattern=DURATION,
                                     what="a duration like 30m, 24h or 1h30m"),
        service_account_name=section.text("serviceAccountName", defaults.service_account_name,
                                          pattern=DNS_LABEL, what="a DNS-1123 label"),
        trainer_resources=section.resources("trainerResources", defaults.trainer_resources),
        step_resources=section.resources("stepResources", defaults.step_resources),
        serving=_serving(raw.get("serving")),
    )


def load_config(path: Path | None, overrides: Mapping[str, Any] | None = None) -> PipelineConfig:
    """The config of a YAML file (None: the embedded defaults) with `pipeline` keys overridden."""
    raw: dict = {}
    if path is not None:
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except OSError as error:
            raise ConfigError(f"{path}: cannot read ({error.strerror})") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not YAML ({error})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: must be a mapping with sections {', '.join(SECTIONS)}")
    if overrides:
        pipeline = raw.get("pipeline") or {}
        if isinstance(pipeline, Mapping):  # else parse_config names the malformed section
            raw["pipeline"] = {**pipeline, **overrides}
    return parse_config(raw)
