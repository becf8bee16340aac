"""What the platform installs for a stack config, read by the composition (stacks/compose.py), by the
cluster kinds that open the network to it (the GKE firewall for its webhooks), by the artifact
directory's tooling (stacks/artifacts.py) and by the tests, without declaring anything."""

from __future__ import annotations

from pathlib import Path

import pulumi_kubernetes as k8s

from common.installs import Install, KustomizeInstall, control_plane_ports
from engines import ENGINES
from infra.monitoring import chart_install
from infra.platform import PlatformArgs, platform_installs
from stacks.settings import StackConfig

REPO_ROOT = Path(__file__).resolve().parents[1]  # the project: a relative artifactDirectory is under it
MONITORING = "monitoring"  # the Monitoring component's name, which its chart's release name carries


def platform_args(config: StackConfig, provider: k8s.Provider | None) -> PlatformArgs:
    """The platform; with KEDA only when serving scales on load (three pods and an external-metrics
    API service that nothing would use otherwise)."""
    versions = config.platform
    engine = ENGINES[config.pipeline.engine]
    return PlatformArgs(
        engine=engine,
        engine_versions={field: getattr(versions, field) for field in engine.stack_keys.get("platform", ())},
        namespace=config.namespace,
        argo_version=versions.argo_version,
        cert_manager_version=versions.cert_manager_version if versions.install_cert_manager else None,
        kserve_version=versions.kserve_version,
        provider=provider, sources=versions.sources(REPO_ROOT),
        controller_requests=(versions.controller_requests.as_requests() if versions.controller_requests
                             else {}),
        keda_version=versions.keda_version if config.pipeline.serving.autoscaling.on_load else None)


def installed_artifacts(config: StackConfig) -> list[Install]:
    """Every chart and kustomization the stack installs: what its artifact directory must hold."""
    installs = platform_installs(platform_args(config, None)).all()
    if config.monitoring.enabled and config.monitoring.prometheus_url is None:
        installs.append(chart_install(MONITORING, config.monitoring.kube_prometheus_stack_version))
    return installs


def missing_artifacts(config: StackConfig) -> list[str]:
    """What the artifact directory lacks of installed_artifacts (none without a directory)."""
    sources = config.platform.sources(REPO_ROOT)
    if sources.directory is None:
        return []
    wanted = [install.artifact for install in installed_artifacts(config)
              if isinstance(install, KustomizeInstall) or sources.chart_mirror is None]
    return [path for path in dict.fromkeys(wanted) if not (Path(sources.directory) / path).exists()]


def platform_ports(config: StackConfig) -> tuple[int, ...]:
    """The ports the control plane calls on the platform's pods (their webhooks and aggregated APIs)."""
    return control_plane_ports(installed_artifacts(config))
