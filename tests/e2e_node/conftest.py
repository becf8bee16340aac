"""The end-to-end run's cluster, made as a user makes one: Kubernetes and a real node (the only node, its
pods run in containerd), with what a cluster a user already has brings (a registry, storage, DNS, the
Gateway API's and the Prometheus Operator's CRDs, cert-manager: the tier's stand-in,
tools/control_plane/cert_manager.py), then `pulumi up` of the stacks' own program, Pulumi's engine and
Kubernetes provider built from their modules (tools/control_plane/pulumi_stack.py), with a stack file
for that cluster (cluster.kind existing) as a user writes it: the platform installed air-gapped from an
artifact directory the tier fills from the components' modules, and every image from the tier's
registry, where the tier pushed them as a user's CI pushes them.

The first `pulumi up` runs before the platform's Kueue image is in the registry, as when a mirror misses
one: it must fail in the kubelet's words within minutes; the image pushed and the pod backing off from
it deleted, a second one completes. At the end of the session `pulumi destroy` must leave no object of
the stack behind.

`python -m tools.control_plane e2e` (make test-e2e) runs it in a tier of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from e2e_runs import POLL_SECONDS, FirstRun, WorkerKiller, run_workflow
from e2e_stack import (
    NAMESPACE,
    PLATFORM_NAMESPACES,
    PROMETHEUS_URL,
    WITHHELD,
    project_reference,
)
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from common.installs import qualified
from stacks.config import from_pulumi_values, parse_stack_config
from stacks.installs import installed_artifacts
from stacks.settings import StackConfig
from testdata import fixtures
from testdata.pins import CRD_PINS
from tools.control_plane import artifacts, build, cert_manager, components, stacks
from tools.control_plane.build import ROOT
from tools.control_plane.cluster import BRIDGE_ADDRESS
from tools.control_plane.kube import Api
from tools.control_plane.nodes.images import NODE, BuiltImage
from tools.control_plane.nodes.real import waiting_containers
from tools.control_plane.pulumi_stack import NeverStarts, PulumiStack, Update
from tools.control_plane.pytest_plugin import start_real_node, unavailable
from tools.control_plane.registry import ADDRESS as REGISTRY
from tools.control_plane.registry import Registry
from tools.control_plane.tier import GATEWAY_API_CRDS, Tier
from tools.control_plane.upstream import load_all

SAMPLE = ROOT / "datasets" / "fashion-mnist-sample"  # the official files' names and format, 600 images
# Pulumi.local.yaml's pipeline section, changed as a user changes it for a short run on a laptop: one
# variant, three epochs (one to lose a pod after, two to resume), each one pass over the sample's 450
# training images, which takes `cnn` well above chance (about 0.7 on the holdout: e2e_runs.MIN_ACCURACY;
# `cnn_gap` needs many more), each published version served at once (no canary waiting for traffic), and
# the dataset from a mirror (as an air-gapped cluster's would be).
E2E_SETTINGS = {"variants": ["cnn"], "epochs": 3, "rollout": {"canaryPercent": 0}}
# The node has the machine's 2 CPUs, and the platform's controllers ask for 1.5 of them (Kueue's and
# JobSet's 500m each, KServe's 200m, KEDA's 300m): our pods ask for little, as on a small cluster, and
# keep their limits.
SMALL = {"cpu": "50m"}
# And the platform's controllers too, as `platform.controllerRequests` lets a small cluster's user.
CONTROLLER_REQUESTS = {"cpu": "50m"}
# Its monitoring and serving sections, as a user sets them to scale the predictor on load with KEDA:
# requests in flight, two per replica, one to two replicas, back down as soon as the load is gone; our
# server holds each batch open a second, so that a client's request is in flight nearly all the time.
# The cluster has its own Prometheus (the scaling test starts it), which KEDA reads.
E2E_SCALING = {
    "monitoring": {"enabled": True, "prometheusUrl": PROMETHEUS_URL},
    "serving": {"minReplicas": 1, "maxReplicas": 2, "maxBatchWaitMs": 1000,
                "autoscaling": {"metric": "inflight", "target": 2, "scaleDownStabilization": "0s"}},
}
# The cluster's Gateway API implementation: none runs here (the e2e predicts through the predictor's
# Service); the Gateway is accepted and stored, and its class named as a user names theirs.
GATEWAY_CLASS = "tier"
# What a user's own cluster brings: the Prometheus Operator's monitor kinds, in the namespace of its
# Prometheus (which the scaling test starts).
MONITOR_CRDS = ("monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_servicemonitors.yaml")
PROMETHEUS_OPERATOR_CRDS = "example/prometheus-operator-crd"


@pytest.fixture(scope="session")
def say(uncaptured):
    """Prints a line of the run's progress, not captured: `make test` shows what the run did (the
    prediction, the served version, the restart, the scaling) even when it passes."""
    return lambda line: uncaptured(f"e2e: {line}")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the run's output is the pods'
        pass


@pytest.fixture(scope="session")
def mirror():
    """The sample's four files over HTTP on the tier's bridge, where the pods reach it: the base URL."""
    server = http.server.ThreadingHTTPServer(
        (BRIDGE_ADDRESS, 0), functools.partial(QuietHandler, directory=str(SAMPLE))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://{BRIDGE_ADDRESS}:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="session")
def tier(tmp_path_factory: pytest.TempPathFactory, uncaptured):
    """Kubernetes alone (the plugin's `tier` starts the upstream controllers as processes; here they
    are the pods `pulumi up` installs)."""
    if not build.MANIFEST.is_file():
        unavailable("the tier's programs are not built: python -m tools.control_plane.build")
    started = Tier(tmp_path_factory.mktemp("control-plane"), build.read_manifest(),
                   stacks.local_config().cluster.name, say=uncaptured)
    try:
        started.start_kubernetes()
        started.announce()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def registry(tier):
    started = Registry(tier.directory, tier.program("registry"), say=tier.say).start()
    yield started
    started.stop()


def stack_file(mirror: str, tier: Tier, artifact_directory) -> dict:
    """The stack's `config:` as a user writes Pulumi.<stack>.yaml for the cluster they have: the local
    stack's pipeline, serving and platform versions, changed for a short run (E2E_SETTINGS, E2E_SCALING,
    SMALL requests), the cluster by its kubeconfig and context, the images they pushed, the platform
    air-gapped (its artifacts from a directory, its images from the registry as a mirror), the cluster's
    own cert-manager, storage class and Prometheus."""
    local = yaml.safe_load((ROOT / "Pulumi.local.yaml").read_text())["config"]
    pipeline = local["dist-ml:pipeline"]
    serving = local["dist-ml:serving"]
    return {
        "dist-ml:namespace": NAMESPACE,
        "dist-ml:cluster": {"kind": "existing", "kubeconfig": str(tier.admin), "context": "tier",
                            "gatewayClass": GATEWAY_CLASS},
        "dist-ml:images": {"trainer": project_reference("trainer"), "serving": project_reference("serving"),
                           "trackingServer": project_reference("tracking-server")},
        "dist-ml:platform": {**local["dist-ml:platform"], "installCertManager": False,
                             "controllerRequests": CONTROLLER_REQUESTS,
                             "artifactDirectory": str(artifact_directory), "imageMirror": REGISTRY},
        "dist-ml:storage": {"storageClass": "local-path"},
        "dist-ml:monitoring": E2E_SCALING["monitoring"],
        "dist-ml:pipeline": {
            **pipeline, **E2E_SETTINGS, "dataSource": mirror,
            "trainerResources": small(pipeline["trainerResources"]),
            "stepResources": small(pipeline["stepResources"])},
        "dist-ml:serving": {**serving, **E2E_SCALING["serving"], "resources": small(serving["resources"])},
    }


def small(resources: dict) -> dict:
    return {**resources, "requests": {**resources["requests"], **SMALL}}


def the_clusters_own(tier: Tier) -> None:
    """What the cluster a user has brings before the stack: the Gateway API's CRDs (its Gateway
    implementation's), the Prometheus Operator's monitor kinds and its Prometheus's namespace, and
    cert-manager (its CRDs from its module; the tier's stand-in for its programs)."""
    components_ = tier.components
    operator = components_["prometheus-operator"].module_dir
    crds = [crd for pin in CRD_PINS.values() if pin.name.endswith(GATEWAY_API_CRDS)
            for crd in load_all(fixtures.resolve(pin).read_text())]
    crds += [crd for name in MONITOR_CRDS
             for crd in load_all((Path(operator) / PROMETHEUS_OPERATOR_CRDS / name).read_text())]
    crds += cert_manager.crds(Path(components_["cert-manager"].module_dir))
    tier.api.create_all(crds)
    for crd in crds:
        tier.api.wait_established(crd["metadata"]["name"])
    tier.api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}})


