"""Steps have a kind: each engine maps a kind to how it runs or renders it, never a name; the order
and its checks come from graphlib when the pipeline is defined."""

from __future__ import annotations

import dataclasses

import pytest

from common import cluster_names
from pipeline import argo, definition, local
from pipeline.config import PipelineConfig, parse_config
from pipeline.definition import PipelineError, Step, StepKind, build_steps, in_dependency_order

CONFIG = parse_config({"pipeline": {"variants": ["cnn", "cnn_batchnorm"]}})
ENGINES = {"argo": argo.TEMPLATES, "local": local.HANDLERS}


def step(name: str, *depends: str, kind: StepKind = StepKind.TRAIN) -> Step:
    return Step(name=name, kind=kind, image="trainer", module="trainer.train", args=(), inputs=(),
                outputs=(), depends=depends, resources=PipelineConfig().step_resources, retries=0)


def test_each_step_says_what_it_is():
    kinds = {s.name: s.kind for s in build_steps(CONFIG, "/data")}
    assert kinds == {"ingest": StepKind.INGEST, "train-cnn": StepKind.TRAIN,
                     "train-cnn-batchnorm": StepKind.TRAIN, "select": StepKind.SELECT,
                     "serve": StepKind.SERVE, "rollout": StepKind.ROLLOUT}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_handles_every_kind(engine):
    assert set(ENGINES[engine]) == set(StepKind)


def test_a_kind_must_be_a_step_kind():
    with pytest.raises(PipelineError, match="step odd: kind 'train' is not a StepKind"):
        step("odd", kind="train")


def test_steps_come_in_dependency_order_ties_in_the_order_given():
    given = [step("serve", "select"), step("select", "b", "a"), step("b", "ingest"), step("a", "ingest"),
             step("ingest")]
    assert [s.name for s in in_dependency_order(given)] == ["ingest", "b", "a", "select", "serve"]


@pytest.mark.parametrize(("steps", "message"), [
    ([step("a", "b"), step("b", "a")], r"steps form a cycle: (a -> b -> a|b -> a -> b)"),
    ([step("a", "a")], r"steps form a cycle: a -> a"),
    ([step("a"), step("select", "a", "train-vgg")], r"step select: depends on 'train-vgg', which is no step"),
    ([step("a"), step("a")], r"step a: defined twice"),
])
def test_a_pipeline_that_cannot_run_is_refused_when_defined(steps, message):
    with pytest.raises(PipelineError, match=message):
        in_dependency_order(steps)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_kind_an_engine_cannot_handle_is_an_error_naming_the_step(engine, monkeypatch):
    handlers = ENGINES[engine]
    monkeypatch.delitem(handlers, StepKind.TRAIN)
    with pytest.raises(PipelineError, match=f"step train-cnn: the {engine} engine cannot run kind 'train'"):
        if engine == "argo":
            argo.workflow_template(CONFIG)
        else:
            local.LocalRun(CONFIG, print_line=lambda line: None)


def test_argo_renders_by_kind_and_wires_parameters_whatever_the_steps_are_called(monkeypatch):
    monkeypatch.setattr(definition, "SELECT", "pick")
    monkeypatch.setattr(definition, "SERVE", "roll-out")
    template = argo.workflow_template(CONFIG)
    templates = {t["name"]: t for t in template["spec"]["templates"]}
    assert templates["pick"]["outputs"]["parameters"][0]["name"] == argo.VERSION_PARAMETER
    assert templates["roll-out"]["container"]["command"] == ["python", "-m", cluster_names.RELEASE_MODULE]
    assert argo.applied_manifest(templates["train-cnn"])["kind"] == "TrainJob"
    (task,) = [t for t in templates["pipeline"]["dag"]["tasks"] if t["name"] == "roll-out"]
    assert task["arguments"]["parameters"] == [
        {"name": "version", "value": "{{tasks.pick.outputs.parameters.version}}"}]


def test_an_input_parameter_no_dependency_outputs_is_an_error(monkeypatch):
    def serve_after_ingest(config: PipelineConfig, root: str) -> list[Step]:
        return [dataclasses.replace(s, depends=("ingest",)) if s.kind is StepKind.SERVE else s
                for s in build_steps(config, root)]

    monkeypatch.setattr(argo, "build_steps", serve_after_ingest)
    with pytest.raises(PipelineError, match=r"step serve: input parameter 'version' is output by 0 of "
                                            r"its dependencies \(ingest\); it needs exactly one"):
        argo.workflow_template(CONFIG)


def test_the_local_engine_serves_the_serve_kind_after_the_others(tmp_path):
    config = parse_config({"pipeline": {"variants": ["cnn", "cnn_batchnorm"], "storageRoot": str(tmp_path)}})
    run = local.LocalRun(config, print_line=lambda line: None)
    assert [s.kind for s in run.steps] == [StepKind.INGEST, StepKind.TRAIN, StepKind.TRAIN, StepKind.SELECT]
    assert run.serve_step.kind is StepKind.SERVE
    assert [s.kind for s in run.against_server] == [StepKind.ROLLOUT]
