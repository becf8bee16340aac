"""The `restricted` Pod Security Standard enforced by the real API server's PodSecurity admission in the
namespace the local stack declares: a pod without the restricted contexts is refused there, and the
pods of the train step (TrainJob -> JobSet -> Job -> pods), of the serve step (the predictor's
Deployment) and of Argo's step pods (with the executor's init and wait containers) are admitted."""

from __future__ import annotations

import pytest
import yaml
from tier_helpers import (
    NAMESPACE,
    POD_WAIT_SECONDS,
    delete_all,
    end,
    running_pods,
    serve_step,
    train_step,
    trainjob,
)

from common import pod_security
from common.cluster_names import ISVC_LABEL
from common.cluster_target import KUBERNETES_MINOR
from engines.trainjob import JOBSET_NAME_LABEL
from pipeline import argo
from tools.control_plane.kube import Refused

TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
ISVC_API = "serving.kserve.io/v1beta1"
MODEL = "fmnist"  # Pulumi.local.yaml's pipeline.modelName
NODES = 2  # Pulumi.local.yaml's pipeline.workers


@pytest.fixture(scope="module", autouse=True)
def nothing_left(tier):
    yield
    delete_all(tier.api, TRAINJOB_API, "TrainJob", JOBSET_NAME_LABEL)
    delete_all(tier.api, ISVC_API, "InferenceService", ISVC_LABEL)
    delete_all(tier.api, argo.API_VERSION, "Workflow", argo.WORKFLOW_LABEL)


def bare_pod(name: str, **security: dict) -> dict:
    container = {"name": "main", "image": "busybox:1.36", "command": ["true"]}
    if "container" in security:
        container["securityContext"] = security["container"]
    spec = {"containers": [container]}
    if "pod" in security:
        spec["securityContext"] = security["pod"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec}


def assert_restricted(pod: dict) -> None:
    """Each of the pod's containers, as admitted, declares the restricted contexts (the API server
    having let it through is the proof; this says which context did it)."""
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True, pod["metadata"]["name"]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert "runAsUser" not in context, container["name"]


def test_the_api_server_refuses_a_pod_without_the_restricted_contexts_in_our_namespace(
    tier, local_stack_objects
):
    namespace = tier.api.get("v1", "Namespace", NAMESPACE)
    labels = namespace["metadata"]["labels"]
    assert labels.items() >= pod_security.enforcing_labels(KUBERNETES_MINOR).items()
    with pytest.raises(Refused) as refused:
        tier.api.create(bare_pod("no-context"))
    assert refused.value.status == 403
    message = refused.value.message
    assert f'{pod_security.REFUSAL}v{KUBERNETES_MINOR}"' in message, message
    for rule in ("allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true",
                 "seccompProfile"):
        assert rule in message, message
    # The same pod with the contexts our pods declare is admitted (dry run: nothing stored).
    tier.api.create(bare_pod("with-context", pod=pod_security.pod_security_context(),
                             container=pod_security.container_security_context()), dry_run=True)


def test_the_train_steps_pods_are_admitted_under_enforcement(tier, rendered, workflow):
    """TrainJob -> Trainer -> JobSet -> Jobs -> pods, each pod created by the Job controller and
    admitted by PodSecurity: the runtime's contexts reach every node pod."""
    name = "psa-train"
    step = train_step(workflow, trainjob(rendered, name))
    pods = running_pods(tier.api, name, NODES, step=step)
    for pod in pods:
        assert_restricted(pod)
    end(tier.api, pods, 0)
    assert step.wait() == 0, step.output


def test_the_serve_steps_predictor_pods_are_admitted_under_enforcement(tier, rendered, workflow, tmp_path):
    """The serve step rolls out only once the predictor's pods are ready: KServe's Deployment's pods,
    with its agent (the request logger's sidecar), were admitted."""
    step = serve_step(workflow, rendered, "1", tmp_path / "deployed-version")
    assert step.wait() == 0, step.output
    pods = tier.api.list("v1", "Pod", NAMESPACE, label_selector=f"{ISVC_LABEL}={MODEL}")
    assert pods
    for pod in pods:
        assert_restricted(pod)


def test_argos_step_pods_with_the_executors_containers_are_admitted_under_enforcement(
    tier, local_stack_objects
):
    """A Workflow of the stack's template: its first step pod, with Argo's init and wait containers
    from the controller's config map (the nonroot executor image), is admitted."""
    workflow = argo.workflow()
    created = tier.api.create({**workflow, "metadata": {**workflow["metadata"], "namespace": NAMESPACE}})
    name = created["metadata"]["name"]

    def step_pod():
        status = tier.api.get(argo.API_VERSION, "Workflow", name, NAMESPACE).get("status") or {}
        # A step pod PodSecurity refuses errs the workflow with the server's message.
        assert status.get("phase") in (None, "Pending", "Running"), status.get("message", status)
        return tier.api.list("v1", "Pod", NAMESPACE, label_selector=f"{argo.WORKFLOW_LABEL}={name}")

    (pod,) = tier.api.wait(step_pod, "the workflow's first step pod", POD_WAIT_SECONDS)
    assert_restricted(pod)
    executor = [c for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
                if c["name"] != argo.MAIN_CONTAINER]
    assert {c["name"] for c in executor} == {"init", "wait"}
    (config,) = [obj for obj in local_stack_objects if obj["kind"] == "ConfigMap"
                 and obj["metadata"]["name"] == argo.CONTROLLER_CONFIG_MAP]
    assert {c["image"] for c in executor} == {yaml.safe_load(config["data"]["executor"])["image"]}
    tier.api.delete(argo.API_VERSION, "Workflow", name, NAMESPACE)
