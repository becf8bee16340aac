"""Monitoring: kube-prometheus-stack, a PodMonitor for our predictor, a ServiceMonitor for the training
engine's controller (its metrics() says where: Kueue's, which queues the TrainJobs, or the training
operator's), and a Grafana dashboard of the system (request rate, latency p50/p99, predictor replicas,
and the engine's own panel: the training queue, or TFJob outcomes).

Each monitor names a port that exists: our server serves /metrics on its HTTP port, which the
InferenceService names; the predictor's monitor covers the stable and the canary InferenceService and
labels their series with which one (what KEDA's queries select, common.cluster_names.load_query).
KServe's TF Serving runtime serves no Prometheus metrics unless given a monitoring config, so with
runtime `tensorflow` the predictor has no monitor.
"""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pulumi_kubernetes as k8s

from cluster_steps.inference_service import CUSTOM_RUNTIME, PREDICTOR_PORT_NAME
from common.cluster_names import ISVC_LABEL, canary_name
from common.cluster_target import PART_OF
from common.installs import ArtifactSources, ChartInstall, chart_source
from engines.base import TrainingEngine

NAMESPACE = "monitoring"
CHART = "kube-prometheus-stack"
CHART_REPOSITORY = "https://prometheus-community.github.io/helm-charts"
# Prometheus's Service port (the chart's prometheus.service.port).
PROMETHEUS_PORT = 9090
# How often the predictor's pods are scraped: six samples in the minute KEDA's load queries average
# over (the chart's default interval is 30 s).
PREDICTOR_SCRAPE_INTERVAL = "10s"
# Values: helm.v4.Chart skips Helm hooks, and the chart's admission-webhook certificate jobs are
# hooks; without them the operator's webhook and TLS would wait for a secret that never comes.
CHART_VALUES = {
    "prometheusOperator": {"admissionWebhooks": {"enabled": False}, "tls": {"enabled": False}},
    # Select PodMonitors and ServiceMonitors of every namespace, not only the chart's own.
    "prometheus": {"prometheusSpec": {"podMonitorSelectorNilUsesHelmValues": False,
                                      "serviceMonitorSelectorNilUsesHelmValues": False}},
    "grafana": {"sidecar": {"dashboards": {"enabled": True, "label": "grafana_dashboard",
                                           "searchNamespace": "ALL"}}},
}


def panel(title: str, expressions: dict[str, str], unit: str, x: int, y: int) -> dict:
    return {"type": "timeseries", "title": title, "gridPos": {"x": x, "y": y, "w": 12, "h": 8},
            "fieldConfig": {"defaults": {"unit": unit}},
            "targets": [{"expr": expr, "legendFormat": legend, "refId": chr(ord("A") + index)}
                        for index, (legend, expr) in enumerate(expressions.items())]}


def dashboard(namespace: str, model_name: str, engine: TrainingEngine) -> dict:
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
            panel(*engine.dashboard(namespace), "short", 12, 8),
        ],
    }


def release_name(component: str) -> str:
    """The Helm release name of the Monitoring component `component`'s chart."""
    return f"{component}-{CHART}"


def prometheus_url(component: str) -> str:
    """Prometheus's address in the cluster. kube-prometheus-stack 80.4.1 names its Service
    `<fullname>-prometheus` (templates/prometheus/service.yaml), where fullname, for a release name
    that contains the chart's name, is the release name cut to 26 characters with a trailing "-"
    trimmed (templates/_helpers.tpl, kube-prometheus-stack.fullname)."""
    fullname = release_name(component)[:26].removesuffix("-")
    return f"http://{fullname}-prometheus.{NAMESPACE}.svc:{PROMETHEUS_PORT}"


def monitor(kind: str, name: str, namespace: str, selector: dict, endpoint: dict, **spec: object) -> dict:
    """A PodMonitor or ServiceMonitor scraping `endpoint` (its port, path, ...) of what `selector`
    selects; `spec`: more of the monitor's spec."""
    endpoints = "podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "labels": PART_OF},
            "spec": {"selector": selector, endpoints: [endpoint], **spec}}


