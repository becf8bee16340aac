"""The paths users run, each in the environment it runs in, not in the dev virtualenv:

- the policy pack, in the virtualenv Pulumi builds for it from policy/requirements.txt alone, served
  as Pulumi serves it and asked over gRPC, as the engine asks, to judge a rendered stack (and shown to
  reject a public bucket, an unpinned image, a container without requests, and to leave an image
  unknown during preview to `pulumi up`);
- the Pulumi program after `pip install '.[infra]'` into a clean virtualenv: both stacks render;
- each image's lock: tests/test_image_environments.py (a module of its own, so that pytest-xdist
  builds those virtualenvs beside these).

Each environment is a real virtualenv installed from the package registry (tools/virtualenvs.py),
kept under .cache/envs/ by the digest of what it installs from, so a run after the first reuses it;
`make test` builds them beside the dev install. Building one needs the registry: where it cannot be
built, the test fails (these are the paths users take).
"""

from __future__ import annotations

import copy
import subprocess
import types
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from google.protobuf import struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pulumi.runtime.rpc import UNKNOWN as UNKNOWN_DURING_PREVIEW
from stack_checks import rendered_stack
from test_cluster_contracts import PROJECT, REGION, stack_values
from test_policy_pack import as_policy_resources

from stacks import policies
from tools import virtualenvs

pytestmark = pytest.mark.slow  # builds virtualenvs from the package registry, trains and serves

POLICY_DIR = virtualenvs.POLICY_DIR


# --- The policy pack ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def policy_python() -> Path:
    return virtualenvs.policy_python()


@pytest.fixture(scope="module")
def policy_pack(policy_python) -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """policy/__main__.py in the pack's virtualenv, run as Pulumi runs it: it serves the analyzer on a
    port of its own choosing and prints it; the engine then calls AnalyzeStack over gRPC."""
    pack = subprocess.Popen([str(policy_python), "-u", "__main__.py"], cwd=POLICY_DIR,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = pack.stdout.readline().strip()
        assert port.isdigit(), pack.stderr.read() if pack.poll() is not None else port
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        pack.kill()
        pack.wait()


def analyze_stack(pack: analyzer_pb2_grpc.AnalyzerStub, resources: list[types.SimpleNamespace]
                  ) -> dict[str, list[str]]:
    """The pack's violations over `resources`, by policy, as the engine asks for them on a preview:
    each resource's properties a protobuf Struct (every number a float, unknown values as the engine's
    sentinel)."""
    request = analyzer_pb2.AnalyzeStackRequest()
    for resource in resources:
        properties = struct_pb2.Struct()
        properties.update(resource.props)
        request.resources.add(type=resource.resource_type, name=resource.name, properties=properties,
                              urn=f"urn:pulumi:test::dist-ml::{resource.resource_type}::{resource.name}")
    response = pack.AnalyzeStack(request, timeout=120)
    found: dict[str, list[str]] = {}
    for diagnostic in response.diagnostics:
        # The engine's message: the policy's description, then the violation.
        found.setdefault(diagnostic.policyName, []).append(
            diagnostic.message.removeprefix(f"{diagnostic.description}\n"))
    return found


@pytest.mark.parametrize("stack", ["local", "gke"])
def test_the_policy_pack_passes_each_stack_in_its_own_virtualenv(policy_pack, stack):
    assert analyze_stack(policy_pack, as_policy_resources(rendered_stack(stack, stack_values(stack)))) == {}


def test_the_policy_pack_rejects_a_public_bucket_in_its_own_virtualenv(policy_pack):
    resources = as_policy_resources(rendered_stack("gke", stack_values("gke")))
    (bucket,) = [resource for resource in resources if resource.resource_type == policies.BUCKET]
    bucket.props = {**bucket.props, "publicAccessPrevention": "inherited"}
    found = analyze_stack(policy_pack, resources)
    assert list(found) == ["private-buckets"] and "public" in found["private-buckets"][0], found


LOOSE_DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "loose"},
                    "spec": {"replicas": 1, "template": {"spec": {"containers": [
                        {"name": "web", "image": "nginx:latest"}]}}}}


