"""The stack config's models on their own: the stack files parse and round-trip, random input is either
a stack config or one ConfigError naming a key, the JSON Schemas match the models and the stack files,
the generated configuration reference covers every key, and the Pulumi values arrive through
pulumi.Config with secrets kept secret and empty values refused."""

from __future__ import annotations

import asyncio
import io
import json
from contextlib import redirect_stdout
from typing import Any

import jsonschema
import pulumi
import pytest
import yaml
from conftest import REPO_ROOT, names_a_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stack_checks import config_error_before_any_resource

from common.cluster_target import KUBERNETES_MINOR
from pipeline import config as pipeline_config
from pipeline.config import ConfigFile, PipelineSettings, ServingConfig, parse_config
from pipeline.validation import ConfigError, key_path, section_at
from stacks import config as stack_config
from stacks import program, render
from stacks.config import from_pulumi_values, parse_stack_config, stack_models, stack_settings
from stacks.kinds.gke import GCP_PROJECT, PLACEHOLDER_PROJECTS, GcpConfig, GkeConfig
from stacks.kinds.k3d import K3dConfig
from tools import docs_reference

STACK_FILES = {"local": REPO_ROOT / "Pulumi.local.yaml", "gke": REPO_ROOT / "Pulumi.gke.yaml"}
PROJECT_ID = "dist-ml-test-4821"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def file_values(stack: str) -> dict[str, str]:
    values = render.pulumi_values(STACK_FILES[stack])
    return {**values, "gcp:project": PROJECT_ID} if stack == "gke" else values


def settings_of(raw: dict) -> Any:
    return stack_settings().validate_python(raw)


def as_pulumi_values(raw: dict) -> dict[str, str]:
    """The mapping as Pulumi's config map: the project's keys prefixed, structured values as JSON."""
    return {(key if ":" in key else f"dist-ml:{key}"): value if isinstance(value, str) else json.dumps(value)
            for key, value in raw.items()}


# --- The stack files and round trips --------------------------------------------------------------

@pytest.mark.parametrize("stack", STACK_FILES)
def test_each_stack_file_parses_and_round_trips_through_pulumis_form(stack):
    config = parse_stack_config(from_pulumi_values(file_values(stack)))
    assert config.cluster_kind == {"local": "k3d", "gke": "gke"}[stack]
    dumped = stack_settings().dump_python(settings_of(from_pulumi_values(file_values(stack))), by_alias=True,
                                        mode="json")
    assert parse_stack_config(from_pulumi_values(as_pulumi_values(dumped))) == config


def test_defaults_that_come_from_other_sections():
    gke = parse_stack_config(from_pulumi_values(file_values("gke")))
    assert gke.cluster.location == "us-central1" and gke.storage.bucket_name == f"{PROJECT_ID}-dist-ml"
    assert gke.monitoring.enabled and gke.cluster.training_pool == "spot"
    assert gke.cloud == GcpConfig(project=PROJECT_ID, region="us-central1")
    local = parse_stack_config({"cluster": {"kind": "k3d"}})
    assert not local.monitoring.enabled and local.cloud is None and local.storage.size == "10Gi"
    assert local.cluster.kubernetes_version == gke.cluster.kubernetes_version == KUBERNETES_MINOR
    # The stack's serving section is the pipeline's: the engines see the same type either way.
    assert type(local.pipeline.serving) is ServingConfig and local.pipeline.storage_root == "runs/pipeline"


def test_a_partial_section_keeps_the_other_defaults():
    config = parse_stack_config({"cluster": {"kind": "gke", "nodePools": {"gpu": {"enabled": True}}},
                                 "gcp:project": PROJECT_ID, "gcp:region": "europe-west4",
                                 "monitoring": {"kubePrometheusStackVersion": "81.0.0"}})
    assert config.monitoring.enabled  # gke's default, though the section is given
    assert (config.cluster.gpu_pool.accelerator_type, config.cluster.gpu_pool.accelerator_count) == (
        "nvidia-tesla-t4", 1)
    assert config.cluster.training_pool == "gpu" and config.cluster.spot_pool is None


