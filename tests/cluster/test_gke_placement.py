"""The gke stack's training placement, judged by the controllers that make it: KWOK nodes shaped like
the stack's pools (tools.control_plane.nodes.kwok.gke_nodes: their labels, taints, allocatable and GPUs),
the stack's flavor, queues, runtime and accounts in place of the local stack's, and the train step's
TrainJob submitted as the workflow's account. Kueue admits it on the training pool's flavor and writes
the flavor's node labels and tolerations into Trainer's runtime patch; Trainer merges it into the
JobSet; the scheduler puts each pod on a node that matches. Nothing here restates their rules: a
flavor whose node labels no pool has leaves the pods unscheduled, and the test fails."""

from __future__ import annotations

import contextlib
import json
from typing import Callable

import pytest
from tier_helpers import NAMESPACE, delete_all, end, running_pods, train_step, trainjob

from common.cli import NEVER_SUCCEEDS_EXIT_CODE
from common.cluster_target import GPU_RESOURCE
from engines.base import condition
from engines.trainjob import JOBSET_NAME_LABEL, TRAINING_QUEUE, WORKLOAD_JOB_UID_LABEL
from infra.gke import POOL_LABEL, QUEUED_PROVISIONING_CLASS
from stacks import render
from tools.control_plane import stacks
from tools.control_plane.nodes import kwok

TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
WORKLOAD_API = "kueue.x-k8s.io/v1beta2"
ADMISSION_CHECK_API = WORKLOAD_API
PROVISIONING_REQUEST_API = "autoscaling.x-k8s.io/v1"  # the cluster autoscaler's, which Kueue creates
PODSET_LABEL = "kueue.x-k8s.io/podset"  # Kueue's runtime patch labels each pod with its pod set
WORKERS = 2  # Pulumi.gke.yaml's pipeline.workers
FAIL_FAST_SECONDS = 60  # a step's end once a controller says the job will never start
# Pulumi.gke.yaml's pools with its GPU pool turned on as docs/guides/deploy-gke.md#gpus shows: the spot
# pool and the GPU pool side by side, so that each stack below must pick its own.
GPU_POOL = {"enabled": True, "machineType": "g2-standard-24", "acceleratorType": "nvidia-l4",
            "acceleratorCount": 2, "maxNodes": 3}
POOLS = {**json.loads(stacks.stack_values("gke")["dist-ml:cluster"])["nodePools"], "gpu": GPU_POOL}


def gke_stack(training_pool: str, queued: bool = False) -> render.Rendered:
    """The gke stack training on `training_pool`; `queued`: its GPU pool's nodes through GKE's queued
    provisioning (cluster.nodePools.gpu.queuedProvisioning)."""
    pools = {**POOLS, "gpu": {**GPU_POOL, "queuedProvisioning": True}} if queued else POOLS
    return stacks.gke_stack(cluster={"nodePools": pools, "trainingPool": training_pool})


@pytest.fixture(scope="module")
def gke_pools(tier, local_stack_objects) -> dict[str, dict]:
    """The pools' nodes, by name, for this module's tests only (the local stack's tests keep their one
    k3d node)."""
    made = kwok.gke_nodes(gke_stack("spot"))
    tier.api.apply_all(made)
    yield {node["metadata"]["name"]: node for node in made}
    for node in made:
        tier.api.delete("v1", "Node", node["metadata"]["name"])


@pytest.fixture
def placed(tier, local_stack_objects, gke_pools) -> Callable[[str], render.Rendered]:
    """Puts the gke stack of a training pool in place for the test (stacks.placement_of); after, no
    TrainJob left, and the local stack's placement back."""
    with contextlib.ExitStack() as after:

        def place(training_pool: str, queued: bool = False) -> render.Rendered:
            rendered = gke_stack(training_pool, queued)
            after.enter_context(stacks.placement_of(tier.api, rendered, local_stack_objects))
            return rendered

        yield place
        delete_all(tier.api, TRAINJOB_API, "TrainJob", JOBSET_NAME_LABEL)


def assert_on_pool(pods: list[dict], pools: dict[str, dict], pool: str, gpus: int) -> None:
    """Every pod on a node of `pool`, placed there by Kueue's patch (its pod-set label), tolerating
    exactly that pool's taints and asking for `gpus` GPUs (all of a GPU node's)."""
    for pod in pods:
        node = pools[pod["spec"]["nodeName"]]
        assert node["metadata"]["labels"][POOL_LABEL] == pool, pod["spec"]["nodeName"]
        assert PODSET_LABEL in pod["metadata"]["labels"], pod["metadata"]["labels"]
        tolerated = {(t["key"], t.get("value"), t["effect"]) for t in pod["spec"].get("tolerations", [])}
        taints = {(t["key"], t["value"], t["effect"]) for t in node["spec"].get("taints", [])}
        assert taints <= tolerated, (taints, tolerated)
        (container,) = pod["spec"]["containers"]
        requested = container["resources"].get("requests", {}).get(GPU_RESOURCE)
        assert int(requested or 0) == gpus, container["resources"]


def admitted_flavors(tier, name: str) -> set[str]:
    """The flavors Kueue assigned the TrainJob's Workload."""
    uid = tier.api.get(TRAINJOB_API, "TrainJob", name, NAMESPACE)["metadata"]["uid"]
    (workload,) = tier.api.list(
        WORKLOAD_API, "Workload", NAMESPACE, label_selector=f"{WORKLOAD_JOB_UID_LABEL}={uid}")
    return {flavor for assignment in workload["status"]["admission"]["podSetAssignments"]
            for flavor in assignment["flavors"].values()}