def test_the_policy_pack_judges_containers_nested_in_the_engines_proxies(policy_pack):
    """The engine hands the pack read-only proxies, not dicts: the policies still reach a Deployment's
    containers (they did not, before stacks/declared.py read the proxies into plain data)."""
    resources = [types.SimpleNamespace(resource_type="kubernetes:apps/v1:Deployment", name="loose",
                                       props=LOOSE_DEPLOYMENT)]
    found = analyze_stack(policy_pack, resources)
    pod = "Deployment/loose.spec.template.spec"
    where = f"{pod}.containers[0]"
    assert found == {"requests-and-limits": [f"{where}: no requests for cpu, memory",
                                             f"{where}: no limits for cpu, memory"],
                     "pinned-images": [f"{where}: image nginx:latest is not pinned (no tag, or latest)"],
                     "restricted-pods": [f"{pod}: {why}" for why in (
                         "runAsNonRoot is not true (on the pod, or on every container)",
                         "no seccompProfile RuntimeDefault (on the pod, or on every container)",
                         f"{where}: allowPrivilegeEscalation is not false",
                         f"{where}: capabilities do not drop ALL")]}


def test_an_image_unknown_during_preview_is_left_to_pulumi_up(policy_pack):
    """An image built by the stack has no digest until `pulumi up`: the preview passes over it, and
    still judges everything else (the policy stays mandatory, not 'can't run during preview')."""
    deployment = copy.deepcopy(LOOSE_DEPLOYMENT)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container["image"] = UNKNOWN_DURING_PREVIEW
    resources = [types.SimpleNamespace(resource_type="kubernetes:apps/v1:Deployment", name="loose",
                                       props=deployment)]
    found = analyze_stack(policy_pack, resources)
    assert "pinned-images" not in found and len(found["requests-and-limits"]) == 2, found


def test_the_policy_pack_imports_only_what_its_requirements_install(policy_python):
    """Nothing of the project's other environments leaks in: the pack's virtualenv has neither
    prometheus_client nor numpy, and the pack's module loads without them."""
    code = ("import importlib.util, sys; sys.path.insert(0, '..'); import stacks.policy_pack; "
            "print([m for m in ('prometheus_client', 'numpy', 'kubernetes', 'pydantic') "
            "if importlib.util.find_spec(m)])")
    result = subprocess.run([str(policy_python), "-c", code], cwd=POLICY_DIR, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


# --- The Pulumi program after `pip install '.[infra]'` --------------------------------------------------

@pytest.fixture(scope="module")
def infra_checkout(tmp_path_factory) -> tuple[Path, Path]:
    """A copy of the checkout and the python of a clean virtualenv with `pip install '.[infra]'`
    run in it (the project built from that copy, as a user's checkout)."""
    checkout = virtualenvs.checkout_copy(tmp_path_factory.mktemp("checkout"))
    return checkout, virtualenvs.infra_python(checkout)


@pytest.mark.parametrize("stack, settings", [
    ("local", []),
    ("gke", ["-c", f"gcp:project={PROJECT}", "-c", f"gcp:region={REGION}"]),
])
def test_the_infra_extra_alone_renders_each_stack(infra_checkout, stack, settings, tmp_path):
    checkout, python = infra_checkout
    result = subprocess.run([str(python), "-m", "stacks.render", "--stack", stack, "--out", str(tmp_path),
                             *settings], cwd=checkout, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Kubernetes objects and summary.txt" in result.stdout
    assert len(list(tmp_path.glob("*.yaml"))) >= 15


def test_the_infra_extra_installs_neither_the_trainer_nor_the_server(infra_checkout):
    _, python = infra_checkout
    code = ("import importlib.util; print([m for m in ('tensorflow', 'numpy', 'prometheus_client', 'kserve') "
            "if importlib.util.find_spec(m)])")
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