MORE_BAD_STACK_CONFIG = [
    ({"cluster": {"kind": "eks"}}, "cluster.kind: must be one of k3d, gke, existing, got 'eks'"),
    ({}, "cluster.kind: is required: one of k3d, gke"),
    ({"cluster": "k3d"}, "cluster: must be a mapping of settings, got str"),
    ({"cluster": {"kind": "k3d", "nodePools": {}}}, "cluster.nodePools: does not apply to cluster.kind k3d"),
    # GPUs asked of k3d: refused, saying why.
    ({"cluster": {"kind": "k3d", "nodePools": {"gpu": {"enabled": True}}}},
     "cluster.nodePools: does not apply to cluster.kind k3d: node pools, and with them GPUs, are the gke "
     "stack's; k3d's nodes are containers on this machine, which train on the CPU trainer image"),
    ({"cluster": {"kind": "k3d", "trainingPool": "gpu"}},
     "cluster.trainingPool: does not apply to cluster.kind k3d: node pools, and with them GPUs"),
    ({"cluster": {"kind": "k3d"}, "storage": {"bucketName": "b-1"}},
     "storage.bucketName: does not apply to cluster.kind k3d"),
    ({"cluster": {"kind": "k3d"}, "gcp:zone": "us-central1-a"}, "gcp:zone: applies only to cluster.kind gke"),
    ({"cluster": {"kind": "k3d", "ports": [{"host": 8088}]}}, "cluster.ports[0].container: is required"),
    ({"cluster": {"kind": "k3d", "ports": [{"host": 8088, "container": 70000}]}},
     "cluster.ports[0].container: must be an integer <= 65535, got 70000"),
    ({"cluster": {"kind": "k3d", "ports": [{"host": 8088, "container": 80, "hostAddress": "localhost"}]}},
     "cluster.ports[0].hostAddress: must be an IPv4 address like 127.0.0.1, got 'localhost'"),
    ({"cluster": {"kind": "k3d", "ports": [{"host": 8088, "container": 80, "hostAddress": "127.0.0.256"}]}},
     "cluster.ports[0].hostAddress: must be an IPv4 address like 127.0.0.1, got '127.0.0.256'"),
    ({"cluster": {"kind": "k3d", "servers": True}}, "cluster.servers: must be an integer >= 1, got True"),
    ({"cluster": {"kind": "k3d"}, "monitoring": {"enabled": "yes"}},
     "monitoring.enabled: must be true or false"),
    ({"cluster": {"kind": "k3d"}, "namespace": "Dist_ML"},
     "namespace: must be a DNS-1123 label, got 'Dist_ML'"),
    ({"cluster": {"kind": "gke", "nodePools": {"cpu": {"enabled": True}}}, "gcp:project": PROJECT_ID,
      "gcp:region": "us-central1"}, "cluster.nodePools.cpu.enabled: the CPU pool always exists"),
    ({"cluster": {"kind": "gke", "nodePools": {"spot": {"machineType": "e2-standard-4"}}},
      "gcp:project": PROJECT_ID, "gcp:region": "us-central1"}, "cluster.nodePools.spot.enabled: is false"),
    ({"cluster": {"kind": "gke", "nodePools": {"spot": {"enabled": True, "acceleratorCount": 1}}},
      "gcp:project": PROJECT_ID, "gcp:region": "us-central1"},
     "cluster.nodePools.spot.acceleratorCount: accelerators belong in nodePools.gpu"),
    ({"cluster": {"kind": "gke", "nodePools": {"cpu": {"driverVersion": "DEFAULT"}}},
      "gcp:project": PROJECT_ID, "gcp:region": "us-central1"},
     "cluster.nodePools.cpu.driverVersion: GPU drivers belong in nodePools.gpu"),
    ({"cluster": {"kind": "gke", "nodePools": {"gpu": {"enabled": True, "driverVersion": "R535"}}},
      "gcp:project": PROJECT_ID, "gcp:region": "us-central1"},
     "cluster.nodePools.gpu.driverVersion: must be one of DEFAULT, LATEST, got 'R535'"),
    ({"cluster": {"kind": "gke", "nodePools": {"gpu": {"enabled": True, "driverVersion": None}}},
      "gcp:project": PROJECT_ID, "gcp:region": "us-central1"}, "cluster.nodePools.gpu.driverVersion"),
]


