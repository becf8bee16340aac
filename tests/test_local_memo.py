"""The local engine's memo keys: what a change of configuration retrains, and what it leaves memoized.
(tests/test_pipeline_local.py runs the memoized pipeline end to end.)"""

from __future__ import annotations

from pathlib import Path

from pipeline import local
from pipeline.config import parse_config

VARIANTS = ["cnn", "cnn_dropout"]


def train_keys(tmp_path: Path, **pipeline: object) -> dict[str, str]:
    """Each train step's memo key, for one and the same ingested dataset."""
    config = parse_config({"pipeline": {"variants": VARIANTS, "storageRoot": str(tmp_path), **pipeline}})
    run = local.LocalRun(config, print_line=lambda line: None)
    run.output_digests["ingest"] = "the dataset's digest"
    return {step.name: run.key_of(step) for step in run.steps if step.name.startswith("train-")}


def test_a_variant_switched_to_parameter_servers_retrains_and_only_it(tmp_path):
    before, after = train_keys(tmp_path), train_keys(tmp_path, strategy={"cnn": "parameter-server"})
    assert after["train-cnn"] != before["train-cnn"]
    assert after["train-cnn-dropout"] == before["train-cnn-dropout"]


def test_more_parameter_servers_retrain_a_variant_under_parameter_servers(tmp_path):
    one = train_keys(tmp_path, strategy={"cnn": "parameter-server"})
    two = train_keys(tmp_path, strategy={"cnn": "parameter-server"}, parameterServers=2)
    assert two["train-cnn"] != one["train-cnn"]
    assert two["train-cnn-dropout"] == one["train-cnn-dropout"]
