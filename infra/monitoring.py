"""Monitoring: kube-prometheus-stack, PodMonitors for the predictor and the training operator, and a
Grafana dashboard of the system (request rate, latency p50/p99, predictor replicas, TFJob outcomes)."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pulumi_kubernetes as k8s

from pipeline.manifests import PART_OF, PREDICTOR_PORT_NAME

NAMESPACE = "monitoring"
CHART_REPOSITORY = "https://prometheus-community.github.io/helm-charts"
TRAINING_OPERATOR_NAMESPACE = "kubeflow"
# Values: helm.v4.Chart skips Helm hooks, and the chart's admission-webhook certificate jobs are
# hooks; without them the operator's webhook and TLS would wait for a secret that never comes.
CHART_VALUES = {
    "prometheusOperator": {"admissionWebhooks": {"enabled": False}, "tls": {"enabled": False}},
    # Select PodMonitors of every namespace, not only the chart's own.
    "prometheus": {"prometheusSpec": {"podMonitorSelectorNilUsesHelmValues": False}},
    "grafana": {"sidecar": {"dashboards": {"enabled": True, "label": "grafana_dashboard",
                                           "searchNamespace": "ALL"}}},
}


def panel(title: str, expressions: dict[str, str], unit: str, x: int, y: int) -> dict:
    return {"type": "timeseries", "title": title, "gridPos": {"x": x, "y": y, "w": 12, "h": 8},
            "fieldConfig": {"defaults": {"unit": unit}},
            "targets": [{"expr": expr, "legendFormat": legend, "refId": chr(ord("A") + index)}
                        for index, (legend, expr) in enumerate(expressions.items())]}


def dashboard(namespace: str, model_name: str) -> dict:
    latency = "histogram_quantile({q}, sum by (le) (rate(dist_ml_request_seconds_bucket[5m])))"
    return {
        "title": "dist-ml", "uid": "dist-ml", "schemaVersion": 39, "time": {"from": "now-1h", "to": "now"},
        "panels": [
            panel("Request rate",
                  {"{{protocol}} {{status}}": "sum by (protocol, status) (rate(dist_ml_requests_total[1m]))"},
                  "reqps", 0, 0),
            panel("Latency", {"p50": latency.format(q=0.5), "p99": latency.format(q=0.99)}, "s", 12, 0),
            panel("Predictor replicas", {"available": (
                f'sum(kube_deployment_status_replicas_available{{namespace="{namespace}", '
                f'deployment=~"{model_name}-predictor.*"}})')}, "short", 0, 8),
            panel("TFJobs", {
                name: f'sum(training_operator_jobs_{name}_total{{job_namespace="{namespace}"}})'
                for name in ("created", "successful", "failed", "restarted")}, "short", 12, 8),
        ],
    }


def pod_monitor(name: str, namespace: str, selector: dict, endpoint: dict) -> dict:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": name, "namespace": namespace, "labels": PART_OF},
            "spec": {"selector": {"matchLabels": selector},
                     "podMetricsEndpoints": [{**endpoint, "path": "/metrics"}]}}


@dataclasses.dataclass(frozen=True)
class MonitoringArgs:
    chart_version: str
    namespace: str  # the system's
    model_name: str
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]  # the training operator's install


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Monitoring", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)
        namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": NAMESPACE}, opts=on_cluster)
        chart = k8s.helm.v4.Chart(
            f"{name}-kube-prometheus-stack", chart="kube-prometheus-stack", version=args.chart_version,
            repository_opts={"repo": CHART_REPOSITORY}, namespace=NAMESPACE, values=CHART_VALUES,
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[namespace]))
        after_chart = pulumi.ResourceOptions(parent=self, provider=args.provider,
                                             depends_on=[chart, *args.depends_on])
        monitors = [
            pod_monitor("dist-ml-predictor", args.namespace,
                        {"serving.kserve.io/inferenceservice": args.model_name},
                        {"port": PREDICTOR_PORT_NAME}),
            # The operator's metrics port (8080) by number: its name was not confirmed offline.
            pod_monitor("training-operator", TRAINING_OPERATOR_NAMESPACE,
                        {"control-plane": "kubeflow-training-operator"}, {"targetPort": 8080}),
        ]
        for monitor in monitors:
            k8s.apiextensions.CustomResource(
                f"{name}-{monitor['metadata']['name']}", api_version=monitor["apiVersion"],
                kind=monitor["kind"], metadata=monitor["metadata"], spec=monitor["spec"], opts=after_chart)
        k8s.core.v1.ConfigMap(
            f"{name}-dashboard",
            metadata={"name": "dist-ml-dashboard", "namespace": NAMESPACE,
                      "labels": {"grafana_dashboard": "1", **PART_OF}},
            data={"dist-ml.json": json.dumps(dashboard(args.namespace, args.model_name), indent=2)},
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[namespace]))
        self.register_outputs({})
