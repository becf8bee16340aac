"""The train step (python -m cluster_steps.train) against the real controllers, as the workflow's pods
run it (its own process, the workflow's service account): TrainJob -> Trainer v2 -> JobSet -> Jobs ->
pods, admitted whole by Kueue; KWOK runs the pods, and each test ends them with the exit status a
process would have."""

from __future__ import annotations

import copy
import functools
import json

import pytest
from conftest import REPO_ROOT
from stack_checks import stack_values, train_steps
from tier_helpers import NAMESPACE, by_index, delete_all, end, running_pods, train_step, trainjob

from common.cli import NEVER_SUCCEEDS_EXIT_CODE
from common.cluster_names import WORKFLOW_TEMPLATE_NAME
from common.tracking_names import EXPERIMENT_ENV, PIPELINE_RUN_ENV, TRACKING_URI_ENV, server_uri
from engines.trainjob import JOBSET_NAME_LABEL, PS_COMMAND, RUNTIME_NAME, TRAINING_QUEUE, USAGE_ERROR_EXIT
from stacks import render
from trainer.cluster import (
    LOCAL_ADDRESSES_ENV,
    NODE_JOB,
    REPLICATED_JOB_ENV,
    cluster_from_environment,
    local_tasks,
)

TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
NODES = 2  # Pulumi.local.yaml's pipeline.workers
# How soon a step must end once a controller says the job will never start: one poll of the step's,
# its start, and the controllers' reaction.
FAIL_FAST_SECONDS = 60


@pytest.fixture(autouse=True)
def no_trainjob_left(tier):
    yield
    delete_all(tier.api, TRAINJOB_API, "TrainJob", JOBSET_NAME_LABEL)


TRACKING_ENV = (TRACKING_URI_ENV, EXPERIMENT_ENV, PIPELINE_RUN_ENV)


def resolved_env(pod: dict, container: str) -> dict[str, str]:
    """The container's environment as the kubelet gives it: values, the downward API's fields from the
    pod's own metadata, and an Indexed Job's JOB_COMPLETION_INDEX."""
    (spec,) = [c for c in pod["spec"]["containers"] if c["name"] == container]
    env = {"JOB_COMPLETION_INDEX": pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]}
    for item in spec.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        field, _, key = item["valueFrom"]["fieldRef"]["fieldPath"].partition("['")
        env[item["name"]] = pod["metadata"][field.removeprefix("metadata.")][key.removesuffix("']")]
    return env


