"""TF_CONFIG: parsed as TFJob sets it, built from what a TrainJob's pod knows (JobSet's environment),
and the same environment given to local processes."""

from __future__ import annotations

import json

import pytest

from trainer import cluster as tf_cluster
from trainer.cluster import (
    COMPLETION_INDEX_ENV,
    JOBSET_NAME_ENV,
    LOCAL,
    LOCAL_ADDRESSES_ENV,
    NUM_NODES_ENV,
    PARAMETER_SERVERS_ENV,
    PORT_ENV,
    REPLICATED_JOB_ENV,
    TF_CONFIG,
    ClusterConfigError,
    ClusterSpec,
    cluster_from_environment,
    local_tasks,
    parse_tf_config,
    wait_for_own_host,
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




def pod_env(job: str = "node", index: int = 0, nodes: int = 3, parameter_servers: int | None = None,
            **changes: str | None) -> dict[str, str]:
    """What a pod of TrainJob `run-1-train-cnn` gets: the runtime's environment (engines/trainjob.py) and
    the completion index Kubernetes sets."""
    env = {JOBSET_NAME_ENV: "run-1-train-cnn", REPLICATED_JOB_ENV: job, COMPLETION_INDEX_ENV: str(index),
           NUM_NODES_ENV: str(nodes), PORT_ENV: "2222"}
    if parameter_servers is not None:
        env[PARAMETER_SERVERS_ENV] = str(parameter_servers)
    env.update(changes)
    return {key: value for key, value in env.items() if value is not None}


def test_a_trainjob_pod_builds_the_tf_config_of_its_jobset_from_jobsets_hostnames():
    specs = [cluster_from_environment(pod_env(index=index)) for index in range(3)]
    hosts = [f"run-1-train-cnn-node-0-{i}.run-1-train-cnn:2222" for i in range(3)]
    assert all(spec.cluster == {"worker": hosts} for spec in specs)
    assert [(s.task_type, s.task_index, s.is_chief) for s in specs] == [
        ("worker", 0, True), ("worker", 1, False), ("worker", 2, False)]
    assert {s.num_workers for s in specs} == {3} and not specs[0].uses_parameter_servers


def test_under_parameter_servers_node_0_is_the_chief_the_other_nodes_work_and_ps_pods_serve():
    pods = [pod_env("node", i, nodes=3, parameter_servers=2) for i in range(3)]
    pods += [pod_env("ps", i, nodes=3, parameter_servers=2) for i in range(2)]
    specs = [cluster_from_environment(env) for env in pods]
    node = "run-1-train-cnn-node-0-{}.run-1-train-cnn:2222"
    ps = "run-1-train-cnn-ps-0-{}.run-1-train-cnn:2222"
    assert {json.dumps(s.cluster, sort_keys=True) for s in specs} == {json.dumps(
        {"chief": [node.format(0)], "worker": [node.format(1), node.format(2)],
         "ps": [ps.format(0), ps.format(1)]}, sort_keys=True)}
    assert [(s.task_type, s.task_index) for s in specs] == [
        ("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("ps", 1)]
    assert [s.is_chief for s in specs] == [True, False, False, False, False]
    assert {(s.num_workers, s.num_parameter_servers) for s in specs} == {(2, 2)}


def test_tf_config_wins_over_a_jobset_environment_and_neither_means_one_local_worker():
    tfjob = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    spec = cluster_from_environment({**pod_env(), TF_CONFIG: json.dumps(tfjob)})
    assert spec.cluster == tfjob["cluster"] and spec.task_index == 1
    assert cluster_from_environment({"HOME": "/home/trainer"}) is tf_cluster.LOCAL


@pytest.mark.parametrize("env, message", [
    (pod_env(**{NUM_NODES_ENV: None}), f"{NUM_NODES_ENV} unset"),
    (pod_env(**{JOBSET_NAME_ENV: None, COMPLETION_INDEX_ENV: None}),
     f"{JOBSET_NAME_ENV}, {COMPLETION_INDEX_ENV} unset"),
    (pod_env(**{COMPLETION_INDEX_ENV: "x"}), f"{COMPLETION_INDEX_ENV} must be a whole number, got 'x'"),
    (pod_env(index=3, nodes=3), f"{COMPLETION_INDEX_ENV} 3 is not in 0..2 \\(the node job's pods\\)"),
    (pod_env("ps", 2, parameter_servers=2),
     f"{COMPLETION_INDEX_ENV} 2 is not in 0..1 \\(the ps job's pods\\)"),
    (pod_env(nodes=0), f"{NUM_NODES_ENV} must be >= 1, got 0"),
    (pod_env(nodes=1, parameter_servers=1), f"{NUM_NODES_ENV} must be >= 2, got 1"),
    (pod_env("launcher"),
     f"{REPLICATED_JOB_ENV} must be node \\({PARAMETER_SERVERS_ENV} is 0\\), got 'launcher'"),
    (pod_env("ps"), f"{REPLICATED_JOB_ENV} must be node"),
    (pod_env(**{PORT_ENV: "70000"}), f"{PORT_ENV} must be a TCP port, got 70000"),
    (pod_env(**{PARAMETER_SERVERS_ENV: "-1"}), f"{PARAMETER_SERVERS_ENV} must be >= 0, got -1"),
    (pod_env(**{LOCAL_ADDRESSES_ENV: "{not json"}), f"{LOCAL_ADDRESSES_ENV} is not JSON"),
    (pod_env(**{LOCAL_ADDRESSES_ENV: '{"elsewhere": "127.0.0.1:1"}'}),
     f"{LOCAL_ADDRESSES_ENV} has no address for run-1-train-cnn-node-0-0.run-1-train-cnn"),
])
def test_a_malformed_or_inconsistent_pod_environment_is_one_clear_error(env, message):
    with pytest.raises(ClusterConfigError, match=f"^malformed TrainJob pod environment: {message}"):
        cluster_from_environment(env)


def test_local_tasks_get_a_trainjob_pods_environment_with_each_hostname_on_its_own_port():
    tasks = local_tasks(3)
    assert [(t.task_type, t.index) for t in tasks] == [("worker", 0), ("worker", 1), ("worker", 2)]
    specs = [cluster_from_environment(t.env) for t in tasks]
    workers = specs[0].cluster["worker"]
    assert len(set(workers)) == 3 and all(w.startswith("127.0.0.1:") for w in workers)
    assert all(s.cluster == specs[0].cluster for s in specs)
    assert [s.is_chief for s in specs] == [True, False, False]
    pod_keys = {JOBSET_NAME_ENV, REPLICATED_JOB_ENV, COMPLETION_INDEX_ENV, NUM_NODES_ENV, PORT_ENV,
                PARAMETER_SERVERS_ENV}
    assert all(set(t.env) == pod_keys | {LOCAL_ADDRESSES_ENV} for t in tasks)  # and no TF_CONFIG


def test_local_parameter_server_tasks_are_the_runtimes_chief_workers_and_ps_on_distinct_ports():
    tasks = local_tasks(2, parameter_servers=1)
    assert [(t.task_type, t.index) for t in tasks] == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert [(t.env[REPLICATED_JOB_ENV], t.env[COMPLETION_INDEX_ENV]) for t in tasks] == [
        ("node", "0"), ("node", "1"), ("node", "2"), ("ps", "0")]
    specs = [cluster_from_environment(t.env) for t in tasks]
    addresses = [a for kind in ("chief", "worker", "ps") for a in specs[0].cluster[kind]]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert all(s.cluster == specs[0].cluster for s in specs)
    assert [s.is_chief for s in specs] == [True, False, False, False]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_pod_waits_for_its_own_name_and_fails_naming_it_when_it_never_resolves():
    """JobSet's hostname of the pod itself resolves seconds after it starts; one that never does (a
    subdomain that is not the headless Service's) fails the pod naming it, not a hang. Peers are not
    waited for: a peer's node may still be on its way."""
    cluster = ClusterSpec(cluster={"worker": ["job-node-0-0.job:2222", "job-node-0-1.job:2222"]},
                          task_type="worker", task_index=1)
    clock, late = FakeClock(), {"job-node-0-1.job": 10.0, "job-node-0-0.job": float("inf")}

    def resolve(host: str) -> None:
        if clock.now < late[host]:
            raise OSError(f"[Errno -2] Name or service not known: {host}")

    wait_for_own_host(cluster, timeout=30, resolve=resolve, clock=clock, sleep=clock.sleep)
    assert 10.0 <= clock.now < 30
    late["job-node-0-1.job"] = float("inf")
    clock.now = 0.0
    with pytest.raises(ClusterConfigError, match=r"own host job-node-0-1\.job does not resolve .*subdomain"):
        wait_for_own_host(cluster, timeout=30, resolve=resolve, clock=clock, sleep=clock.sleep)
    wait_for_own_host(LOCAL)  # localhost


def test_a_cluster_the_pod_cannot_form_is_a_users_mistake_that_no_restart_mends():
    """Exit status 2, JobSet's usage-error rule: the set fails at once instead of restarting."""
    from common.cli import UsageError

    assert issubclass(ClusterConfigError, UsageError)