@pytest.mark.parametrize(("raw", "message"), MORE_BAD_STACK_CONFIG,
                         ids=[m.split(":")[0] for _, m in MORE_BAD_STACK_CONFIG])
def test_more_bad_stack_config_names_its_key(raw, message):
    with pytest.raises(ConfigError) as error:
        parse_stack_config(raw)
    assert str(error.value).startswith(message)


def test_the_gcp_providers_own_keys_are_left_to_it_on_gke():
    raw = {"cluster": {"kind": "gke"}, "gcp:project": PROJECT_ID, "gcp:region": "us-central1",
           "gcp:zone": "us-central1-a"}
    assert parse_stack_config(raw).cloud.region == "us-central1"


@pytest.mark.parametrize("kind", ["k3d", "gke"])
def test_the_stack_refuses_across_the_pipeline_sections_what_the_config_file_refuses(kind):
    """The rules that span `pipeline` and `serving` are the pipeline's (PipelineSections), stated once:
    a stack of any kind refuses what `python -m pipeline run` and `render` refuse, in the same words."""
    sections = {"pipeline": {"rollout": {"canaryPercent": 25}},
                "serving": {"runtime": "tensorflow", "autoscaling": {"metric": "cpu"}}}
    with pytest.raises(ConfigError) as in_the_file:
        parse_config(sections)
    assert str(in_the_file.value) == (
        "pipeline.rollout.canaryPercent: must be 0 with serving.runtime tensorflow: TF Serving serves no "
        "/metrics to judge a canary on; got 25")
    gcp = {"gcp:project": PROJECT_ID, "gcp:region": "us-central1"} if kind == "gke" else {}
    with pytest.raises(ConfigError) as on_the_stack:
        parse_stack_config({"cluster": {"kind": kind}, **gcp, **sections})
    assert str(on_the_stack.value) == str(in_the_file.value)
    sections["pipeline"]["rollout"]["canaryPercent"] = 0
    assert parse_stack_config({"cluster": {"kind": kind}, **gcp, **sections}).pipeline.serving.runtime == (
        "tensorflow")


@pytest.mark.parametrize("value", ["", "  ", "null", "{}", "[]"])
def test_an_explicitly_empty_value_is_an_error_naming_its_key(value):
    with pytest.raises(ConfigError, match=r"^pipeline: is set but empty; .*config rm dist-ml:pipeline"):
        from_pulumi_values({"dist-ml:cluster": '{"kind": "k3d"}', "dist-ml:pipeline": value})
    with pytest.raises(ConfigError, match=r"^gcp:project: is set but empty"):
        from_pulumi_values({"gcp:project": value})


# --- Property-based: random input never escapes as another exception -------------------------------

PIPELINE_KEYS = [field.alias for field in PipelineSettings.model_fields.values()] + ["runOnUp"]
SERVING_KEYS = [field.alias for field in ServingConfig.model_fields.values()]
CLUSTER_KEYS = sorted({field.alias or name for model in (K3dConfig, GkeConfig)
                       for name, field in model.model_fields.items()})
TOP_KEYS = ["namespace", "cluster", "platform", "storage", "monitoring", "pipeline", "serving",
            "gcp:project", "gcp:region", "gcp:zone"]
SECTION_KEYS = {"pipeline": PIPELINE_KEYS, "serving": SERVING_KEYS, "cluster": CLUSTER_KEYS + ["cpu", "gpu"],
                "storage": ["size", "accessMode", "storageClass", "bucketName", "checkpointRetentionDays"],
                "platform": ["argoVersion", "kserveVersion"], "monitoring": ["enabled"]}
