"""The training engines behind one interface (engines/): every registered engine gives what the stacks,
the Argo renderer, the workflow's role and the train step ask of it; no module outside engines/ tests
an engine's name; a toy third engine plugs in with one module and its registration, and the stacks
render without the TFJob engine."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from stack_checks import embedded, stack_values, template_of

from common.cluster_names import CustomResource
from common.cluster_target import ClusterTarget
from engines import DEFAULT_ENGINE, ENGINES, engine_of_job
from engines.base import Install, KustomizeInstall, MetricsSource, TrainingEngine, TrainingSpec
from infra.pipeline import workflow_pod_rules
from pipeline import argo
from pipeline.config import parse_config
from stacks import render

SPEC = TrainingSpec(
    name="run-1-train-cnn",
    step="train-cnn",
    command=("python", "-m", "trainer.train"),
    workers=2,
    parameter_servers=0,
    resources={"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
    retries=2,
    labels={"workflows.argoproj.io/workflow": "run-1"},
)
# What may name an engine: the engines themselves, and tests (which check each).
ENGINE_HOMES = ("engines/", "tests/")
PACKAGES = (
    "common",
    "trainer",
    "serving",
    "cluster_steps",
    "pipeline",
    "infra",
    "stacks",
    "tools",
    "benchmarks",
)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_engine_gives_what_its_callers_ask(name):
    engine = ENGINES[name]
    assert engine.name == name and engine_of_job(engine.job_resource.kind) is engine
    job = engine.job(SPEC, ClusterTarget())
    assert (job["kind"], job["metadata"]["name"]) == (engine.job_resource.kind, SPEC.name)
    assert job["apiVersion"] == f"{engine.job_resource.group}/{engine.job_resource.version}"
    assert len(SPEC.name) <= engine.name_limit(job) and engine.longest_name(2, 0) >= len(SPEC.name)
    assert engine.progress(job, [])  # says something before the controllers do
    for install in engine.installs(
        {key: "v1.0.0" for key in engine.stack_keys.get("platform", ())}, "dist-ml"
    ):
        assert isinstance(install, Install.__args__)
    assert isinstance(engine.metrics(), MetricsSource)
    title, series = engine.dashboard("dist-ml")
    assert title and series
    # The train step creates, reads and deletes its job, and lists its pods: the role grants exactly that.
    calls = set(engine.step_calls)
    job_calls = {
        (engine.job_resource.group, engine.job_resource.plural, verb) for verb in ("get", "create", "delete")
    }
    assert job_calls | {("", "pods", "list")} <= calls
    granted = {
        (group, resource, verb)
        for rule in workflow_pod_rules(engine)
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert calls <= granted


def names_an_engine(node: ast.AST) -> bool:
    """A comparison with an engine's name, or a use of a constant that holds one."""
    if isinstance(node, ast.Compare):
        return any(
            isinstance(side, ast.Constant) and side.value in ENGINES
            for side in (node.left, *node.comparators)
        )
    return isinstance(node, ast.Name) and node.id.endswith("_ENGINE") and node.id != "DEFAULT_ENGINE"


def test_no_module_outside_the_engines_tests_an_engines_name():
    """Adding or dropping an engine touches engines/ alone: nothing else compares with an engine's name
    or keeps a constant of one (the registry, DEFAULT_ENGINE, is how the rest names them)."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            found += [
                f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
                for node in ast.walk(tree)
                if names_an_engine(node)
            ]
    assert found == []


TOY = CustomResource("ToyJob", "toy.example.com", "v1", "toyjobs")


class ToyEngine(TrainingEngine):
    """A third engine, as docs/extending/engine.md builds one: a job kind, its install, its metrics."""

    name = "toy"
    job_resource = TOY
    succeeded = "Done"
    pod_label = "toy.example.com/job"
    stack_keys = {}

    def job(self, spec: TrainingSpec, target: ClusterTarget) -> dict:
        return {
            "apiVersion": "toy.example.com/v1",
            "kind": "ToyJob",
            "metadata": {"name": spec.name},
            "spec": {"command": list(spec.command), "workers": spec.workers},
        }

    def installs(self, versions: dict[str, str], namespace: str) -> list[Install]:
        return [KustomizeInstall("toy-operator", "https://example.com/toy-operator", "v1.0.0", "config")]

    def metrics(self) -> MetricsSource:
        return MetricsSource("toy-operator", "toy-system", {"app": "toy-operator"}, {"port": "metrics"})

    def dashboard(self, namespace: str) -> tuple[str, dict[str, str]]:
        return "Toy jobs", {"running": "sum(toy_jobs_running)"}

    def progress(self, job: dict, pods: list[dict]) -> str:
        return f"{len(pods)} pod(s)"


def local_values(**pipeline: object) -> dict[str, str]:
    values = stack_values(REPO_ROOT / "Pulumi.local.yaml", pipeline=pipeline)
    cluster = json.loads(values["dist-ml:cluster"])
    cluster.pop("trainingQuota", None)  # a queued engine's key
    platform = {
        key: value
        for key, value in json.loads(values["dist-ml:platform"]).items()
        if key not in ("trainerVersion", "kueueVersion")
    }
    return {**values, "dist-ml:cluster": json.dumps(cluster), "dist-ml:platform": json.dumps(platform)}


def test_a_third_engine_plugs_in_with_its_module_and_its_registration(monkeypatch):
    monkeypatch.setitem(ENGINES, "toy", ToyEngine())
    config = parse_config({"pipeline": {"engine": "toy", "variants": ["cnn"]}})
    toy = embedded(argo.workflow_template(config), "train-cnn")
    assert toy["kind"] == "ToyJob" and toy["spec"]["workers"] == 2
    rendered = render.render("local", local_values(engine="toy", variants=["cnn"]))
    directories = [r.inputs["directory"] for r in rendered.of_type("kubernetes:kustomize/v2:Directory")]
    assert "https://example.com/toy-operator.git/config?ref=v1.0.0" in directories
    assert not [o for o in rendered.objects if o["kind"] in ("ClusterQueue", "ClusterTrainingRuntime")]
    assert embedded(template_of(rendered), "train-cnn")["kind"] == "ToyJob"


def test_without_the_tfjob_engine_both_stacks_render_with_trainjob(monkeypatch):
    monkeypatch.delitem(ENGINES, "tfjob")
    for stack in ("local", "gke"):
        values = stack_values(REPO_ROOT / f"Pulumi.{stack}.yaml")
        if stack == "gke":
            values.update({"gcp:project": "dist-ml-test-4821", "gcp:region": "us-central1"})
        rendered = render.render(stack, values)
        assert (
            embedded(template_of(rendered), "train-cnn")["kind"] == ENGINES[DEFAULT_ENGINE].job_resource.kind
        )


def test_the_extending_page_walks_every_method_an_engine_has(tmp_path: Path):
    page = (REPO_ROOT / "docs" / "extending" / "engine.md").read_text()
    declared = {
        name
        for name, value in vars(TrainingEngine).items()
        if not name.startswith("_") and (callable(value) or name in TrainingEngine.__annotations__)
    }
    assert sorted(name for name in declared if not re.search(rf"`{name}[`(]", page)) == []
