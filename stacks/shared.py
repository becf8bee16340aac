"""What every stack declares the same way, whatever its cluster: the platform, monitoring, and the
stack outputs that tell a user how to reach the system."""

from __future__ import annotations

import posixpath

import pulumi
import pulumi_kubernetes as k8s

from infra.monitoring import NAMESPACE as MONITORING_NAMESPACE
from infra.monitoring import Monitoring, MonitoringArgs
from infra.platform import Platform, PlatformArgs
from pipeline.argo import ARGO_NAMESPACE
from pipeline.definition import Layout
from pipeline.manifests import ClusterStorage
from stacks.config import StackConfig

PORT_FORWARD_PORT = 8080


def declare_platform(config: StackConfig, provider: k8s.Provider, kubeconfig: pulumi.Input[str]) -> Platform:
    versions = config.platform
    return Platform("platform", PlatformArgs(
        training_operator_version=versions.training_operator_version,
        argo_version=versions.argo_version,
        cert_manager_version=versions.cert_manager_version,
        kserve_version=versions.kserve_version,
        provider=provider, kubeconfig=kubeconfig))


def declare_monitoring(config: StackConfig, provider: k8s.Provider, platform: Platform,
                       namespace: k8s.core.v1.Namespace) -> dict[str, str]:
    """Monitoring when config enables it (its monitors go in the platform's and the system's
    namespaces); returns its stack outputs (none when disabled)."""
    if not config.monitoring.enabled:
        return {}
    Monitoring("monitoring", MonitoringArgs(
        chart_version=config.monitoring.kube_prometheus_stack_version, namespace=config.namespace,
        model_name=config.pipeline.model_name, runtime=config.pipeline.serving.runtime, provider=provider,
        depends_on=[*platform.ready, namespace]))
    return {"grafana": f"kubectl -n {MONITORING_NAMESPACE} port-forward "
                       "service/monitoring-kube-prometheus-stack-grafana 3000:80"}


def access_outputs(config: StackConfig, kubeconfig: pulumi.Input[str],
                   storage: ClusterStorage) -> dict[str, pulumi.Input]:
    model = config.pipeline.model_name
    return {
        "kubeconfig": kubeconfig,
        # The pipeline's serve step creates it, with the version the run published.
        "inferenceService": f"{config.namespace}/{model}",
        "inferencePortForward": f"kubectl -n {config.namespace} port-forward "
                                f"service/{model}-predictor {PORT_FORWARD_PORT}:80",
        "inferenceUrl": f"http://localhost:{PORT_FORWARD_PORT}/v1/models/{model}:predict",
        "modelRepository": posixpath.join(Layout(storage.uri).models, model),
        "argoUi": f"kubectl -n {ARGO_NAMESPACE} port-forward service/argo-server 2746:2746 "
                  "# then open https://localhost:2746",
        "runPipeline": f"argo submit -n {config.namespace} --from workflowtemplate/dist-ml-pipeline --watch",
    }
