"""TF_CONFIG parsing and generation."""

from __future__ import annotations

import json

import pytest

from trainer.cluster import ClusterConfigError, local_tf_configs, parse_tf_config


def test_no_tf_config_is_one_local_worker():
    for text in (None, ""):
        spec = parse_tf_config(text)
        assert spec.num_workers == 1 and spec.is_chief


def test_worker_zero_is_chief_without_a_chief_task():
    cluster = {"worker": ["a:1", "b:2", "c:3"]}
    specs = [parse_tf_config(json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
             for i in range(3)]
    assert [s.is_chief for s in specs] == [True, False, False]
    assert {s.num_workers for s in specs} == {3}


def test_chief_task_is_chief_and_counts_as_a_worker():
    cluster = {"chief": ["c:1"], "worker": ["w:2"]}
    chief = parse_tf_config(json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    worker = parse_tf_config(json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    assert chief.is_chief and not worker.is_chief
    assert chief.num_workers == 2


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"task": {"type": "worker", "index": 0}}', "'cluster' must be an object"),
    ('{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}',
     "cluster.worker must be a non-empty list"),
    ('{"cluster": {"worker": ["nohost"]}, "task": {"type": "worker", "index": 0}}',
     "'host:port'"),
    ('{"cluster": {"worker": ["a:1"], "ps": ["p:2"]}, "task": {"type": "worker", "index": 0}}',
     "\\['ps'\\] are not supported"),
    ('{"cluster": {"worker": ["a:1"]}}', "'task' must be an object"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}',
     "task.type 'evaluator' is not one of"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}',
     "task.index 1 is not in 0..0"),
])
def test_malformed_tf_config_is_a_clear_error(text, message):
    with pytest.raises(ClusterConfigError, match=f"malformed TF_CONFIG: .*{message}"):
        parse_tf_config(text)


def test_local_tf_configs_give_each_worker_its_task_on_distinct_ports():
    configs = [json.loads(text) for text in local_tf_configs(3)]
    workers = configs[0]["cluster"]["worker"]
    assert len(set(workers)) == 3 and all(w.startswith("127.0.0.1:") for w in workers)
    assert all(c["cluster"]["worker"] == workers for c in configs)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    assert [parse_tf_config(json.dumps(c)).is_chief for c in configs] == [True, False, False]
