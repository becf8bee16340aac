"""Debian's Prometheus scraping as the stacks' monitoring scrapes, for the tests that run it: the
stacks' PodMonitor done as Prometheus Operator and Prometheus' Kubernetes discovery do it on a cluster,
where neither runs (Debian builds Prometheus without Kubernetes discovery): the labels the operator's
relabeling gives a target (v0.87.1 pkg/prometheus/promcfg.go generatePodMonitorConfig 1483-1538), and
the pods a monitor selects as file_sd targets, which Prometheus reads when the file changes; and the
port a Prometheus bound to port 0 got."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import psutil

PORT_SECONDS = 120.0


def listening_port(process: subprocess.Popen, log: Path, timeout: float = PORT_SECONDS) -> int:
    """The TCP port `process` (bound to port 0) listens on, read from its socket (Prometheus logs the
    address it was given, 127.0.0.1:0, before the one it got)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}: {log.read_text()[-2000:]}")
        ports = {c.laddr.port for c in psutil.Process(process.pid).connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
        if ports:
            (port,) = ports
            return port
        time.sleep(0.2)
    raise AssertionError(f"not listening after {timeout:.0f}s: {log.read_text()[-2000:]}")


def target_labels(podmonitor: dict, namespace: str, pod: str, container: str,
                  pod_labels: dict[str, str]) -> dict[str, str]:
    """What the operator's relabeling gives the target of `podmonitor` in `container` of `pod`:
    `namespace`, `pod`, `container`, `job`, `endpoint`, and each podTargetLabels label under its
    sanitized name."""
    sanitized = {re.sub(r"[^a-zA-Z0-9_]", "_", name): pod_labels[name]
                 for name in podmonitor["spec"].get("podTargetLabels", []) if name in pod_labels}
    (endpoint,) = podmonitor["spec"]["podMetricsEndpoints"]
    metadata = podmonitor["metadata"]
    return {"namespace": namespace, "container": container, "pod": pod, **sanitized,
            "job": f"{metadata['namespace']}/{metadata['name']}", "endpoint": endpoint["port"]}


def selects(podmonitor: dict, pod: dict) -> bool:
    """Whether the monitor's selector (matchLabels, matchExpressions In) selects `pod`, in its namespace."""
    if pod["metadata"]["namespace"] != podmonitor["metadata"]["namespace"]:
        return False
    labels = pod["metadata"].get("labels", {})
    selector = podmonitor["spec"]["selector"]
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", f"not done here: {expression}"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def file_targets(podmonitor: dict, pods: list[dict]) -> list[dict]:
    """file_sd's entries for the Running pods the monitor selects: each container port named as the
    monitor's endpoint, at the pod's address, with the operator's labels."""
    (endpoint,) = podmonitor["spec"]["podMetricsEndpoints"]
    found = []
    for pod in pods:
        if not selects(podmonitor, pod) or pod.get("status", {}).get("phase") != "Running":
            continue
        address = pod["status"].get("podIP")
        for container in pod["spec"]["containers"]:
            for port in container.get("ports", []):
                if address and port.get("name") == endpoint["port"]:
                    labels = target_labels(podmonitor, pod["metadata"]["namespace"], pod["metadata"]["name"],
                                           container["name"], pod["metadata"].get("labels", {}))
                    found.append({"targets": [f"{address}:{port['containerPort']}"], "labels": labels})
    return found


def write_targets(path: Path, targets: list[dict]) -> None:
    """The file whole or not at all: Prometheus may read it at any moment."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(targets))
    os.replace(partial, path)