scalars = (st.none() | st.booleans() | st.integers(-3, 70000) | st.floats() | st.text(max_size=8)
           | st.sampled_from(["k3d", "gke", "cnn", "1Gi", "cpu", "tensorflow", "dist-ml"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(["kind", "enabled", "cpu", "memory", "host"])
                                        | st.text(max_size=4), inner, max_size=3), max_leaves=8)


def sections(names: list[str]) -> st.SearchStrategy[dict]:
    """Mappings mostly of known sections and keys, with values of any shape."""
    def section(name: str) -> st.SearchStrategy:
        keys = st.sampled_from(SECTION_KEYS.get(name, ["x"])) | st.text(max_size=5)
        body = st.dictionaries(keys, values, max_size=5)
        if name == "cluster":
            body = st.builds(lambda kind, rest: {**rest, "kind": kind} if kind else rest,
                             st.sampled_from(["k3d", "gke", None, "eks"]), body)
        return body | values
    return st.dictionaries(st.sampled_from(names) | st.text(max_size=5), st.just(None)).flatmap(
        lambda chosen: st.fixed_dictionaries({name: section(name) for name in chosen}))


# Keys an error may name though the mapping lacks them: required ones, and the keys rules across the
# sections name (serving.runtime tensorflow refuses the default canaryPercent; monitoring.enabled false
# refuses gke's default serving.autoscaling.metric).
ALWAYS_NAMED = {"cluster", "gcp:project", "gcp:region", "pipeline.rollout.canaryPercent",
                "serving.autoscaling.metric"}


def assert_names_a_key(error: ConfigError, raw: Any, also: set[str]) -> None:
    assert names_a_path(str(error), {*map(str, raw), *map(repr, raw), *also, "config"}), str(error)
    assert "\n" not in str(error)


@FUZZ
@given(sections(TOP_KEYS))
def test_any_stack_mapping_parses_or_names_a_key(raw):
    try:
        parse_stack_config(raw)
    except ConfigError as error:
        assert_names_a_key(error, raw, ALWAYS_NAMED)


@FUZZ
@given(sections(TOP_KEYS))
def test_any_pulumi_config_map_parses_or_names_a_key(raw):
    pulumi_values = as_pulumi_values(raw)
    try:
        parse_stack_config(from_pulumi_values(pulumi_values))
    except ConfigError as error:
        assert_names_a_key(error, raw, ALWAYS_NAMED)


@FUZZ
@given(st.dictionaries(st.sampled_from(["dist-ml:", "gcp:", "aws:", ""]).flatmap(
    lambda prefix: st.text(max_size=6).map(lambda name: prefix + name)), st.text(max_size=12), max_size=6))
def test_any_text_pulumi_hands_over_is_read_or_named(pulumi_values):
    try:
        raw = from_pulumi_values(pulumi_values)
    except ConfigError as error:
        named = {key_path([key.removeprefix("dist-ml:")]) for key in pulumi_values}
        # The key comes first; it may itself contain ": ", so match whole names, not a split.
        assert any(str(error).startswith(name + ": ") for name in named), str(error)
        return
    assert set(raw) == {key.partition(":")[2] if key.startswith("dist-ml:") else key
                        for key in pulumi_values if key.partition(":")[0] in program.NAMESPACES}


def valid_stacks() -> st.SearchStrategy[dict]:
    projects = st.from_regex(GCP_PROJECT, fullmatch=True).filter(lambda p: p not in PLACEHOLDER_PROJECTS)
    pool = st.fixed_dictionaries({}, optional={
        "machineType": st.sampled_from(["e2-standard-8", "g2-standard-4"]),
        "minNodes": st.integers(0, 2), "maxNodes": st.integers(2, 9)})
    gke = st.fixed_dictionaries({
        "cluster": st.fixed_dictionaries({"kind": st.just("gke")}, optional={
            "name": st.from_regex(r"^[a-z]([-a-z0-9]{0,22}[a-z0-9])?$", fullmatch=True),
            "releaseChannel": st.sampled_from(["RAPID", "STABLE"]), "deletionProtection": st.booleans(),
            "endpoint": st.one_of(st.just({"public": False}), st.fixed_dictionaries({
                "public": st.just(True), "domain": st.sampled_from(["models.example.com", "a.b.example.org"]),
                "allowedSourceRanges": st.lists(st.ip_addresses(v=4).map(lambda a: f"{a}/32"),
                                                min_size=1, max_size=12)})),
            "nodePools": st.fixed_dictionaries({}, optional={
                "cpu": pool.map(lambda p: {**p, "minNodes": max(1, p.get("minNodes", 1))}),
                "spot": pool.map(lambda p: {**p, "enabled": True}),
                "gpu": pool.map(lambda p: {**p, "enabled": True, "acceleratorCount": 2})})}),
        "gcp:project": projects, "gcp:region": st.sampled_from(["us-central1", "europe-west4"])},
        optional={"storage": st.fixed_dictionaries({}, optional={
                      "checkpointRetentionDays": st.integers(1, 99)}),
                  "monitoring": st.fixed_dictionaries({}, optional={"enabled": st.booleans()})}).map(
        lambda raw: {**raw, "serving": {"autoscaling": {"metric": "cpu"}}}  # no Prometheus to read load from
        if raw.get("monitoring", {}).get("enabled") is False else raw)
    k3d = st.fixed_dictionaries({
        "cluster": st.fixed_dictionaries({"kind": st.just("k3d")}, optional={
            "servers": st.integers(1, 3).map(float), "ports": st.lists(st.fixed_dictionaries(
                {"host": st.integers(1, 65535), "container": st.integers(1, 65535)}, optional={
                    "hostAddress": st.ip_addresses(v=4).map(str)}), max_size=2)})},
        optional={"storage": st.fixed_dictionaries({}, optional={
                      "size": st.sampled_from(["10Gi", "1.5Ti", 5]), "accessMode": st.just("ReadWriteOnce")}),
                  "namespace": st.from_regex(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", fullmatch=True),
                  "pipeline": st.fixed_dictionaries({}, optional={"runOnUp": st.booleans(),
                                                                  "workers": st.integers(1, 8)})})
    return gke | k3d.map(with_room_for_its_workers)


def with_room_for_its_workers(raw: dict) -> dict:
    """A k3d stack whose quota holds a TrainJob of its workers (each asks for 1 CPU and 2Gi by default)."""
    workers = raw.get("pipeline", {}).get("workers", 2)
    quota = {"cpu": workers, "memory": f"{2 * workers}Gi"}
    return {**raw, "cluster": {**raw["cluster"], "trainingQuota": quota}}


@FUZZ
@given(valid_stacks())
def test_any_valid_stack_round_trips_through_its_yaml_and_pulumi_forms(raw):
    config = parse_stack_config(raw)
    dumped = stack_settings().dump_python(settings_of(raw), by_alias=True, mode="json")
    assert parse_stack_config(yaml.safe_load(yaml.safe_dump(dumped))) == config
    assert parse_stack_config(from_pulumi_values(as_pulumi_values(dumped))) == config


# --- JSON Schema and the configuration reference ------------------------------------------------

def printed(main) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["--schema"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize(("main", "path"), [(stack_config.main, "stacks/stack.schema.json"),
                                            (pipeline_config.main, "pipeline/config.schema.json")])
def test_the_committed_schemas_are_the_models(main, path):
    assert printed(main) == json.loads((REPO_ROOT / path).read_text()), (
        f"regenerate: python -m {main.__module__} --schema > {path}")


@pytest.mark.parametrize("stack", STACK_FILES)
def test_the_stack_files_validate_against_the_schema_they_name(stack):
    text = STACK_FILES[stack].read_text()
    assert text.startswith("# yaml-language-server: $schema=./stacks/stack.schema.json\n")
    validator = jsonschema.Draft202012Validator(stack_config.stack_file_schema())
    document = yaml.safe_load(text)
    assert list(validator.iter_errors(document)) == []
    # Not blind: a key of the other kind, a secret value, a bad number.
    document["config"]["dist-ml:cluster"]["agents" if stack == "gke" else "nodePools"] = 1
    assert list(validator.iter_errors(document))
    ok = yaml.safe_load(text)
    ok["config"]["dist-ml:namespace"] = {"secure": "v1:abc"}
    assert list(validator.iter_errors(ok)) == []
    ok["config"]["dist-ml:pipeline"]["workers"] = 0
    assert list(validator.iter_errors(ok))


def test_the_pipeline_schema_checks_a_config_file():
    validator = jsonschema.Draft202012Validator(pipeline_config.config_file_schema())
    assert list(validator.iter_errors({"pipeline": {"workers": 3, "epochs": None}, "serving": {}})) == []
    for bad in ({"pipeline": {"epochs": 0}}, {"serving": {"scaleMetric": "rps"}}, {"pipline": {}}):
        assert list(validator.iter_errors(bad)), bad


def model_keys(model, seen: set[str]) -> set[tuple[str, str]]:
    """(model, key) for every key of `model` and of the sections below it, each model once; keys a
    section refuses (NOT_HERE) are not its keys."""
    if model.__name__ in seen:
        return set()
    seen.add(model.__name__)
    keys = set()
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key in model.NOT_HERE:
            continue
        keys.add((model.__name__, key))
        section = section_at(model, [key])
        if section is not None:
            keys |= model_keys(section, seen)
    return keys


def test_the_configuration_reference_covers_every_key_of_every_model():
    """The reference is generated from the models (tests/test_docs.py keeps the committed page equal to
    the generator's), so what is left to check is that the generator leaves no model's key out."""
    seen: set[str] = set()
    expected = model_keys(ConfigFile, seen)
    for model in stack_models().values():
        expected |= model_keys(model, seen)
    _, documented = docs_reference.configuration_page()
    assert documented == expected
    assert ("StackPipeline", "runOnUp") in documented and ("GkeStack", "gcp:project") in documented


# --- The Pulumi values: through pulumi.Config, secrets kept secret ---------------------------------

@pytest.fixture
def engine_env(monkeypatch):
    """No config from the environment: the tests set the engine's map themselves."""
    for name in ("PULUMI_CONFIG", "PULUMI_CONFIG_SECRET_KEYS"):
        monkeypatch.delenv(name, raising=False)
    yield
    pulumi.runtime.set_all_config({}, [])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["dist-ml:", "gcp:", "aws:", "kubernetes:"]).flatmap(
    lambda prefix: st.from_regex(r"^[a-zA-Z][a-zA-Z0-9]{0,8}$", fullmatch=True).map(lambda n: prefix + n)),
    st.text(max_size=10), max_size=6), st.data())
