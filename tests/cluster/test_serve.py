"""The serve step (python -m cluster_steps.release, exactly as the WorkflowTemplate runs it, as the
workflow's service account) against KServe's real controller and webhooks in Standard mode: the
predictor's Deployment, Service and the route;
a canary beside the stable version, promoted or rolled back as the step drives it; a predictor that
crash-loops fails the step. KWOK runs the predictor's pods. Scaling: test_autoscaling.py."""

from __future__ import annotations

import json

import pytest
from tier_helpers import NAMESPACE, ROLLOUT_SECONDS, Step, delete_all, serve_step

from common.cli import NEVER_SUCCEEDS_EXIT_CODE
from common.cluster_names import (
    ISVC_LABEL,
    RELEASE_MODULE,
    canary_name,
    predictor_deployment_name,
    route_name,
)
from common.cluster_target import pvc_storage
from pipeline.argo import release_uri
from tools.control_plane.nodes.kwok import CRASH_LOOP_ANNOTATION

ISVC_API = "serving.kserve.io/v1beta1"
ROUTE_API = "gateway.networking.k8s.io/v1"
MODEL = "fmnist"  # Pulumi.local.yaml's pipeline.modelName


@pytest.fixture(scope="module", autouse=True)
def no_inference_service_left(tier):
    yield
    delete_all(tier.api, ISVC_API, "InferenceService", ISVC_LABEL)


def release(workflow, rendered, tmp_path, version: str, *action: str) -> Step:
    """The serve step of `version` (action empty), or `release <action>` as an operator runs it."""
    if action:
        return Step(RELEASE_MODULE, workflow, *action, "--namespace", NAMESPACE, "--model-name", MODEL)
    return serve_step(workflow, rendered, version, tmp_path / "deployed-version")


def route_weights(tier) -> dict[str, int]:
    route = tier.api.get(ROUTE_API, "HTTPRoute", route_name(MODEL), NAMESPACE)
    return {
        backend["name"]: backend.get("weight", 1)
        for rule in route["spec"]["rules"]
        for backend in rule["backendRefs"]
    }


def test_versions_roll_out_through_kserve_as_the_stable_version_then_a_canary_promoted_or_rolled_back(
    tier, rendered, workflow, tmp_path
):
    first = release(workflow, rendered, tmp_path, "1")
    assert first.wait() == 0, first.output
    deployment = tier.api.get("apps/v1", "Deployment", predictor_deployment_name(MODEL), NAMESPACE)
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]][0] == "kserve-container"
    service = tier.api.get("v1", "Service", predictor_deployment_name(MODEL), NAMESPACE)
    assert {port["port"] for port in service["spec"]["ports"]} >= {80}
    assert route_weights(tier) == {predictor_deployment_name(MODEL): 100}

    canary = release(workflow, rendered, tmp_path, "2")
    assert canary.wait() == 0, canary.output
    assert tier.api.get(ISVC_API, "InferenceService", canary_name(MODEL), NAMESPACE) is not None
    assert route_weights(tier) == {
        predictor_deployment_name(MODEL): 90,
        predictor_deployment_name(canary_name(MODEL)): 10,
    }

    promoted = release(workflow, rendered, tmp_path, "2", "promote")
    assert promoted.wait() == 0, promoted.output
    stable = tier.api.get(ISVC_API, "InferenceService", MODEL, NAMESPACE)
    assert stable["metadata"]["annotations"]["dist-ml/model-version"] == "2"
    assert tier.api.get(ISVC_API, "InferenceService", canary_name(MODEL), NAMESPACE) is None
    assert route_weights(tier) == {predictor_deployment_name(MODEL): 100}

    third = release(workflow, rendered, tmp_path, "3")
    assert third.wait() == 0, third.output
    rolled_back = release(workflow, rendered, tmp_path, "3", "rollback")
    assert rolled_back.wait() == 0, rolled_back.output
    assert (
        tier.api.get(ISVC_API, "InferenceService", MODEL, NAMESPACE)["metadata"]["annotations"][
            "dist-ml/model-version"
        ]
        == "2"
    )
    assert route_weights(tier) == {predictor_deployment_name(MODEL): 100}


def test_kserves_own_ingress_is_of_a_class_gkes_ingress_controller_leaves_alone(
    tier, rendered, workflow, tmp_path
):
    """KServe in Standard mode makes a Kubernetes Ingress of the chart's class `istio` for every
    InferenceService, which nothing on the stacks' clusters serves (users reach the model through the
    stacks' Gateway and the route the serve step writes). GKE's Ingress controller takes no action for
    an Ingress that names another class: its behaviour table gives, for no kubernetes.io/ingress.class
    annotation and any spec.ingressClassName, "Takes no action. The Ingress manifest could be processed
    by a third-party Ingress controller if one has been deployed."
    (https://cloud.google.com/kubernetes-engine/docs/concepts/ingress, GKE Ingress for Application Load
    Balancers); so no external load balancer appears on GKE for it."""
    step = release(workflow, rendered, tmp_path, "1")
    assert step.wait() == 0, step.output
    ingress = tier.api.wait(
        lambda: tier.api.get("networking.k8s.io/v1", "Ingress", MODEL, NAMESPACE),
        "KServe's Ingress",
        ROLLOUT_SECONDS,
    )
    assert ingress["spec"]["ingressClassName"] == "istio"
    assert "kubernetes.io/ingress.class" not in (ingress["metadata"].get("annotations") or {})


def test_a_crash_looping_predictor_fails_the_serve_step(tier, rendered, workflow, tmp_path):
    step = release(workflow, rendered, tmp_path, "4")  # the stable version, or a canary beside it
    step.says(f"rollout: applied InferenceService {NAMESPACE}/")
    isvc = step.output.split(f"rollout: applied InferenceService {NAMESPACE}/")[1].split()[0]
    release_path = release_uri(pvc_storage(), MODEL, "4").partition("://")[2].partition("/")[2]

    def crash_its_pods():
        pods = tier.api.list(
            "v1", "Pod", NAMESPACE, label_selector=f"serving.kserve.io/inferenceservice={isvc}"
        )
        running = [
            pod
            for pod in pods
            if (pod.get("status") or {}).get("phase") == "Running" and release_path in json.dumps(pod["spec"])
        ]
        for pod in running:
            tier.api.patch(
                "v1",
                "Pod",
                pod["metadata"]["name"],
                {"metadata": {"annotations": {CRASH_LOOP_ANNOTATION: "true"}}},
                namespace=NAMESPACE,
            )
        return running

    tier.api.wait(crash_its_pods, f"{isvc}'s new pods running", ROLLOUT_SECONDS)
    assert step.wait() == NEVER_SUCCEEDS_EXIT_CODE  # Argo does not retry it
    assert "CrashLoopBackOff" in step.output, step.output
