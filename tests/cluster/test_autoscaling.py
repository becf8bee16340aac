"""The predictor's scaling judged by KServe's and KEDA's own code: the InferenceService the serve step
rolls out, in every mode of both stacks, passes KServe's webhook (and KServe's webhook refuses what
its rules refuse, so these tests cannot pass blind); a predictor that scales on load gets from KServe's
controller a ScaledObject that KEDA's webhook accepts, reading the stack's Prometheus with a query
that selects its own pods, the stable's or the canary's."""

from __future__ import annotations

import copy

import pytest
from conftest import REPO_ROOT
from stack_checks import embedded, stack_values, template_of
from tier_helpers import NAMESPACE, delete_all, serve_step

from common.cluster_names import ISVC_LABEL, ISVC_METRIC_LABEL, canary_name, predictor_deployment_name
from infra.monitoring import prometheus_url
from stacks import render
from stacks.installs import MONITORING
from tools.control_plane.kube import Refused

ISVC_API = "serving.kserve.io/v1beta1"
SCALED_OBJECT_API = "keda.sh/v1alpha1"
STACK_FILES = {"local": REPO_ROOT / "Pulumi.local.yaml", "gke": REPO_ROOT / "Pulumi.gke.yaml"}
METRICS = ("inflight", "rps", "cpu", "memory")


def rendered_with(stack: str, metric: str, **pipeline: str) -> render.Rendered:
    values = stack_values(
        STACK_FILES[stack],
        monitoring={"enabled": True},
        serving={"autoscaling": {"metric": metric}},
        **({"pipeline": pipeline} if pipeline else {}),
    )
    if stack == "gke":
        values = {**values, "gcp:project": "dist-ml-tier-4821", "gcp:region": "us-central1"}
    return render.render(stack, values)


def served(rendered: render.Rendered) -> dict:
    """The InferenceService the serve step rolls out (version 3), in the tier's namespace."""
    isvc = embedded(template_of(rendered), "serve")
    isvc["metadata"]["namespace"] = NAMESPACE
    return isvc


@pytest.fixture(scope="module", autouse=True)
def no_inference_service_left(tier):
    yield
    delete_all(tier.api, ISVC_API, "InferenceService", ISVC_LABEL)


@pytest.mark.parametrize("stack", sorted(STACK_FILES))
@pytest.mark.parametrize("metric", METRICS)
def test_every_stacks_inference_service_passes_kserves_webhook_in_every_mode(
    tier, local_stack_objects, stack, metric
):
    isvc = served(rendered_with(stack, metric))
    expected = "keda" if metric in ("inflight", "rps") else "hpa"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == expected
    tier.api.create(isvc, dry_run=True)


def keda_isvc(**predictor) -> dict:
    external = {
        "metric": {"backend": "prometheus", "serverAddress": "http://p:9090", "query": "sum(up)"},
        "target": {"type": "Value", "value": "4"},
    }
    return {
        "apiVersion": ISVC_API,
        "kind": "InferenceService",
        "metadata": {
            "name": "refused",
            "namespace": NAMESPACE,
            "annotations": {
                "serving.kserve.io/deploymentMode": "Standard",
                "serving.kserve.io/autoscalerClass": "keda",
            },
        },
        "spec": {
            "predictor": {
                "minReplicas": 1,
                "maxReplicas": 3,
                "autoScaling": {"metrics": [{"type": "External", "external": external}]},
                "containers": [{"name": "kserve-container", "image": "dist-ml/serving:0.1.0"}],
                **predictor,
            }
        },
    }


def annotate(isvc: dict, autoscaler_class: str) -> None:
    isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] = autoscaler_class


def external(isvc: dict) -> dict:
    return isvc["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]


def as_hpa_with(isvc: dict, scale_target: int) -> None:
    annotate(isvc, "hpa")
    del isvc["spec"]["predictor"]["autoScaling"]
    isvc["spec"]["predictor"]["scaleTarget"] = scale_target


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda isvc: annotate(isvc, "kpa"), "[kpa] is not a supported autoscaler class type"),
        (
            lambda isvc: isvc["spec"]["predictor"].update(scaleMetric="cpu"),
            "ScaleMetric is not supported for KEDA",
        ),
        (lambda isvc: external(isvc)["metric"].update(query=""), "the query should not be empty"),
        (
            lambda isvc: external(isvc)["target"].pop("value"),
            "the target threshold value should not be empty",
        ),
        (
            lambda isvc: isvc["spec"]["predictor"].update(minReplicas=4),
            "'MinReplicas' cannot be greater than MaxReplicas",
        ),
        (
            lambda isvc: annotate(isvc, "hpa"),
            "invalid HPA metric source type with value [External],valid metric source types are Resource",
        ),
        (
            lambda isvc: as_hpa_with(isvc, 150),
            "the target utilization percentage should be a [1-100] integer",
        ),
    ],
)
def test_kserves_webhook_refuses_what_its_scaling_rules_refuse(tier, local_stack_objects, change, error):
    isvc = keda_isvc()
    tier.api.create(copy.deepcopy(isvc), dry_run=True)
    change(isvc)
    with pytest.raises(Refused) as refused:
        tier.api.create(isvc, dry_run=True)
    assert error in refused.value.message


@pytest.mark.parametrize("metric", ["inflight", "rps"])
def test_a_predictor_scaled_on_load_gets_a_scaled_object_of_its_own_that_kedas_webhook_accepts(
    tier, workflow, tmp_path, metric
):
    """KServe's controller writes the ScaledObject (KEDA's webhook and CRD accept it), per replica
    (no metricType: AverageValue), on the stack's Prometheus, selecting the InferenceService's own
    pods: the stable's, and the canary's for the canary the serve step makes of the next version."""
    model = f"fmnist-{metric}"
    rendered = rendered_with("local", metric, modelName=model)
    for version in ("1", "2"):  # the stable version, then a canary beside it
        step = serve_step(workflow, rendered, version, tmp_path / "version")
        assert step.wait() == 0, step.output
    for name in (model, canary_name(model)):
        scaled = tier.api.get(SCALED_OBJECT_API, "ScaledObject", predictor_deployment_name(name), NAMESPACE)
        assert scaled["spec"]["scaleTargetRef"]["name"] == predictor_deployment_name(name)
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["type"] == "prometheus" and "metricType" not in trigger
        assert trigger["metadata"]["serverAddress"] == prometheus_url(MONITORING)
        assert trigger["metadata"]["threshold"] == str(int(trigger["metadata"]["threshold"]))
        assert f'{ISVC_METRIC_LABEL}="{name}"' in trigger["metadata"]["query"]
        behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior == {
            "scaleDown": {"stabilizationWindowSeconds": 300},  # serving.autoscaling's default
            "scaleUp": {"stabilizationWindowSeconds": 0},
        }  # KServe's chart's