def flavor_of(rendered: render.Rendered) -> str:
    (flavor,) = [o for o in rendered.objects if o["kind"] == "ResourceFlavor"]
    return flavor["metadata"]["name"]


def test_a_cpu_variant_runs_on_the_spot_pool_tolerating_its_taint(tier, workflow, placed, gke_pools):
    rendered = placed("spot")
    step = train_step(workflow, trainjob(rendered, "g1-train-cnn"))
    pods = running_pods(tier.api, "g1-train-cnn", WORKERS, step=step)
    assert admitted_flavors(tier, "g1-train-cnn") == {flavor_of(rendered)}
    assert_on_pool(pods, gke_pools, "spot", gpus=0)
    end(tier.api, pods, 0)
    assert step.wait() == 0, step.output


def test_a_gpu_variant_runs_on_the_gpu_pool_and_one_beyond_its_free_gpus_waits_unstarted(
    tier, workflow, placed, gke_pools
):
    """Each TrainJob asks for 2 workers x 2 GPUs; the pool's quota is 3 nodes' 6: the second waits in
    Kueue's queue with no pod, and runs on the GPU pool once the first ends."""
    rendered = placed("gpu")
    first = train_step(workflow, trainjob(rendered, "g2-a"))
    pods = running_pods(tier.api, "g2-a", WORKERS, step=first)
    assert admitted_flavors(tier, "g2-a") == {flavor_of(rendered)}
    assert_on_pool(pods, gke_pools, "gpu", gpus=GPU_POOL["acceleratorCount"])
    second = train_step(workflow, trainjob(rendered, "g2-b"))
    second.says(
        f"g2-b: queued by Kueue in {TRAINING_QUEUE}: Pending: couldn't assign flavors to pod set node: "
        f"insufficient unused quota for {GPU_RESOURCE} in flavor {flavor_of(rendered)}"
    )
    assert not tier.api.list("v1", "Pod", NAMESPACE, label_selector=f"{JOBSET_NAME_LABEL}=g2-b")
    end(tier.api, pods, 0)
    waited = running_pods(tier.api, "g2-b", WORKERS, step=second)
    assert_on_pool(waited, gke_pools, "gpu", gpus=GPU_POOL["acceleratorCount"])
    end(tier.api, waited, 0)
    assert [first.wait(), second.wait()] == [0, 0], [first.output, second.output]


def test_a_flavor_no_pod_of_the_runtime_can_match_fails_the_step_within_a_minute_with_kueues_words(
    tier, workflow, placed
):
    """The flavor's node labels changed (as an edit of engines/trainjob.py's resource_flavor would) and
    the runtime's node selector not: Kueue will never admit the job, and says why."""
    rendered = placed("spot")
    (flavor,) = [o for o in rendered.objects if o["kind"] == "ResourceFlavor"]
    tier.api.apply({**flavor, "spec": {**flavor["spec"], "nodeLabels": {POOL_LABEL: "spot-renamed"}}})
    step = train_step(workflow, trainjob(rendered, "g3-train-cnn"))
    assert step.wait() == NEVER_SUCCEEDS_EXIT_CODE  # Argo does not retry it
    assert step.seconds < FAIL_FAST_SECONDS, step.output
    assert "Kueue will never admit Workload trainjob-g3-train-cnn-" in step.output, step.output
    assert (f"couldn't assign flavors to pod set node: flavor {flavor['metadata']['name']} doesn't match "
            "node affinity") in step.output


def test_a_gpu_job_on_queued_provisioning_waits_on_kueues_check_for_its_nodes_with_no_pod(
    tier, workflow, placed
):
    """GKE's queued provisioning (Dynamic Workload Scheduler): Kueue's own provisioning controller
    accepts the stack's AdmissionCheck and ProvisioningRequestConfig (Active), reserves the job's quota
    and asks GKE for all its nodes at once with a ProvisioningRequest of GKE's class. Nothing here
    provisions them (GKE's autoscaler cannot run here), so the job waits on the check, with no pod, and
    the step says so."""
    rendered = placed("gpu", queued=True)
    (check,) = [o for o in rendered.objects if o["kind"] == "AdmissionCheck"]
    name = check["metadata"]["name"]
    active = tier.api.wait(
        lambda: condition(tier.api.get(ADMISSION_CHECK_API, "AdmissionCheck", name), "Active"),
        f"AdmissionCheck {name} Active", FAIL_FAST_SECONDS)
    assert active["reason"] == "Active", active
    step = train_step(workflow, trainjob(rendered, "g5-queued"))
    step.says(f"quota reserved by Kueue in {TRAINING_QUEUE}, waiting for its admission check {name}: Pending")
    # Kueue's provisioning controller creates the request in its own reconcile, after the check is Pending.
    (request,) = tier.api.wait(
        lambda: tier.api.list(PROVISIONING_REQUEST_API, "ProvisioningRequest", NAMESPACE),
        "Kueue's ProvisioningRequest", FAIL_FAST_SECONDS)
    assert request["spec"]["provisioningClassName"] == QUEUED_PROVISIONING_CLASS, request["spec"]
    (pod_set,) = request["spec"]["podSets"]
    assert pod_set["count"] == WORKERS, pod_set
    assert not tier.api.list("v1", "Pod", NAMESPACE, label_selector=f"{JOBSET_NAME_LABEL}=g5-queued")
    step.process.kill()
