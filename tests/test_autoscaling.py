"""Scaling the predictor, on both stacks and in every mode: the stacks render and validate; KEDA is
installed (pinned, before KServe's controller) exactly when the predictor scales on load; the
predictor's PodMonitor scrapes and labels its pods for the query. What KServe's webhook and controller
and KEDA make of the InferenceService, the control-plane tier checks with their code
(tests/cluster/test_autoscaling.py)."""

from __future__ import annotations

import json

import pytest
import stack_checks
from conftest import REPO_ROOT
from stack_checks import closure, embedded, objects_of, rendered_stack, validate_all

from common.cluster_target import DEFAULT_PROMETHEUS_URL, KUBERNETES_MINOR
from infra.monitoring import prometheus_url
from stacks import render
from stacks.declared import Declared
from stacks.installs import MONITORING

STACK_FILES = {"local": REPO_ROOT / "Pulumi.local.yaml", "gke": REPO_ROOT / "Pulumi.gke.yaml"}
METRICS = ("inflight", "rps", "cpu", "memory")
HELM_CHART = "kubernetes:helm.sh/v4:Chart"
KUSTOMIZE = "kubernetes:kustomize/v2:Directory"


def values(stack: str, metric: str) -> dict[str, str]:
    found = stack_checks.stack_values(STACK_FILES[stack], monitoring={"enabled": True},
                                      serving={"autoscaling": {"metric": metric}})
    return {**found, "gcp:project": "dist-ml-test-4821"} if stack == "gke" else found


@pytest.fixture(scope="module", params=[(stack, metric) for stack in STACK_FILES for metric in METRICS],
                ids=lambda param: "-".join(param))
def rendered(request) -> tuple[str, render.Rendered]:
    stack, metric = request.param
    return metric, rendered_stack(stack, values(stack, metric))


def predictor_isvc(stack: render.Rendered) -> dict:
    (template,) = objects_of(stack, "WorkflowTemplate")
    return embedded(template, "serve")


def charts(stack: render.Rendered) -> dict[str, Declared]:
    return {r.inputs["chart"].rpartition("/")[2]: r for r in stack.of_type(HELM_CHART)}


def test_every_stack_renders_and_validates_in_every_mode(rendered, validate_crd):
    metric, stack = rendered
    assert validate_all(stack, validate_crd, "v4", KUBERNETES_MINOR) >= 15
    isvc = predictor_isvc(stack)
    expected_class = "keda" if metric in ("inflight", "rps") else "hpa"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == expected_class


def keda_installs(stack: render.Rendered) -> list[Declared]:
    return [r for r in stack.of_type(KUSTOMIZE) if "kedacore/keda" in r.inputs["directory"]]


def test_keda_is_installed_pinned_before_kserves_controller_only_when_the_predictor_scales_on_load(rendered):
    metric, stack = rendered
    found = charts(stack)
    controller = found["kserve-resources"].inputs["values"]["kserve"]["controller"]
    if metric in ("cpu", "memory"):
        assert not keda_installs(stack) and "podAnnotations" not in controller
        return
    # KEDA's release YAML, as its Makefile makes it: its config/default at the tag (its images' tags set
    # to the release by a transform, common/installs.py with_images; its own namespace comes with it).
    (keda,) = keda_installs(stack)
    assert keda.inputs["directory"] == "https://github.com/kedacore/keda.git/config/default?ref=v2.21.0"
    # KServe's controller looks for the ScaledObject CRD once, at start: after KEDA, and restarted by a
    # change of it.
    assert keda.name in closure(stack, found["kserve-resources"].name)
    assert controller["podAnnotations"] == {"dist-ml/keda-version": "2.21.0"}


def test_a_predictor_scaled_on_cpu_or_memory_names_its_metric_for_kserves_hpa(rendered):
    metric, stack = rendered
    predictor = predictor_isvc(stack)["spec"]["predictor"]
    if metric in ("cpu", "memory"):  # KServe's HPA, on the resource: no ScaledObject, no query
        assert "autoScaling" not in predictor and predictor["scaleMetric"] == metric
    else:
        (found,) = predictor["autoScaling"]["metrics"]
        assert found["external"]["metric"]["serverAddress"] == prometheus_url(MONITORING)


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
    (chart,) = [r for r in rendered_stack("gke", values("gke", "inflight")).of_type(HELM_CHART)
                if r.inputs["chart"] == "kube-prometheus-stack"]
    assert chart.inputs["name"] == "monitoring-kube-prometheus-stack"


def test_by_default_gke_scales_on_requests_in_flight_and_k3d_without_monitoring_on_cpu():
    gke_file = render.pulumi_values(STACK_FILES["gke"])
    gke = rendered_stack("gke", {**gke_file, "gcp:project": "dist-ml-test-4821"})
    assert keda_installs(gke)
    (metric,) = predictor_isvc(gke)["spec"]["predictor"]["autoScaling"]["metrics"]
    assert "dist_ml_requests_in_flight" in metric["external"]["metric"]["query"]
    local = rendered_stack("local", render.pulumi_values(STACK_FILES["local"]))
    assert not keda_installs(local)
    assert predictor_isvc(local)["spec"]["predictor"]["scaleMetric"] == "cpu"


def test_a_stack_file_with_the_old_scaling_keys_names_what_replaced_them():
    values = render.pulumi_values(STACK_FILES["local"])
    serving = json.loads(values["dist-ml:serving"])
    serving.pop("autoscaling")
    values["dist-ml:serving"] = json.dumps({**serving, "scaleMetric": "cpu", "scaleTarget": 80})
    error = stack_checks.config_error_before_any_resource("local", values)
    assert error.startswith("stack config: serving.scaleMetric: replaced by serving.autoscaling.metric")