def test_a_trainjob_runs_whole_on_the_runtime_and_the_step_succeeds_when_it_completes(
    tier, rendered, workflow
):
    """The longest TrainJob name a run submits (the workflow's generated name and the longest step's)
    passes JobSet's webhook; Kueue admits its Workload whole; Trainer fills only the runtime's `node`
    container (the TrainJob's command, its resources), the rest is the runtime's (the storage, the
    trainer's identity, one try per pod); every pod has JobSet's hostname and subdomain and builds the
    same TF_CONFIG from what it knows, the very environment the local engine gives its processes."""
    name = longest_trainjob_name(rendered)
    manifest = trainjob(rendered, name, step=longest_train_step(rendered))
    runtime = tier.api.get(TRAINJOB_API, "ClusterTrainingRuntime", manifest["spec"]["runtimeRef"]["name"])
    declared = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"
    ]
    step = train_step(workflow, manifest)
    pods = running_pods(tier.api, name, NODES, step=step)
    (workload,) = tier.api.list(
        "kueue.x-k8s.io/v1beta2",
        "Workload",
        NAMESPACE,
        label_selector=f"kueue.x-k8s.io/job-uid={tier_uid(tier, name)}",
    )
    assert any(c["type"] == "Admitted" and c["status"] == "True" for c in workload["status"]["conditions"])
    environments = []
    for index, pod in sorted(by_index(pods, "node").items()):
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"{name}-node-0-{index}", name)
        assert pod["spec"]["nodeName"] == tier.node_name
        assert pod["spec"]["serviceAccountName"] == declared["serviceAccountName"]
        assert pod["spec"]["restartPolicy"] == "Never"
        assert [v["name"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v] == [
            v["name"] for v in declared["volumes"]
        ]
        (node,) = pod["spec"]["containers"]
        assert node["command"] == manifest["spec"]["trainer"]["command"]
        assert node["resources"] == manifest["spec"]["trainer"]["resourcesPerNode"]
        environments.append(resolved_env(pod, "node"))
    assert_one_cluster_as_local_processes_get(environments, name, parameter_servers=0)
    end(tier.api, pods, 0)
    assert step.wait() == 0, step.output
    assert f"train: TrainJob dist-ml/{name} succeeded" in step.output


def assert_one_cluster_as_local_processes_get(environments: list[dict], jobset: str, parameter_servers: int):
    """Every pod builds the same cluster of JobSet's hostnames, each pod its own task; and trainer.launch
    gives its local processes exactly these environments (and where each hostname listens here). The
    trainer's pods also carry where to track (the workflow's pipeline run, the stack's MLflow server),
    as the local engine gives each step's processes its store."""
    tracked = [{key: env.pop(key) for key in TRACKING_ENV if key in env} for env in environments]
    trainers = [where for where, env in zip(tracked, environments) if env[REPLICATED_JOB_ENV] == NODE_JOB]
    assert len({json.dumps(where, sort_keys=True) for where in trainers}) == 1, trainers
    assert trainers[0][TRACKING_URI_ENV] == server_uri(NAMESPACE)
    assert "{{" not in trainers[0][PIPELINE_RUN_ENV]  # the workflow's name, as Argo substitutes it
    specs = [cluster_from_environment(env) for env in environments]
    assert len({json.dumps(spec.cluster, sort_keys=True) for spec in specs}) == 1
    assert len({(spec.task_type, spec.task_index) for spec in specs}) == len(specs)
    local = [
        {key: value for key, value in task.env.items() if key != LOCAL_ADDRESSES_ENV}
        for task in local_tasks(NODES, parameter_servers, jobset)
    ]
    in_order = functools.partial(json.dumps, sort_keys=True)
    assert sorted(local, key=in_order) == sorted(environments, key=in_order)


def longest_train_step(rendered) -> str:
    return max(train_steps(rendered), key=len)


def longest_trainjob_name(rendered) -> str:
    """The name a run gives the longest step's TrainJob: the workflow's (the template's and the 5
    characters of generateName), then the step's."""
    return f"{WORKFLOW_TEMPLATE_NAME}-x7k2p-{longest_train_step(rendered)}"


def tier_uid(tier, name: str) -> str:
    return tier.api.get(TRAINJOB_API, "TrainJob", name, NAMESPACE)["metadata"]["uid"]


def test_a_lost_pod_restarts_the_whole_set_and_training_goes_on(tier, rendered, workflow):
    step = train_step(workflow, trainjob(rendered, "t2-train-cnn"))
    first = running_pods(tier.api, "t2-train-cnn", NODES, step=step)
    end(tier.api, first[:1], 1)  # one worker lost: its Job fails, JobSet restarts every Job
    second = running_pods(tier.api, "t2-train-cnn", NODES, attempt=1, step=step)
    step.says("(restarted 1 time(s) after a lost pod)")
    end(tier.api, second, 0)
    assert step.wait() == 0, step.output


def test_restarts_are_bounded_by_the_failure_policy_and_the_step_fails_with_jobsets_reason(
    tier, rendered, workflow
):
    step = train_step(workflow, trainjob(rendered, "t3-train-cnn"))
    runtime = tier.api.get(TRAINJOB_API, "ClusterTrainingRuntime", RUNTIME_NAME)
    restarts = runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"]
    for attempt in range(restarts + 1):
        end(tier.api, running_pods(tier.api, "t3-train-cnn", NODES, attempt, step=step)[:1], 1)
    assert step.wait() == 1  # a failed set: Argo retries the step
    assert "train: TrainJob dist-ml/t3-train-cnn failed: ReachedMaxRestarts" in step.output


def test_a_usage_error_fails_the_set_at_once_and_the_step_says_jobsets_rule(tier, rendered, workflow):
    step = train_step(workflow, trainjob(rendered, "t4-train-cnn"))
    end(tier.api, running_pods(tier.api, "t4-train-cnn", NODES, step=step)[:1], USAGE_ERROR_EXIT)
    assert step.wait() == 1
    assert (
        "train: TrainJob dist-ml/t4-train-cnn failed: FailJobSetFailurePolicyAction: applying FailJobSet "
        "failure policy action (first failed job: t4-train-cnn-node-0)"
    ) in step.output
    assert "restarted" not in step.output  # failed at once, not after JobSet's restarts


def test_a_trainjob_beyond_the_free_quota_waits_in_kueues_queue_and_runs_when_quota_frees(
    tier, rendered, workflow
):
    """The local quota holds two 2-node TrainJobs at once; a third waits, admitted when one ends."""
    first = {name: train_step(workflow, trainjob(rendered, name)) for name in ("t5-a", "t5-b")}
    running = {name: running_pods(tier.api, name, NODES, step=step) for name, step in first.items()}
    third = train_step(workflow, trainjob(rendered, "t5-c"))
    third.says(
        f"t5-c: queued by Kueue in {TRAINING_QUEUE}: Pending: couldn't assign flavors to pod set node: "
        "insufficient unused quota"
    )
    end(tier.api, running["t5-a"], 0)
    end(tier.api, running_pods(tier.api, "t5-c", NODES, step=third), 0)
    end(tier.api, running["t5-b"], 0)
    steps = [*first.values(), third]
    assert [step.wait() for step in steps] == [0, 0, 0], [step.output for step in steps]


def test_under_parameter_servers_the_chiefs_success_completes_the_trainjob(tier, workflow):
    """The parameter-server runtime: the node job (chief, workers) and the ps job, whose pods are told the
    node count (the TrainJob's env reaches only `node`); all build one cluster. The chief's pod (node
    index 0) succeeding ends the node Job (its successPolicy) and the JobSet, whose other pods never exit
    by themselves."""
    ps_rendered = render.render(
        "local",
        stack_values(
            REPO_ROOT / "Pulumi.local.yaml", pipeline={"variants": ["cnn"], "strategy": "parameter-server"}
        ),
    )
    (runtime,) = [obj for obj in ps_rendered.objects if obj["kind"] == "ClusterTrainingRuntime"]
    tier.api.apply(runtime)
    manifest = trainjob(ps_rendered, "t6-train-cnn")
    assert manifest["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    step = train_step(workflow, manifest)
    pods = running_pods(tier.api, "t6-train-cnn", NODES + 2, step=step)  # chief, 2 workers, 1 ps
    nodes, servers = by_index(pods, "node"), by_index(pods, "ps")
    assert set(servers) == {0}
    (ps,) = servers[0]["spec"]["containers"]
    assert ps["command"] == PS_COMMAND
    environments = [resolved_env(pod, "node") for pod in nodes.values()] + [resolved_env(servers[0], "ps")]
    assert_one_cluster_as_local_processes_get(environments, "t6-train-cnn", parameter_servers=1)
    end(tier.api, [nodes[0]], 0)
    assert step.wait() == 0, step.output


def test_a_runtime_jobsets_webhook_refuses_fails_the_step_within_a_minute_quoting_trainer(
    tier, rendered, workflow
):
    """The defect this tier was built to see: a failure-policy rule name with a hyphen. Trainer's own
    webhook accepts the runtime; JobSet's refuses the JobSet Trainer builds from it, and Trainer only
    records an event. The step fails quoting it, well before any timeout."""
    runtime = copy.deepcopy(tier.api.get(TRAINJOB_API, "ClusterTrainingRuntime", RUNTIME_NAME))
    runtime = {
        "apiVersion": TRAINJOB_API,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "hyphenated-rules"},
        "spec": runtime["spec"],
    }
    for rule in runtime["spec"]["template"]["spec"]["failurePolicy"]["rules"]:
        rule["name"] = rule["name"].replace("_", "-") + "-rule"
    tier.api.apply(runtime)
    manifest = trainjob(rendered, "t7-train-cnn")
    manifest["spec"]["runtimeRef"]["name"] = "hyphenated-rules"
    step = train_step(workflow, manifest)
    assert step.wait() == NEVER_SUCCEEDS_EXIT_CODE  # Argo does not retry it
    assert step.seconds < FAIL_FAST_SECONDS, step.output
    assert (
        "train: TrainJob dist-ml/t7-train-cnn cannot start: TrainJobResourcesCreationFailed on TrainJob "
        "t7-train-cnn: " in step.output
    )
    assert "denied the request" in step.output and "-rule" in step.output, step.output
