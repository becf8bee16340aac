"""Scaling the predictor, on both stacks and in every mode: the stacks render and validate; KEDA is
installed (pinned, before KServe's controller) exactly when the predictor scales on load; the
InferenceService passes KServe v0.20's own autoscaling rules (tests/kserve_autoscaling.py, restated
from its webhook), and the ScaledObject KServe would write from it validates against KEDA v2.18.0's
CRD and reads the stack's Prometheus with a query that selects this InferenceService's pods, which
the predictor's PodMonitor scrapes and labels so."""

from __future__ import annotations

import json

import pytest
import stack_checks
from conftest import REPO_ROOT
from kserve_autoscaling import scaled_object, webhook_error
from stack_checks import WORKFLOW_NAMESPACE, closure, embedded, objects_of, validate_all

from cluster_steps import release as rollout
from cluster_steps.names import ISVC_METRIC_LABEL, canary_name
from infra.monitoring import prometheus_url
from pipeline.manifests import DEFAULT_PROMETHEUS_URL
from stacks import render
from stacks.compose import MONITORING

SCALED_OBJECT_CRD = "keda-v2.18.0/keda.sh_scaledobjects.yaml"
STACK_FILES = {"local": REPO_ROOT / "Pulumi.local.yaml", "gke": REPO_ROOT / "Pulumi.gke.yaml"}
KUBERNETES_VERSION = "1.33"  # both stack files'
METRICS = ("inflight", "rps", "cpu", "memory")
HELM_CHART = "kubernetes:helm.sh/v4:Chart"


def values(stack: str, metric: str) -> dict[str, str]:
    found = stack_checks.stack_values(STACK_FILES[stack], monitoring={"enabled": True},
                                      serving={"autoscaling": {"metric": metric}})
    return {**found, "gcp:project": "dist-ml-test-4821"} if stack == "gke" else found


@pytest.fixture(scope="module", params=[(stack, metric) for stack in STACK_FILES for metric in METRICS],
                ids=lambda param: "-".join(param))
def rendered(request) -> tuple[str, render.Rendered]:
    stack, metric = request.param
    return metric, render.render(stack, values(stack, metric))


def predictor_isvc(stack: render.Rendered) -> dict:
    (template,) = objects_of(stack, "WorkflowTemplate")
    return embedded(template, "serve")


def charts(stack: render.Rendered) -> dict[str, render.Declared]:
    return {r.inputs["chart"].rpartition("/")[2]: r for r in stack.of_type(HELM_CHART)}


def test_every_stack_renders_and_validates_in_every_mode(rendered, validate_crd):
    metric, stack = rendered
    assert validate_all(stack, validate_crd, "v4", KUBERNETES_VERSION) >= 15
    isvc = predictor_isvc(stack)
    assert webhook_error(isvc) is None
    expected_class = "keda" if metric in ("inflight", "rps") else "hpa"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == expected_class


def test_keda_is_installed_pinned_before_kserves_controller_only_when_the_predictor_scales_on_load(rendered):
    metric, stack = rendered
    found = charts(stack)
    controller = found["kserve-resources"].inputs["values"]["kserve"]["controller"]
    if metric in ("cpu", "memory"):
        assert "keda" not in found and "podAnnotations" not in controller
        return
    keda = found["keda"]
    assert (keda.inputs["version"], keda.inputs["name"]) == ("2.18.0", "keda")
    assert keda.inputs["namespace"] == "keda"
    assert keda.inputs["repositoryOpts"] == {"repo": "https://kedacore.github.io/charts"}
    # KServe's controller looks for the ScaledObject CRD once, at start: after KEDA, and restarted by a
    # change of it.
    assert keda.name in closure(stack, found["kserve-resources"].name)
    assert controller["podAnnotations"] == {"dist-ml/keda-version": "2.18.0"}


def test_the_scaled_object_kserve_writes_validates_against_kedas_crd_and_reads_the_stacks_prometheus(
        rendered, validate_crd):
    metric, stack = rendered
    isvc = predictor_isvc(stack)
    if metric in ("cpu", "memory"):  # KServe's HPA, on the resource: no ScaledObject, no query
        assert "autoScaling" not in isvc["spec"]["predictor"]
        assert isvc["spec"]["predictor"]["scaleMetric"] == metric
        return
    scaled = scaled_object(isvc, WORKFLOW_NAMESPACE)
    assert validate_crd(SCALED_OBJECT_CRD, scaled) == []
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and "metricType" not in trigger  # AverageValue: per replica
    assert trigger["metadata"]["serverAddress"] == prometheus_url(MONITORING)
    assert trigger["metadata"]["threshold"] == str(int(trigger["metadata"]["threshold"]))
    assert f'{ISVC_METRIC_LABEL}="fmnist"' in trigger["metadata"]["query"]
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == {"scaleDown": {"stabilizationWindowSeconds": 300},  # serving.autoscaling's default
                        "scaleUp": {"stabilizationWindowSeconds": 0}}  # KServe's chart's
    # The canary the serve step makes of it scales on the canary's pods.
    canary = scaled_object(rollout.renamed(isvc, canary_name("fmnist")), WORKFLOW_NAMESPACE)
    assert validate_crd(SCALED_OBJECT_CRD, canary) == []
    (canary_trigger,) = canary["spec"]["triggers"]
    assert f'{ISVC_METRIC_LABEL}="fmnist-canary"' in canary_trigger["metadata"]["query"]
    assert canary["spec"]["scaleTargetRef"] == {"name": "fmnist-canary-predictor"}