@dataclasses.dataclass
class PulumiCluster:
    """The tier, its node, and the stack `pulumi up` made on it."""

    tier: Tier
    stack: PulumiStack
    updates: list[Update]
    never_started: str  # the first up's failure, in the kubelet's words
    never_started_seconds: float
    config: StackConfig  # the stack file's, parsed as the program parses it

    def __getattr__(self, name):  # the tier's api, real_node, kubeconfig_for, ...
        return getattr(self.tier, name)


def withheld(image: BuiltImage) -> bool:
    return image.name.startswith(qualified(WITHHELD) + ":")


def restart_pulls(api: Api, references: list[str]) -> list[str]:
    """Deletes each pod with a container waiting to pull one of `references`, as a user does once the
    image is pushed: the kubelet retries a pull only when its back-off ends (up to 5 min), and the
    pod's ReplicaSet starts a new one at once. The pods' names."""
    deleted = []
    for pod in api.list("v1", "Pod"):
        if any(container["image"] in references for container, _ in waiting_containers(pod)):
            api.delete("v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])
            deleted.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
    return deleted


def push(registry: Registry, built: list[BuiltImage]) -> None:
    """The project's images and the platform's into the registry, each where the stack's config names
    it (the project's under its references, the platform's under the mirror's paths)."""
    for image in built:
        if image.role != NODE:
            registry.push(image.name, registry.mirrored(image.name))


@pytest.fixture(scope="session")
def cluster(tier: Tier, registry: Registry, mirror, say) -> PulumiCluster:
    """The stack `pulumi up` installed on the tier (its first up failing on an image the registry lacks,
    its second completing), destroyed at the end of the session, leaving nothing of it behind."""
    node = start_real_node(tier, registries=(registry.address,))
    built = node.images.built
    directory = tier.directory / "artifacts"
    directory.mkdir()
    config = stack_file(mirror, tier, directory)
    parsed = parse_stack_config(from_pulumi_values(render_values(config)))
    provenance = artifacts.fill(directory, installed_artifacts(parsed), tier.components,
                                tier.program("kubectl"))
    say("artifacts: " + ", ".join(f"{path} ({item['module']}@{item['version']})"
                                  for path, item in provenance.items()))
    the_clusters_own(tier)
    stand_in = cert_manager.StandIn(tier.api, say).start()
    started = time.monotonic()
    push(registry, [image for image in built if not withheld(image)])
    for image in filter(withheld, built):  # neither in the registry nor in the node's store from a run before
        registry.remove(registry.mirrored(image.name))
        node.forget(registry.mirrored(image.name))
    say(f"pushed the images to {registry.address} ({time.monotonic() - started:.0f} s), but {WITHHELD}")
    engine, provider = tier.program("pulumi"), tier.program("pulumi-resource-kubernetes")
    stack = PulumiStack(tier.directory / "pulumi", engine, provider,
                        components.locked_version(components.PULUMI_KUBERNETES_SDK).removeprefix("v"),
                        config, tier.api, say)
    say(f"engine {stack.version()}; the stack file:\n{yaml.safe_dump({'config': config}, sort_keys=False)}")
    started = time.monotonic()
    with pytest.raises(NeverStarts) as first:
        stack.up()
    never_started_seconds = time.monotonic() - started
    say(f"the first pulumi up failed after {never_started_seconds:.0f} s: {first.value}")
    push(registry, list(filter(withheld, built)))
    restarted = restart_pulls(tier.api, [registry.mirrored(image.name) for image in filter(withheld, built)])
    say(f"deleted the pods backing off from pulling it, for their ReplicaSets to start anew: "
        f"{', '.join(restarted) or 'none'}")
    updates = [stack.up()]
    print_platform(tier, say)
    try:
        yield PulumiCluster(tier, stack, updates, str(first.value), never_started_seconds, parsed)
    finally:
        stand_in.stop()
    left = stack.resources()
    updates.append(stack.destroy())
    still_there = [f"{item['kind']} {item['namespace'] or ''}/{item['name']}" for item in left
                   if still_served(tier, item)]
    assert not still_there, f"pulumi destroy left: {', '.join(still_there)}"
    say(f"pulumi destroy left none of the stack's {len(left)} objects")


@pytest.fixture(scope="session")
def first_run(cluster: PulumiCluster, say) -> FirstRun:
    """The session's first run of the stack's workflow, worker 1 of its TrainJob SIGKILLed on the node
    after the first epoch: every scenario after it has a published, served version (a test run alone
    runs it first)."""
    started = time.monotonic()
    killer = WorkerKiller(cluster)
    killer.start()
    workflow = run_workflow(cluster.api, say)
    seconds = time.monotonic() - started
    say(f"workflow {workflow['metadata']['name']} Succeeded in {seconds:.0f} s")
    killer.join(timeout=POLL_SECONDS)
    return FirstRun(workflow, killer, seconds)


@pytest.fixture(scope="session", autouse=True)
def pulls_stay_in_the_tier(tier: Tier):
    """After the session: the node's runtime was asked for no image outside the tier's registry (its
    containerd's log of the kubelet's pulls), so no test sent a request off this machine."""
    yield
    if tier.real_node is not None:
        outside = tier.real_node.pulls_outside()
        assert not outside, f"the node was asked to pull from outside the tier: {', '.join(outside)}"


def still_served(tier: Tier, item: dict) -> bool:
    """Whether the API server still has the object (a kind whose CRD is gone has none)."""
    try:
        return tier.api.get(item["apiVersion"], item["kind"], item["name"], item["namespace"]) is not None
    except ResourceNotFoundError:
        return False


def render_values(config: dict) -> dict[str, str]:
    """The stack file's config as the engine hands it to the program (structured values as JSON)."""
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in config.items()}


def print_platform(tier: Tier, say) -> None:
    """The platform's pods: namespace, name, phase, service account."""
    for namespace in PLATFORM_NAMESPACES:
        for pod in tier.api.list("v1", "Pod", namespace):
            say(f"platform pod {namespace}/{pod['metadata']['name']}: {pod['status'].get('phase')}, "
                f"service account {pod['spec'].get('serviceAccountName')}")
