"""The pipeline's settings: one typed, validated model per section, for both engines and the Pulumi stacks.

The raw form is a mapping of sections, `pipeline` and `serving`, with camelCase keys: the YAML file of
`python -m pipeline run --config FILE` (its flags override `pipeline` keys) and the Pulumi stack config
(`dist-ml:pipeline`, `dist-ml:serving`) are parsed by these models, so a value means the same thing
everywhere. Each key is declared once, below, with its type, default, constraint and meaning; a bad
value is a ConfigError naming the key (`pipeline.workers: ...`) before anything starts. What must hold
across the two sections is checked once, by PipelineSections, which both the config file and a stack's
settings are. The machinery (Section, the value types, the errors) is pipeline/validation.py's.

    python -m pipeline.config --schema    # the JSON Schema of the config file, for editors
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Mapping, Sequence, Union, get_args

import yaml
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from common.cluster_names import GENERATED_NAME_SUFFIX, WORKFLOW_TEMPLATE_NAME, train_step_name
from common.tracking_names import tracking_uri_problem
from engines import DEFAULT_ENGINE, ENGINES
from pipeline.validation import (
    SCHEMA_DIALECT,
    ConfigError,
    DnsLabel,
    Duration,
    Flag,
    Number,
    Positive,
    Quantity,
    Section,
    Text,
    WholeNumber,
    config_error,
    duration_seconds,
    fail,
    schema_command,
    standard_keywords,
)
from trainer.dataset_files import OFFICIAL_MIRROR
from trainer.serving_contract import EXPORTER_TENSORFLOW
from trainer.variants import VARIANTS

SECTIONS = ("pipeline", "serving")


# --- Sections --------------------------------------------------------------------------------------

def _cpu_and_memory(amounts: dict[str, str]) -> dict[str, str]:
    if set(amounts) != {"cpu", "memory"}:
        raise fail("must set exactly cpu and memory")
    return amounts


Amounts = Annotated[dict[str, Quantity], AfterValidator(_cpu_and_memory)]


class Resources(Section):
    """Kubernetes requests and limits, each {cpu, memory}; given one, a section keeps the other's default."""
    requests: Amounts = Field(description="what the scheduler reserves: {cpu, memory}")
    limits: Amounts = Field(description="the most the container may use: {cpu, memory}")

    def as_manifest(self) -> dict:
        return {"requests": dict(self.requests), "limits": dict(self.limits)}


DEFAULT_TRAINER_RESOURCES = Resources(requests={"cpu": "1", "memory": "2Gi"},
                                      limits={"cpu": "2", "memory": "4Gi"})
DEFAULT_SERVING_RESOURCES = Resources(requests={"cpu": "500m", "memory": "1Gi"},
                                      limits={"cpu": "1", "memory": "2Gi"})
DEFAULT_PARAMETER_SERVERS = 1
DEFAULT_STEP_RESOURCES = Resources(requests={"cpu": "250m", "memory": "1Gi"},
                                   limits={"cpu": "1", "memory": "2Gi"})


class WithResources(Section):
    """A section with Resources keys: a given {requests} or {limits} keeps the other's default."""

    @field_validator("*", mode="before")
    @classmethod
    def _partial_resources(cls, value: Any, info: ValidationInfo) -> Any:
        default = cls.model_fields[info.field_name].default
        if isinstance(default, Resources) and isinstance(value, Mapping):
            return {**default.as_manifest(), **value}
        return value


def _variant_list(value: Any) -> Any:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise fail(f"must be a non-empty list of {', '.join(VARIANTS)}")
    for variant in value:
        if variant not in VARIANTS:
            raise fail(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if len(set(value)) != len(value):
        raise fail(f"lists a variant twice: {list(value)}")
    return tuple(value)


# Editors are told "names defined in trainer/variants.py", not the names: the committed schemas stay
# as they are when a variant is added there.
VARIANTS_SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True,
                   "description": "which CNN variants to train, each once: names defined in "
                                  "trainer/variants.py (default: all of them)"}
Variants = Annotated[tuple[Literal[VARIANTS], ...], BeforeValidator(_variant_list),
                     WithJsonSchema(VARIANTS_SCHEMA)]