def test_the_predictors_monitor_scrapes_and_labels_the_stable_and_the_canary_pods(rendered):
    metric, stack = rendered
    (monitor,) = [m for m in objects_of(stack, "PodMonitor") if m["metadata"]["name"] == "dist-ml-predictor"]
    (expression,) = monitor["spec"]["selector"]["matchExpressions"]
    assert expression == {"key": "serving.kserve.io/inferenceservice", "operator": "In",
                          "values": ["fmnist", "fmnist-canary"]}
    assert monitor["spec"]["podTargetLabels"] == ["serving.kserve.io/inferenceservice"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["interval"] == "10s"


def test_the_default_render_names_the_stacks_prometheus():
    assert DEFAULT_PROMETHEUS_URL == prometheus_url(MONITORING)
    # kube-prometheus-stack's fullname is its release name cut to 26 characters (templates/_helpers.tpl).
    assert prometheus_url(MONITORING) == "http://monitoring-kube-prometheus-prometheus.monitoring.svc:9090"
    (chart,) = [r for r in render.render("gke", values("gke", "inflight")).of_type(HELM_CHART)
                if r.inputs["chart"] == "kube-prometheus-stack"]
    assert chart.inputs["name"] == "monitoring-kube-prometheus-stack"


def test_by_default_gke_scales_on_requests_in_flight_and_k3d_without_monitoring_on_cpu():
    gke_file = render.pulumi_values(STACK_FILES["gke"])
    gke = render.render("gke", {**gke_file, "gcp:project": "dist-ml-test-4821"})
    assert "keda" in charts(gke)
    (metric,) = predictor_isvc(gke)["spec"]["predictor"]["autoScaling"]["metrics"]
    assert "dist_ml_requests_in_flight" in metric["external"]["metric"]["query"]
    local = render.render("local", render.pulumi_values(STACK_FILES["local"]))
    assert "keda" not in charts(local)
    assert predictor_isvc(local)["spec"]["predictor"]["scaleMetric"] == "cpu"


# Each of KServe's rules, restated, refuses what KServe refuses: the tests above cannot pass blind.
def keda_isvc(**predictor) -> dict:
    external = {"metric": {"backend": "prometheus", "serverAddress": "http://p:9090", "query": "sum(up)"},
                "target": {"type": "Value", "value": "4"}}
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "fmnist", "annotations": {"serving.kserve.io/deploymentMode": "Standard",
                                                           "serving.kserve.io/autoscalerClass": "keda"}},
            "spec": {"predictor": {"minReplicas": 1, "maxReplicas": 3, "autoScaling": {
                "metrics": [{"type": "External", "external": external}]}, **predictor}}}


def annotate(isvc: dict, autoscaler_class: str) -> None:
    isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] = autoscaler_class


def external(isvc: dict) -> dict:
    return isvc["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]


def as_hpa_with(isvc: dict, scale_target: int) -> None:
    annotate(isvc, "hpa")
    del isvc["spec"]["predictor"]["autoScaling"]
    isvc["spec"]["predictor"]["scaleTarget"] = scale_target


@pytest.mark.parametrize(("change", "error"), [
    (lambda isvc: annotate(isvc, "kpa"), "[kpa] is not a supported autoscaler class type"),
    (lambda isvc: isvc["spec"]["predictor"].update(scaleMetric="cpu"),
     "ScaleMetric is not supported for KEDA"),
    (lambda isvc: external(isvc)["metric"].update(query=""), "the query should not be empty"),
    (lambda isvc: external(isvc)["target"].pop("value"), "the target threshold value should not be empty"),
    (lambda isvc: isvc["spec"]["predictor"].update(minReplicas=4),
     "'MinReplicas' cannot be greater than MaxReplicas"),
    (lambda isvc: annotate(isvc, "hpa"),
     "invalid HPA metric source type with value [External],valid metric source types are Resource"),
    (lambda isvc: as_hpa_with(isvc, 150), "the target utilization percentage should be a [1-100] integer"),
])
def test_kserves_rules_as_restated_refuse_what_kserve_refuses(change, error):
    isvc = keda_isvc()
    assert webhook_error(isvc) is None
    change(isvc)
    assert webhook_error(isvc) == error


def test_kedas_crd_as_pinned_refuses_a_scaled_object_kserve_could_not_write(validate_crd):
    scaled = scaled_object(keda_isvc(), "dist-ml")
    assert validate_crd(SCALED_OBJECT_CRD, scaled) == []
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 4  # metadata is map[string]string
    assert validate_crd(SCALED_OBJECT_CRD, scaled)
    del scaled["spec"]["triggers"]
    assert any("triggers" in e for e in validate_crd(SCALED_OBJECT_CRD, scaled))


def test_a_stack_file_with_the_old_scaling_keys_names_what_replaced_them():
    values = render.pulumi_values(STACK_FILES["local"])
    serving = json.loads(values["dist-ml:serving"])
    serving.pop("autoscaling")
    values["dist-ml:serving"] = json.dumps({**serving, "scaleMetric": "cpu", "scaleTarget": 80})
    error = stack_checks.config_error_before_any_resource("local", values)
    assert error.startswith("stack config: serving.scaleMetric: replaced by serving.autoscaling.metric")