def test_the_reader_returns_the_projects_and_gcps_values_and_which_are_secret(engine_env, config, data):
    secret = data.draw(st.lists(st.sampled_from(sorted(config)), unique=True) if config else st.just([]))
    pulumi.runtime.set_all_config(dict(config), secret)
    read = program.read_stack_values()
    ours = {key: value for key, value in config.items() if key.split(":")[0] in program.NAMESPACES}
    assert read.values == ours
    assert read.secret_keys == {key for key in secret if key in ours}


def test_the_reader_sees_what_the_language_host_passes_in_the_environment(engine_env, monkeypatch):
    pulumi.runtime.set_all_config({}, [])
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({"dist-ml:namespace": "ml", "aws:region": "x"}))
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", json.dumps(["dist-ml:namespace"]))
    read = program.read_stack_values()
    assert read.values == {"dist-ml:namespace": "ml"} and read.secret_keys == {"dist-ml:namespace"}


def exported_outputs(stack: str, values: dict[str, str], secret_keys: list[str],
                     monkeypatch) -> dict[str, bool]:
    """Runs the stack's program under mocks; returns each exported output's secretness."""
    exports: dict[str, Any] = {}
    monkeypatch.setattr(pulumi, "export", lambda name, value: exports.__setitem__(name, value))
    render.install_mocks(stack, values)
    pulumi.runtime.set_all_config(dict(values), secret_keys)
    secrets: dict[str, bool] = {}

    @pulumi.runtime.test
    def run():
        program.main()

        async def collect() -> None:
            for name, value in exports.items():
                secrets[name] = await pulumi.Output.from_input(value).is_secret()

        return pulumi.Output.from_input(collect())

    run()
    asyncio.set_event_loop(asyncio.new_event_loop())
    return secrets


@pytest.mark.parametrize("stack", STACK_FILES)
def test_a_secret_config_value_leaves_the_program_only_as_secret_outputs(stack, engine_env, monkeypatch):
    values = {**file_values(stack), "dist-ml:namespace": "ml-team"}
    plain = exported_outputs(stack, values, [], monkeypatch)
    assert plain["kubeconfig"] and not plain["inferenceService"]  # the check sees both kinds
    secret = exported_outputs(stack, values, ["dist-ml:namespace"], monkeypatch)
    assert set(secret) == set(plain) and all(secret.values()), secret


@pytest.mark.parametrize("value", ["", "{}"])
def test_an_empty_value_stops_the_program_naming_the_key(value, engine_env):
    values = {**file_values("local"), "dist-ml:storage": value}
    assert config_error_before_any_resource("local", values).startswith(
        "stack config: storage: is set but empty; give it a value or remove it "
        "(pulumi config rm dist-ml:storage)")
