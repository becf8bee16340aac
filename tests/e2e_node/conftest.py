"""The end-to-end run's cluster: the tier with its real node as the one node pods land on (the simulated
k3d node cordoned), k3s' local-path provisioner, and the local stack applied as `pulumi up` applies it,
with the settings a user sets for a small offline run (E2E_SETTINGS) and the dataset served inside the
tier as a mirror. `python -m tools.control_plane e2e` (make test-e2e) runs it in a tier of its own."""

from __future__ import annotations

import functools
import http.server
import threading

import pytest

from stacks import render
from tools.control_plane import stacks
from tools.control_plane.build import ROOT
from tools.control_plane.cluster import BRIDGE_ADDRESS
from tools.control_plane.pytest_plugin import start_real_node
from tools.control_plane.tier import Tier

SAMPLE = ROOT / "datasets" / "fashion-mnist-sample"  # the official files' names and format, 600 images
# Pulumi.local.yaml's pipeline section, changed as a user changes it for a short run on a laptop: one
# variant, three short epochs (one to lose a pod after, two to resume), each published version served at
# once (no canary waiting for traffic), and the dataset from a mirror (as an air-gapped cluster's would be).
E2E_SETTINGS = {"variants": ["cnn_gap"], "epochs": 3, "stepsPerEpoch": 4, "rollout": {"canaryPercent": 0}}
# Its monitoring and serving sections, as a user sets them to scale the predictor on load with KEDA:
# requests in flight, two per replica, one to two replicas, back down as soon as the load is gone; our
# server holds each batch open a second, so that a client's request is in flight nearly all the time.
E2E_SCALING = {
    "monitoring": {"enabled": True},
    "serving": {"minReplicas": 1, "maxReplicas": 2, "maxBatchWaitMs": 1000,
                "autoscaling": {"metric": "inflight", "target": 2, "scaleDownStabilization": "0s"}},
}


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
def local_render(mirror) -> tuple[render.Rendered, str]:
    """Pulumi.local.yaml with E2E_SETTINGS and the mirror as pipeline.dataSource, rendered."""
    return stacks.local_stack(pipeline={**E2E_SETTINGS, "dataSource": mirror}, **E2E_SCALING)


@pytest.fixture(scope="session")
def cluster(tier: Tier, local_render) -> Tier:
    """The tier, its real node the only schedulable one, and the local stack's objects applied; the
    stack's claims are provisioned by local-path on the node when their first pod lands there."""
    start_real_node(tier)
    objects, _ = stacks.served(tier.api, stacks.in_dependency_order(local_render[0]))
    tier.api.apply_all(objects)
    return tier
