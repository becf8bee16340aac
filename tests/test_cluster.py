"""TF_CONFIG parsing and generation."""

from __future__ import annotations

import json

import pytest

from trainer.cluster import (
    ClusterConfigError,
    local_parameter_server_tasks,
    local_tf_configs,
    parse_tf_config,
)


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
    ('{"cluster": {"worker": ["a:1"], "evaluator": ["e:2"]}, "task": {"type": "worker", "index": 0}}',
     "task types \\['evaluator'\\] are not supported; use chief, worker, ps"),
    ('{"cluster": {"worker": ["a:1"], "ps": ["p:2"]}, "task": {"type": "worker", "index": 0}}',
     "a cluster with ps tasks needs a chief and worker tasks"),
    ('{"cluster": {"chief": ["c:1"], "ps": ["p:2"]}, "task": {"type": "chief", "index": 0}}',
     "a cluster with ps tasks needs a chief and worker tasks"),
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


def test_a_cluster_with_ps_tasks_counts_only_its_workers_and_its_chief_coordinates():
    cluster = {"chief": ["c:1"], "worker": ["w:2", "w:3"], "ps": ["p:4", "p:5"]}
    specs = {(kind, index): parse_tf_config(json.dumps({"cluster": cluster,
                                                         "task": {"type": kind, "index": index}}))
             for kind, addresses in cluster.items() for index in range(len(addresses))}
    assert all(s.uses_parameter_servers for s in specs.values())
    assert {(s.num_workers, s.num_parameter_servers) for s in specs.values()} == {(2, 2)}
    assert [key for key, s in specs.items() if s.is_chief] == [("chief", 0)]
    assert not parse_tf_config(json.dumps({"cluster": {"worker": ["a:1"]},
                                           "task": {"type": "worker", "index": 0}})).uses_parameter_servers


def test_local_parameter_server_tasks_are_a_tfjobs_chief_workers_and_ps_on_distinct_ports():
    tasks = local_parameter_server_tasks(num_workers=2, num_ps=1)
    assert [(t.task_type, t.index) for t in tasks] == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    configs = [json.loads(t.tf_config) for t in tasks]
    cluster = configs[0]["cluster"]
    addresses = [a for kind in ("chief", "worker", "ps") for a in cluster[kind]]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert all(c["cluster"] == cluster for c in configs)
    assert [c["task"] for c in configs] == [{"type": t.task_type, "index": t.index} for t in tasks]
    assert [parse_tf_config(t.tf_config).is_chief for t in tasks] == [True, False, False, False]