def metrics_on(port: str) -> dict:
    return {"port": port, "path": "/metrics"}


def monitors(namespace: str, model_name: str, runtime: str, engine: TrainingEngine) -> list[dict]:
    source = engine.metrics()
    found = [monitor("ServiceMonitor", source.name, source.namespace,
                     {"matchLabels": dict(source.service_labels)}, dict(source.endpoint))]
    if runtime == CUSTOM_RUNTIME:
        predictors = {"key": ISVC_LABEL, "operator": "In", "values": [model_name, canary_name(model_name)]}
        found.append(monitor("PodMonitor", "dist-ml-predictor", namespace, {"matchExpressions": [predictors]},
                             {**metrics_on(PREDICTOR_PORT_NAME), "interval": PREDICTOR_SCRAPE_INTERVAL},
                             podTargetLabels=[ISVC_LABEL]))
    return found


def chart_install(component: str, version: str, image_mirror: str | None = None) -> ChartInstall:
    """kube-prometheus-stack, its every image from the mirror if any (the chart's global registry: the
    operator's Prometheus and Alertmanager too, which no manifest of the chart names)."""
    values = CHART_VALUES if image_mirror is None else {
        **CHART_VALUES, "global": {"imageRegistry": image_mirror}}
    return ChartInstall(CHART, CHART, CHART_REPOSITORY, version, NAMESPACE, values,
                        release=release_name(component))  # no webhook: CHART_VALUES turn them off


@dataclasses.dataclass(frozen=True)
class MonitoringArgs:
    chart_version: str
    namespace: str  # the system's
    model_name: str
    runtime: str  # the predictor's: custom or tensorflow
    engine: TrainingEngine  # pipeline.engine's: what trains, and so what to monitor
    provider: k8s.Provider
    depends_on: list[pulumi.Resource]  # the training engine's install, the system's namespace
    sources: ArtifactSources = ArtifactSources()
    own_prometheus: bool = True  # False: the cluster's Prometheus Operator serves the monitors
    # The system's namespace: `pulumi destroy` deletes what is in it with it (deleted_with), see
    # stacks/compose.py.
    deleted_with: pulumi.Resource | None = None


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:Monitoring", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)
        installed, dashboards = [], args.namespace  # the cluster's own Grafana finds it in the system's
        if args.own_prometheus:
            namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": NAMESPACE},
                                              opts=on_cluster)
            install = chart_install(name, args.chart_version, args.sources.image_mirror)
            source = chart_source(install, args.sources)
            installed = [k8s.helm.v4.Chart(
                release_name(name), name=install.release, chart=source.chart, version=source.version,
                repository_opts={"repo": source.repository} if source.repository else None,
                namespace=NAMESPACE, values=install.values,
                opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[namespace])),
                namespace]
            dashboards = NAMESPACE
        after_chart = pulumi.ResourceOptions(parent=self, provider=args.provider,
                                             depends_on=[*installed, *args.depends_on])
        in_namespace = pulumi.ResourceOptions.merge(after_chart, pulumi.ResourceOptions(
            deleted_with=args.deleted_with))
        for manifest in monitors(args.namespace, args.model_name, args.runtime, args.engine):
            k8s.apiextensions.CustomResource(
                f"{name}-{manifest['metadata']['name']}", api_version=manifest["apiVersion"],
                kind=manifest["kind"], metadata=manifest["metadata"], spec=manifest["spec"],
                opts=in_namespace if manifest["metadata"]["namespace"] == args.namespace else after_chart)
        k8s.core.v1.ConfigMap(
            f"{name}-dashboard",
            metadata={"name": "dist-ml-dashboard", "namespace": dashboards,
                      "labels": {"grafana_dashboard": "1", **PART_OF}},
            data={"dist-ml.json": json.dumps(dashboard(args.namespace, args.model_name, args.engine),
                                             indent=2)},
            opts=in_namespace if dashboards == args.namespace else after_chart)
        self.register_outputs({})
