"""The pipeline's config: defaults, every bad value named by its key, and nothing started on error."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import REPO_ROOT, last_line, names_a_path, run_module
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import ConfigError, PipelineConfig, load_config, parse_config
from trainer.variants import VARIANTS


def test_the_embedded_default_trains_every_variant_on_two_workers():
    config = parse_config(None)
    assert config == PipelineConfig()
    assert config.variants == VARIANTS and config.workers == 2
    assert config.memoize_max_age_seconds == 24 * 3600


def test_values_from_the_stack_config_mean_the_same():
    config = parse_config({
        "pipeline": {"variants": ["cnn_batchnorm"], "workers": 3.0, "memoizeMaxAge": "1h30m",
                     "trainerResources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                          "limits": {"cpu": 2, "memory": "3Gi"}},
                     "rollout": {"canaryPercent": 0}},
        "serving": {"runtime": "tensorflow", "runtimeVersion": "2.21.0", "minReplicas": 0,
                    "maxReplicas": 5.0, "autoscaling": {"metric": "memory", "target": 4.0}},
    })
    assert config.variants == ("cnn_batchnorm",)
    assert config.workers == 3 and isinstance(config.workers, int)  # Pulumi gives floats
    assert config.memoize_max_age_seconds == 5400
    assert config.trainer_resources.limits == {"cpu": "2", "memory": "3Gi"}
    assert (config.serving.runtime, config.serving.runtime_version) == ("tensorflow", "2.21.0")
    assert (config.serving.min_replicas, config.serving.max_replicas) == (0, 5)
    assert (config.serving.autoscaling.metric, config.serving.autoscaling.target) == ("memory", 4)


# TF Serving serves none of the metrics the load is read from: it scales on CPU.
TF_SERVING = {"runtime": "tensorflow", "autoscaling": {"metric": "cpu"}}
BAD_CONFIGS = [
    # Knative's settings: KServe's Standard mode, the only one the stacks install, has neither.
    ({"serving": {"autoscaling": {"metric": "concurrency"}}},
     "serving.autoscaling.metric: must be one of inflight, rps, cpu, memory"),
    # The keys before serving.autoscaling, each named with what replaced it.
    ({"serving": {"scaleMetric": "cpu"}}, "serving.scaleMetric: replaced by serving.autoscaling.metric"),
    ({"serving": {"scaleTarget": 80}}, "serving.scaleTarget: replaced by serving.autoscaling.target"),
    ({"serving": {"autoscaling": {"target": 0}}}, "serving.autoscaling.target: must be an integer >= 1"),
    ({"serving": {"autoscaling": {"metric": "cpu", "target": 120}}},
     "serving.autoscaling.target: must be a percentage (1-100) with metric cpu, got 120"),
    ({"serving": {"autoscaling": {"metric": "memory", "scaleDownStabilization": "10m"}}},
     "serving.autoscaling.scaleDownStabilization: applies only to metric inflight or rps"),
    ({"serving": {"autoscaling": {"scaleDownStabilization": "61m"}}},
     "serving.autoscaling.scaleDownStabilization: must be at most 1h, got 61m"),
    ({"serving": {"autoscaling": {"scaleDownStabilization": "5 minutes"}}},
     "serving.autoscaling.scaleDownStabilization: must be a duration"),
    ({"serving": {"autoscaling": {"latencyObjectiveMs": 0}}},
     "serving.autoscaling.latencyObjectiveMs: must be a number >= 1"),
    # The load is read from our server's metrics, and counted only on a replica that exists.
    ({"serving": {"runtime": "tensorflow", "autoscaling": {"metric": "rps"}}},
     "serving.autoscaling.metric: rps is read from our server's metrics, and runtime tensorflow"),
    ({"serving": {"minReplicas": 0}}, "serving.minReplicas: must be >= 1 with autoscaling.metric inflight"),
    ({"serving": {"containerConcurrency": 1}}, "serving.containerConcurrency: unknown setting"),
    ({"pipeline": {"workers": 0}}, "pipeline.workers: must be an integer >= 1, got 0"),
    ({"pipeline": {"workers": "two"}}, "pipeline.workers"),
    ({"pipeline": {"workers": True}}, "pipeline.workers"),
    ({"pipeline": {"workers": None}}, "pipeline.workers"),
    ({"pipeline": {"variants": ["cnn", "resnet"]}}, "pipeline.variants: unknown variant 'resnet'"),
    ({"pipeline": {"variants": []}}, "pipeline.variants: must be a non-empty list"),
    ({"pipeline": {"variants": ["cnn", "cnn"]}}, "pipeline.variants: lists a variant twice"),
    ({"pipeline": {"dataSource": ""}}, "pipeline.dataSource: must be a non-empty string"),
    ({"pipeline": {"dataSource": None}}, "pipeline.dataSource: must be a non-empty string"),
    ({"pipeline": {"epoch": 3}}, "pipeline.epoch: unknown setting"),
    ({"pipline": {}}, "pipline: unknown section"),
    ({"pipeline": ["workers"]}, "pipeline: must be a mapping"),
    ({"pipeline": {"retries": -1}}, "pipeline.retries"),
    ({"pipeline": {"memoizeMaxAge": "1 day"}}, "pipeline.memoizeMaxAge: must be a duration"),
    ({"pipeline": {"modelName": "Fashion_MNIST"}}, "pipeline.modelName: must be a DNS-1123 label"),
    ({"pipeline": {"trainerResources": {"limits": {"cpu": "lots", "memory": "1Gi"}}}},
     "pipeline.trainerResources.limits.cpu: must be a Kubernetes quantity"),
    ({"pipeline": {"stepResources": {"requests": {"cpu": "1"}}}},
     "pipeline.stepResources.requests: must set exactly cpu and memory"),
    ({"serving": {"runtime": "onnx"}}, "serving.runtime: must be one of custom, tensorflow"),
    ({"serving": {"runtimeVersion": "2.21.0"}}, "serving.runtimeVersion: applies only to runtime"),
    ({"serving": {**TF_SERVING, "runtimeVersion": "2.20.0"}},
     "serving.runtimeVersion: must be no older than the TensorFlow that writes the exports (2.21)"),
    ({"serving": {"minReplicas": 4, "maxReplicas": 2}}, "serving.maxReplicas: must be >= minReplicas"),
    # Across the sections: the canary is judged on the server's /metrics, which TF Serving lacks.
    ({"serving": TF_SERVING},
     "pipeline.rollout.canaryPercent: must be 0 with serving.runtime tensorflow: TF Serving serves no "
     "/metrics to judge a canary on; got 10"),
    ({"pipeline": {"rollout": {"canaryPercent": 1}}, "serving": TF_SERVING},
     "pipeline.rollout.canaryPercent: must be 0 with serving.runtime tensorflow"),
    ({"serving": {"autoscaling": {"metric": "gpu"}}}, "serving.autoscaling.metric"),
    ({"serving": {"maxBatchWaitMs": float("nan")}}, "serving.maxBatchWaitMs"),
    ({"serving": {"httpPort": 70000}}, "serving.httpPort"),
    ({"pipeline": {"promotion": {"minImprovement": 1.5}}},
     "pipeline.promotion.minImprovement: must be a number <= 1, got 1.5"),
    ({"pipeline": {"promotion": {"minImprovement": -0.01}}},
     "pipeline.promotion.minImprovement: must be a number >= 0, got -0.01"),
    ({"pipeline": {"promotion": {"minImprovement": "1%"}}}, "pipeline.promotion.minImprovement"),
    ({"pipeline": {"promotion": {"minImprovement": True}}}, "pipeline.promotion.minImprovement"),
    ({"pipeline": {"promotion": {"minImprovment": 0.1}}},
     "pipeline.promotion.minImprovment: unknown setting; known: minImprovement"),
    ({"pipeline": {"promotion": 0.1}}, "pipeline.promotion: must be a mapping"),
    ({"pipeline": {"strategy": "ps"}}, "pipeline.strategy: must be one of sync, parameter-server or a "
                                       "mapping of variant to one of them, got 'ps'"),
    ({"pipeline": {"strategy": {"cnn": "async"}}},
     "pipeline.strategy.cnn: must be one of sync, parameter-server, got 'async'"),
    ({"pipeline": {"strategy": {"resnet": "sync"}}}, "pipeline.strategy: unknown variant 'resnet'"),
    ({"pipeline": {"variants": ["cnn"], "strategy": {"cnn_dropout": "parameter-server"}}},
     "pipeline.strategy: names cnn_dropout, which variants does not list"),
    ({"pipeline": {"strategy": "parameter-server", "parameterServers": 0}},
     "pipeline.parameterServers: must be an integer >= 1, got 0"),
    ({"pipeline": {"parameterServers": 2}},
     "pipeline.parameterServers: applies only to strategy parameter-server; no variant trains so"),
    ({"pipeline": {"strategy": {"cnn": "sync"}, "parameterServers": 1}}, "pipeline.parameterServers"),
    ({"pipeline": {"mixedPrecision": "fp16"}}, "pipeline.mixedPrecision: must be one of auto, on, off"),
    ({"pipeline": {"mixedPrecision": None}}, "pipeline.mixedPrecision"),
    ({"pipeline": {"mixedPrecision": "on", "variants": ["cnn", "cnn_gap"],
                   "strategy": {"cnn_gap": "parameter-server"}}},
     "pipeline.mixedPrecision: cannot be on while variants train with parameter-server (cnn_gap)"),
]


def test_the_strategy_is_sync_by_default_and_may_be_chosen_per_variant():
    default = parse_config(None)
    assert {default.strategy_of(v) for v in VARIANTS} == {"sync"}
    assert [default.parameter_servers_of(v) for v in VARIANTS] == [0] * len(VARIANTS)
    every = parse_config({"pipeline": {"strategy": "parameter-server"}})
    assert [every.parameter_servers_of(v) for v in VARIANTS] == [1] * len(VARIANTS)
    mixed = parse_config({"pipeline": {"variants": ["cnn", "cnn_dropout"], "parameterServers": 3.0,
                                       "strategy": {"cnn_dropout": "parameter-server"}}})
    assert [(mixed.strategy_of(v), mixed.parameter_servers_of(v)) for v in mixed.variants] == [
        ("sync", 0), ("parameter-server", 3)]
    assert parse_config(yaml.safe_load(yaml.safe_dump(file_form(mixed)))) == mixed


def test_the_promotion_margin_defaults_to_not_worse_and_reaches_select():
    from pipeline.definition import build_steps

    assert parse_config(None).promotion.min_improvement == 0.0
    config = parse_config({"pipeline": {"promotion": {"minImprovement": 0.005}}})
    assert config.promotion.min_improvement == 0.005
    assert parse_config({"pipeline": {"promotion": {"minImprovement": 1}}}).promotion.min_improvement == 1.0
    (select,) = [step for step in build_steps(config, "/data") if step.name == "select"]
    assert select.args[-2:] == ("--min-improvement", "0.005")


def test_mixed_precision_is_auto_by_default_and_reaches_every_training_step():
    from pipeline.definition import build_steps

    assert parse_config(None).mixed_precision == "auto"
    # YAML 1.1 (PyYAML) reads an unquoted on or off as a boolean: taken as the word.
    for text, choice in (("on", "on"), ("off", "off"), ("'on'", "on"), ("auto", "auto")):
        config = parse_config(yaml.safe_load(f"pipeline: {{mixedPrecision: {text}}}"))
        assert config.mixed_precision == choice
        trains = [step.args for step in build_steps(config, "/data") if step.name.startswith("train-")]
        assert trains and all(args[args.index("--mixed-precision") + 1] == choice for args in trains)


@pytest.mark.parametrize(("raw", "message"), BAD_CONFIGS, ids=[m.split(":")[0] for _, m in BAD_CONFIGS])
def test_each_bad_value_is_an_error_naming_its_key(raw, message):
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    assert str(error.value).startswith(message)


def test_a_config_file_with_flag_overrides(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text("pipeline:\n  workers: 3\n  variants: [cnn]\nserving:\n  maxBatchSize: 8\n")
    config = load_config(path, {"workers": 4})
    assert (config.workers, config.variants, config.serving.max_batch_size) == (4, ("cnn",), 8)


@pytest.mark.parametrize(("text", "message"), [("pipeline: [", "not YAML"), ("- 1\n", "must be a mapping")])
def test_a_malformed_config_file_is_named(tmp_path, text, message):
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_a_canary_tf_serving_cannot_be_judged_on_starts_nothing(tmp_path):
    """`pipeline run` refuses it through the same model as `render` and the stacks."""
    root, config_file = tmp_path / "root", tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump({"serving": TF_SERVING}))
    result = run_module("pipeline", "run", "--config", config_file, "--storage-root", root)
    assert result.returncode == 2
    assert last_line(result.stderr).startswith(
        "pipeline: error: config: pipeline.rollout.canaryPercent: must be 0 with serving.runtime tensorflow")
    assert not root.exists()


@pytest.mark.parametrize(("flags", "key"), [
    (["--workers", "0"], "pipeline.workers"),
    (["--variants", "cnn", "resnet"], "pipeline.variants"),
    (["--data-source", ""], "pipeline.dataSource"),
])
def test_bad_config_on_the_command_line_starts_nothing(tmp_path, flags, key):
    root = tmp_path / "root"
    result = run_module("pipeline", "run", "--storage-root", root, *flags)
    assert result.returncode == 2
    assert last_line(result.stderr).startswith(f"pipeline: error: config: {key}: ")
    assert not root.exists()  # no run directory, no logs, no process


def test_the_pipeline_imports_neither_tensorflow_nor_pulumi():
    result = subprocess.run(
        [sys.executable, "-c", "import sys, pipeline.__main__; print(sorted(m for m in sys.modules "
         "if m.split('.')[0] in ('tensorflow', 'pulumi')))"],
        cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- Property-based: the models round-trip, and random input is a config or one ConfigError -------

QUANTITIES = st.sampled_from(["500m", "1", "1.5", "2Gi", "512Mi", 2, 3.0])
AMOUNTS = st.fixed_dictionaries({"cpu": QUANTITIES, "memory": QUANTITIES})
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12).filter(str.strip)
PIPELINE_VALUES = {
    "variants": st.lists(st.sampled_from(VARIANTS), min_size=1, unique=True),
    "workers": st.integers(1, 64) | st.integers(1, 64).map(float),  # Pulumi's numbers are floats
    "epochs": st.none() | st.integers(1, 99), "batchSizePerReplica": st.integers(1, 512),
    "stepsPerEpoch": st.none() | st.integers(1, 999), "dataSource": TEXT,
    "fallbackDataSource": st.none() | TEXT, "storageRoot": TEXT,
    "modelName": st.from_regex(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", fullmatch=True),
    "retries": st.integers(0, 9), "parallelism": st.none() | st.integers(1, 9),
    "strategy": st.sampled_from(["sync", "parameter-server"]),
    "memoizeMaxAge": st.from_regex(r"^(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?$", fullmatch=True).filter(bool),
    "trainerResources": st.fixed_dictionaries({}, optional={"requests": AMOUNTS, "limits": AMOUNTS}),
}
AUTOSCALING = st.fixed_dictionaries({}, optional={
    "metric": st.sampled_from(["cpu", "memory"]), "target": st.integers(1, 100),
    "latencyObjectiveMs": st.floats(1, 10_000)})
LOAD_AUTOSCALING = st.fixed_dictionaries({"metric": st.sampled_from(["inflight", "rps"])}, optional={
    "target": st.integers(1, 10_000), "scaleDownStabilization": st.sampled_from(["0s", "30s", "5m", "1h"])})
SERVING_VALUES = {
    "autoscaling": AUTOSCALING | LOAD_AUTOSCALING,
    "maxBatchSize": st.integers(1, 256), "maxBatchWaitMs": st.floats(0, 1000) | st.integers(0, 1000),
    "httpPort": st.integers(1, 65535),
    "resources": st.fixed_dictionaries({"requests": AMOUNTS, "limits": AMOUNTS}),
}


@st.composite
def valid_configs(draw) -> dict:
    serving = draw(st.fixed_dictionaries({}, optional=SERVING_VALUES))
    on_load = serving.get("autoscaling", {}).get("metric", "inflight") in ("inflight", "rps")
    low = draw(st.integers(1 if on_load else 0, 5))
    serving.update(minReplicas=low, maxReplicas=draw(st.integers(max(1, low), 9)))
    pipeline = draw(st.fixed_dictionaries({}, optional=PIPELINE_VALUES))
    if not on_load and draw(st.booleans()):
        versions = st.sampled_from(["2.21.0", "2.22.1-gpu", "nightly"])
        serving.update(runtime="tensorflow", runtimeVersion=draw(versions))
        pipeline["rollout"] = {"canaryPercent": 0}  # TF Serving has no /metrics to judge a canary on
    return {"pipeline": pipeline, "serving": serving}


def file_form(config: PipelineConfig) -> dict:
    """The config as a config file says it."""
    return {"pipeline": config.model_dump(by_alias=True, mode="json", exclude={"serving"}),
            "serving": config.serving.model_dump(by_alias=True, mode="json")}


@settings(max_examples=150, deadline=None)
@given(valid_configs())
def test_any_valid_config_round_trips_through_its_yaml_form(raw):
    config = parse_config(raw)
    assert parse_config(yaml.safe_load(yaml.safe_dump(file_form(config)))) == config
    assert config.workers == int(raw["pipeline"].get("workers", 2)) and isinstance(config.workers, int)


KEYS = st.sampled_from([*PIPELINE_VALUES, *SERVING_VALUES, "minReplicas", "runtime"]) | st.text(max_size=5)
ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 70000) | st.floats() | st.text(max_size=6) | QUANTITIES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["pipeline", "serving"]) | st.text(max_size=5),
                       st.dictionaries(KEYS, ANY_VALUE, max_size=5) | ANY_VALUE, max_size=3))
def test_any_mapping_is_a_config_or_an_error_naming_a_key(raw):
    try:
        parse_config(raw)
    except ConfigError as error:
        assert names_a_path(str(error), {*map(str, raw), *map(repr, raw), "config"}), str(error)
        assert "\n" not in str(error)