# How a variant trains: all-reduce across workers (MultiWorkerMirroredStrategy), or asynchronous
# steps on workers that share variables on parameter servers (ParameterServerStrategy).
SYNC, PARAMETER_SERVER = "sync", "parameter-server"
StrategyName = Literal["sync", "parameter-server"]
STRATEGIES = get_args(StrategyName)


def _strategy_choice(value: Any) -> Any:
    """One strategy for every variant, or a mapping of variant to strategy (others: sync)."""
    if isinstance(value, Mapping):
        for variant, strategy in value.items():
            if variant not in VARIANTS:
                raise fail(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
            if strategy not in STRATEGIES:
                raise fail(f"must be one of {', '.join(STRATEGIES)}, got {strategy!r}", str(variant))
        return dict(value)
    if value not in STRATEGIES:
        raise fail(f"must be one of {', '.join(STRATEGIES)} or a mapping of variant to one of them, "
                   f"got {value!r}")
    return value


STRATEGY_SCHEMA = {
    "oneOf": [{"enum": list(STRATEGIES)},
              {"type": "object", "additionalProperties": {"enum": list(STRATEGIES)},
               "description": "variant -> strategy; variants not named train sync"}],
    "description": "how variants train: sync (all-reduce) or parameter-server (asynchronous), for all "
                   "of them or per variant",
}
Strategy = Annotated[Union[StrategyName, dict[str, StrategyName]], BeforeValidator(_strategy_choice),
                     WithJsonSchema(STRATEGY_SCHEMA)]
def _registered_engine(name: str) -> str:
    """A registered training engine's name (engines.ENGINES, read when validating: an engine plugged in
    after this module was imported counts)."""
    if name not in ENGINES:
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": " or ".join(repr(known) for known in ENGINES)})
    return name


Engine = Annotated[str, AfterValidator(_registered_engine),
                   WithJsonSchema({"enum": list(ENGINES), "type": "string"})]
# trainer.train's --mixed-precision: float16 compute with float32 weights, `auto` where every GPU of a
# worker supports it (compute capability >= 7.0; never on CPUs). PyYAML reads YAML 1.1, where an
# unquoted on or off is a boolean: those are taken as the words.
MixedPrecision = Literal["auto", "on", "off"]
MIXED_PRECISION = get_args(MixedPrecision)


def _on_or_off(value: Any) -> Any:
    return ("on" if value else "off") if isinstance(value, bool) else value


Runtime = Literal["custom", "tensorflow"]
RUNTIMES = get_args(Runtime)
# What the predictor scales on (docs/concepts/serving.md). The load metrics are our server's own,
# read from Prometheus by KEDA (KServe's autoscalerClass keda): `inflight`, the requests received and
# not yet answered per replica, and `rps`, the requests per second per replica. `cpu` and `memory`
# are KServe's HPA on the percentage of the container's request. Concurrency and rps through Knative
# are not offered: the stacks install no Knative.
ScalingMetric = Literal["inflight", "rps", "cpu", "memory"]
SCALING_METRICS = get_args(ScalingMetric)
LOAD_METRICS = ("inflight", "rps")
# The load targets are 70% (Knative's default container-concurrency-target-percentage) of what one
# replica of the demo's model holds with its p99 under the latency objective on the default serving
# resources: `make bench-capacity`, docs/results/serving-capacity.md. cpu and memory: KServe's default
# CPU utilization (constants.DefaultCPUUtilization).
CAPACITY_HEADROOM = 0.7
# Measured 2026-11-25 at ab5f5a5 (load average 3.4 to 5.9): 12 in flight (p99 62 ms), 520 requests/s.
DEFAULT_TARGETS = {"inflight": 8, "rps": 363, "cpu": 80, "memory": 80}
DEFAULT_LATENCY_OBJECTIVE_MS = 100.0
# Kubernetes' own default for an HPA's scale-down stabilization; KServe's chart sets the same.
DEFAULT_SCALE_DOWN_STABILIZATION = "5m"
# The longest stabilization window the HPA API and KEDA's CRD accept (3600 s).
MAX_STABILIZATION_SECONDS = 3600
RETIRED_SERVING_KEYS = {
    "scaleMetric": "replaced by serving.autoscaling.metric (inflight, rps, cpu or memory)",
    "scaleTarget": "replaced by serving.autoscaling.target",
}


class Autoscaling(Section):
    """The `serving.autoscaling` section: what the predictor's replicas follow, between minReplicas and
    maxReplicas."""
    metric: ScalingMetric = Field(
        "inflight", description="inflight (requests in flight per replica) or rps (requests per second "
                                "per replica), through KEDA on the stack's Prometheus; or cpu or memory "
                                "(percent of the request), through KServe's HPA")
    target: Positive | None = Field(
        None, description=f"the metric's value per replica that scaling keeps; default: inflight "
                          f"{DEFAULT_TARGETS['inflight']} and rps {DEFAULT_TARGETS['rps']} (70% of one "
                          f"replica's measured capacity, docs/results/serving-capacity.md), cpu and memory "
                          f"{DEFAULT_TARGETS['cpu']} (percent)")
    scale_down_stabilization: Duration | None = Field(
        None, description=f"how long load must stay low before replicas are removed (inflight and rps; "
                          f"default {DEFAULT_SCALE_DOWN_STABILIZATION}, at most 1h)")
    latency_objective_ms: Number = Field(
        DEFAULT_LATENCY_OBJECTIVE_MS, ge=1.0,
        description="the p99 latency (ms) one replica must hold: `make bench-capacity` finds the "
                    "concurrency that holds it, and the default targets come from it")

    @property
    def on_load(self) -> bool:
        return self.metric in LOAD_METRICS

    @property
    def target_value(self) -> int:
        return self.target if self.target is not None else DEFAULT_TARGETS[self.metric]

    @property
    def scale_down_stabilization_seconds(self) -> int:
        return duration_seconds(self.scale_down_stabilization or DEFAULT_SCALE_DOWN_STABILIZATION)

    @model_validator(mode="after")
    def _consistent(self) -> Autoscaling:
        if not self.on_load and self.target is not None and self.target > 100:
            raise fail(f"must be a percentage (1-100) with metric {self.metric}, got {self.target}", "target")
        if not self.on_load and self.scale_down_stabilization is not None:
            raise fail(f"applies only to metric inflight or rps: KServe v0.20's HPA (metric {self.metric}) "
                       "takes no behavior, so Kubernetes' 5 minutes apply", "scaleDownStabilization")
        if self.scale_down_stabilization_seconds > MAX_STABILIZATION_SECONDS:
            raise fail(f"must be at most 1h, got {self.scale_down_stabilization}", "scaleDownStabilization")
        return self


class ServingConfig(WithResources):
    """The `serving` section: the model server, locally and as KServe's predictor."""
    NOT_HERE: ClassVar[dict[str, str]] = RETIRED_SERVING_KEYS
    runtime: Runtime = Field("custom", description="custom (our server) or tensorflow (KServe's TF Serving)")
    runtime_version: Text | None = Field(None, description="TF Serving image tag; runtime tensorflow only")
    min_replicas: WholeNumber = Field(1, ge=0, description="fewest predictor replicas")
    max_replicas: WholeNumber = Field(3, ge=1, description="most predictor replicas (>= minReplicas)")
    autoscaling: Autoscaling = Field(
        Autoscaling(), description="what the replicas follow: {metric, target, scaleDownStabilization, "
                                   "latencyObjectiveMs}")
    max_batch_size: WholeNumber = Field(32, ge=1, description="our server's dynamic batch limit")
    max_batch_wait_ms: Number = Field(
        0.0, ge=0, description="how long our server holds an idle model's batch open for more requests (ms)")
    http_port: WholeNumber = Field(8080, ge=1, le=65535, description="the local server's port with --serve")
    resources: Resources = Field(
        DEFAULT_SERVING_RESOURCES, description="requests and limits per predictor replica")

    @model_validator(mode="after")
    def _consistent(self) -> ServingConfig:
        if self.max_replicas < self.min_replicas:
            raise fail(f"must be >= minReplicas ({self.min_replicas}), got {self.max_replicas}",
                       "maxReplicas")
        if self.autoscaling.on_load and self.runtime == "tensorflow":
            raise fail(f"{self.autoscaling.metric} is read from our server's metrics, and runtime tensorflow "
                       "(TF Serving) serves none: use cpu or memory", "autoscaling.metric")
        if self.autoscaling.on_load and self.min_replicas < 1:
            raise fail(f"must be >= 1 with autoscaling.metric {self.autoscaling.metric}: with no replica no "
                       "request is counted, so nothing would scale the predictor up", "minReplicas")
        if self.runtime_version is not None and self.runtime != "tensorflow":
            raise fail("applies only to runtime 'tensorflow'", "runtimeVersion")
        if self.runtime_version is not None and () < release(self.runtime_version) < EXPORTER_TENSORFLOW:
            exporter = ".".join(map(str, EXPORTER_TENSORFLOW))
            raise fail(f"must be no older than the TensorFlow that writes the exports ({exporter}): an "
                       f"older TF Serving may not load them; got {self.runtime_version}", "runtimeVersion")
        return self


def release(tag: str) -> tuple[int, ...]:
    """A TF Serving image tag's major and minor release (`2.21.0-gpu` -> (2, 21)); () when the tag
    names none (`latest`; the pinned-images policy refuses that)."""
    match = re.match(r"(\d+)\.(\d+)", tag)
    return (int(match.group(1)), int(match.group(2))) if match else ()


class Promotion(Section):
    """The `pipeline.promotion` section: when selection publishes its winner over the served version."""
    min_improvement: Number = Field(
        0.0, ge=0.0, le=1.0,
        description="publish only if the winner's validation accuracy is at least the served version's "
                    "plus this (0-1; 0: not worse)")


class Rollout(Section):
    """The `pipeline.rollout` section: how a published version takes over from the served one."""
    canary_percent: WholeNumber = Field(
        10, ge=0, le=99,
        description="share of requests (percent) the new version serves as a canary before the decision; "
                    "0: it takes all traffic at once")
    min_requests: WholeNumber = Field(
        100, ge=1, description="requests the canary must answer before the decision")
    max_wait: Duration = Field(
        "10m", description="longest the canary runs before the decision, with fewer requests if so")
    max_error_rate_increase: Number = Field(
        0.01, ge=0.0, le=1.0,
        description="the canary's error rate may exceed the stable version's by at most this (0-1)")
    max_latency_ratio: Number = Field(
        1.5, ge=1.0, description="the canary's mean latency may be at most this times the stable's")

    @property
    def max_wait_seconds(self) -> int:
        return duration_seconds(self.max_wait)


def _tracking_uri(uri: str) -> str:
    if (problem := tracking_uri_problem(uri)) is not None:
        raise PydanticCustomError("config", "must be an MLflow tracking URI: {problem}", {"problem": problem})
    return uri


TrackingUri = Annotated[Text, AfterValidator(_tracking_uri)]


class TrackingConfig(Section):
    """The `pipeline.tracking` section: where MLflow records training runs, selections and published
    versions (docs/concepts/tracking.md). MLflow's own MLFLOW_TRACKING_URI, when set, wins locally."""
    enabled: Flag = Field(True, description="track in MLflow; false: record nothing (metrics.json stays)")
    uri: TrackingUri | None = Field(
        None, description="MLflow's tracking URI; default: locally a SQLite store under storageRoot, on a "
                          "cluster the stack's own tracking server")
    experiment: Text | None = Field(None, description="the MLflow experiment; default: modelName")


class PipelineSettings(WithResources):
    """The `pipeline` section's keys."""
    variants: Variants = Field(default_factory=lambda: VARIANTS,
                               description="which CNN variants to train, each once")
    workers: WholeNumber = Field(
        2, ge=1, description="worker replicas per variant (processes or TFJob Workers)")
    strategy: Strategy = Field(
        SYNC, description="sync or parameter-server, for every variant or per variant ({variant: strategy})")
    parameter_servers: Positive | None = Field(
        None, description="parameter servers (TFJob PS replicas) per variant trained with strategy "
                          "parameter-server; default 1")
    epochs: Positive | None = Field(None, description="training epochs; default: the trainer's rule")
    batch_size_per_replica: WholeNumber = Field(
        16, ge=1, description="batch size per replica: a worker's CPU, or each of its GPUs; the global batch "
                              "is this times the replicas, and the learning rate follows it")
    mixed_precision: Annotated[MixedPrecision, BeforeValidator(_on_or_off)] = Field(
        "auto", description="float16 compute with float32 weights: auto (on where every GPU has compute "
                            "capability >= 7.0, off on CPUs), on, or off; sync strategy only")
    steps_per_epoch: Positive | None = Field(
        None, description="steps per epoch; default: one pass over the training images")
    data_source: Text = Field(
        OFFICIAL_MIRROR, description="where ingest reads Fashion-MNIST: URL, directory or tfds")
    fallback_data_source: Text | None = Field(None, description="used only when dataSource is unreachable")
    storage_root: Text = Field(
        "runs/pipeline", description="the local engine's directory (pods mount storage)")
    model_name: DnsLabel = Field("fmnist", description="the served model's name")
    retries: WholeNumber = Field(
        2, ge=0, description="restarts of a failed step (backoffLimit, retryStrategy.limit); on a "
                             "cluster not ingest, which Argo memoizes")
    engine: Engine = Field(
        DEFAULT_ENGINE, description="what trains each variant on a cluster: trainjob (Kubeflow Trainer v2, "
                                "admitted by Kueue) or tfjob (the training operator v1)")
    train_timeout: Duration = Field(
        "6h", description="longest one attempt of a training step may take on a cluster, waiting in Kueue's "
                          "queue included; then the step fails, deleting its job")
    parallelism: Positive | None = Field(
        None, description="steps running at once; default: no limit")
    memoize_max_age: Duration = Field("24h", description="how long ingest's memo stays valid")
    service_account_name: DnsLabel = Field(
        "dist-ml-pipeline", description="the pipeline pods' service account")
    trainer_resources: Resources = Field(DEFAULT_TRAINER_RESOURCES,
                                         description="requests and limits of each training worker")
    step_resources: Resources = Field(
        DEFAULT_STEP_RESOURCES, description="requests and limits of ingest and select")
    promotion: Promotion = Field(
        Promotion(), description="the promotion gate: {minImprovement}, the margin over the served version")
    rollout: Rollout = Field(
        Rollout(), description="the canary: {canaryPercent, minRequests, maxWait, maxErrorRateIncrease, "
                               "maxLatencyRatio}")
    tracking: TrackingConfig = Field(
        TrackingConfig(), description="experiment tracking in MLflow: {enabled, uri, experiment}")

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.model_name

    @property
    def memoize_max_age_seconds(self) -> int:
        return duration_seconds(self.memoize_max_age)

    @property
    def train_timeout_seconds(self) -> int:
        return duration_seconds(self.train_timeout)

    def strategy_of(self, variant: str) -> str:
        if isinstance(self.strategy, str):
            return self.strategy
        return self.strategy.get(variant, SYNC)

    def parameter_servers_of(self, variant: str) -> int:
        """The parameter servers `variant` trains with: 0 under sync."""
        if self.strategy_of(variant) != PARAMETER_SERVER:
            return 0
        return self.parameter_servers or DEFAULT_PARAMETER_SERVERS

    @model_validator(mode="after")
    def _consistent_training(self) -> PipelineSettings:
        named = set(self.strategy) if isinstance(self.strategy, dict) else set()
        if named - set(self.variants):
            raise fail(f"names {', '.join(sorted(named - set(self.variants)))}, which variants does not "
                       "list", "strategy")
        if self.parameter_servers is not None and not any(
                self.strategy_of(variant) == PARAMETER_SERVER for variant in self.variants):
            raise fail(f"applies only to strategy {PARAMETER_SERVER}; no variant trains so",
                       "parameterServers")
        self._job_names_fit()
        under_parameter_servers = [v for v in self.variants if self.strategy_of(v) == PARAMETER_SERVER]
        if self.mixed_precision == "on" and under_parameter_servers:
            raise fail(f"cannot be on while variants train with {PARAMETER_SERVER} "
                       f"({', '.join(under_parameter_servers)}): tf-keras scales the loss of float16 "
                       f"training under {SYNC} only; use auto (float32 there) or off", "mixedPrecision")
        return self

    def _job_names_fit(self) -> None:
        """Each variant's job, `<workflow>-train-<variant>`, has a name its engine's controllers accept
        (for a TrainJob, one that leaves its JobSet's pod names DNS labels)."""
        engine = ENGINES[self.engine]
        workflow = len(WORKFLOW_TEMPLATE_NAME) + GENERATED_NAME_SUFFIX
        for variant in self.variants:
            length = workflow + 1 + len(train_step_name(variant))
            limit = engine.longest_name(self.workers, self.parameter_servers_of(variant))
            if length > limit:
                raise fail(f"{variant}'s {engine.job_resource.kind} would be named with {length} characters, "
                           f"and its pods' names allow {limit}: train it on fewer workers or give it a "
                           "shorter name", "variants")


class PipelineConfig(PipelineSettings):
    """What the engines read: the `pipeline` section with the `serving` section beside it."""
    serving: ServingConfig = ServingConfig()

    @classmethod
    def of(cls, pipeline: PipelineSettings, serving: ServingConfig) -> PipelineConfig:
        """The two validated sections as one object (nothing to validate again)."""
        fields = {name: getattr(pipeline, name) for name in PipelineSettings.model_fields}
        return cls.model_construct(**fields, serving=serving)


class PipelineSections(Section):
    """A document holding the `pipeline` and `serving` sections side by side: the config file, and a
    stack's settings (stacks/settings.py). Each declares the two sections itself, where they stand
    among its keys; what must hold across them is checked here, once for every such document."""

    if TYPE_CHECKING:  # declared by each subclass
        pipeline: PipelineSettings
        serving: ServingConfig

    @model_validator(mode="after")
    def _judgeable_canary(self) -> PipelineSections:
        """A canary is judged on the model server's /metrics; KServe's TF Serving (runtime tensorflow)
        serves none."""
        canary_percent = self.pipeline.rollout.canary_percent
        if canary_percent and self.serving.runtime == "tensorflow":
            raise fail("must be 0 with serving.runtime tensorflow: TF Serving serves no /metrics to judge a "
                       f"canary on; got {canary_percent}", "pipeline.rollout.canaryPercent")
        return self


class ConfigFile(PipelineSections):
    """The config file of `python -m pipeline run --config FILE`."""
    model_config = ConfigDict(title="dist-ml pipeline config")
    UNKNOWN: ClassVar[str] = "unknown section"
    pipeline: PipelineSettings = Field(PipelineSettings(), description="the pipeline's steps and training")
    serving: ServingConfig = Field(ServingConfig(), description="the model server")


# --- Parsing --------------------------------------------------------------------------------------

def parse_config(raw: Mapping[str, Any] | None) -> PipelineConfig:
    """The validated config of a raw mapping {pipeline: {...}, serving: {...}}; missing keys default."""
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError(f"config: must be a mapping with sections {', '.join(SECTIONS)}")
    try:
        document = ConfigFile.model_validate(raw or {})
    except ValidationError as error:
        raise config_error(error, ConfigFile) from None
    return PipelineConfig.of(document.pipeline, document.serving)


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


def without_variant_names(schema: Any) -> Any:
    """`schema` without the variants' names in the sections' defaults (see VARIANTS_SCHEMA)."""
    if isinstance(schema, list):
        return [without_variant_names(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {key: ({name: item for name, item in value.items() if name != "variants"}
                  if key == "default" and isinstance(value, dict) else without_variant_names(value))
            for key, value in schema.items()}


def config_file_schema() -> dict:
    """The JSON Schema of the config file (what `--schema` prints)."""
    schema = standard_keywords(without_variant_names(ConfigFile.model_json_schema()))
    return {"$schema": SCHEMA_DIALECT, **schema}


def main(argv: Sequence[str] | None = None) -> int:
    return schema_command("pipeline.config", config_file_schema, argv)


if __name__ == "__main__":
    sys.exit(main())
