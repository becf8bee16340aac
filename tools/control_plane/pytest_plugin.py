"""The control-plane tier's pytest plugin (`python -m tools.control_plane test` and `e2e` load it for
tests/cluster/ and tests/e2e_node/): one tier for the session (the real API server and the upstream
controllers the stacks install), the local stack's objects applied to it, the workflow's identity,
and the real node.

Those tests run only in the tier's own network namespace: `make test-cluster`, or
`python -m tools.control_plane test -k NAME` for one of them (tests/conftest.py leaves tests/cluster/
out of any other run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from stacks import render
from tools.control_plane import build, stacks
from tools.control_plane.build import in_ci
from tools.control_plane.nodes import images, kwok
from tools.control_plane.nodes.real import RealNode
from tools.control_plane.tier import Tier


@pytest.fixture(scope="session")
def rendered() -> render.Rendered:
    """Pulumi.local.yaml under Pulumi's mocks."""
    return stacks.local_stack()


def unavailable(message: str) -> None:
    if in_ci():
        pytest.fail(f"{message} (CI=true, so not skipped)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def uncaptured(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """Prints a line as it happens, not captured, so that a passing run shows it too (each component's
    line as the tier starts, the end-to-end run's progress). From the tests' own thread only: the
    capture is suspended around each line."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(line, flush=True)

    return say


@pytest.fixture(scope="session")
def tier(tmp_path_factory: pytest.TempPathFactory, uncaptured, rendered):
    if not build.MANIFEST.is_file():
        unavailable(
            "the tier's programs are not built: python -m tools.control_plane.build (make test-cluster does)"
        )
    started = Tier(
        tmp_path_factory.mktemp("control-plane"), build.read_manifest(), stacks.local_config().cluster.name,
        say=uncaptured,
    )
    try:
        started.start(rendered)
        yield started
    finally:
        started.stop()


def start_real_node(tier: Tier, registries: tuple[str, ...] = ()) -> RealNode:
    """The tier's real node with the images tools.control_plane.nodes.images built, pulling from `registries`
    too; a skip (a failure under CI=true) saying what is missing when it cannot start here."""
    built = images.read_manifest()
    if built is None:
        unavailable("the node's images are not built: python -m tools.control_plane.nodes.images")
    try:
        return tier.start_real_node(built, registries)
    except build.Unavailable as missing:
        unavailable(str(missing))


@pytest.fixture(scope="session")
def local_stack_objects(tier: Tier, rendered) -> list[dict]:
    """The local stack's Kubernetes objects, in the order `pulumi up` creates them (tools.control_plane.
    stacks), applied to the tier after what the k3d cluster brings: k3s's local-path StorageClass and the
    volume its provisioner would give the stack's claim."""
    objects, _ = stacks.served(tier.api, stacks.in_dependency_order(rendered))
    claims = [obj for obj in objects if obj["kind"] == "PersistentVolumeClaim"]  # the pipeline's, MLflow's
    tier.api.apply_all(kwok.k3s_local_path(claims, tier.node_name, tier.directory / "storage"))
    tier.api.apply_all(objects)
    return objects


@pytest.fixture(scope="session")
def workflow(tier: Tier, local_stack_objects) -> Path:
    """A kubeconfig with a token of the workflow's service account, as its step pods have."""
    names = stacks.local_config()
    return tier.kubeconfig_for(names.namespace, names.pipeline.service_account_name, "workflow")
