"""The paths users run, each in the environment it runs in, not in the dev virtualenv:

- the policy pack, in the virtualenv Pulumi builds for it from policy/requirements.txt alone, run over
  a rendered stack as the policy engine calls it (and shown to reject a public bucket);
- the Pulumi program after `pip install '.[infra]'` into a clean virtualenv: both stacks render;
- each image's lock: tests/test_image_environments.py (a module of its own, so that pytest-xdist
  builds those virtualenvs beside these).

Each environment is a real virtualenv installed from the package registry (tools/virtualenvs.py),
kept under .cache/envs/ by the digest of what it installs from, so a run after the first reuses it;
`make test` builds them beside the dev install. Building one needs the registry: where it cannot be
built, the test fails (these are the paths users take).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import types
from pathlib import Path

import pytest
from test_cluster_contracts import PROJECT, REGION, stack_values
from test_policy_pack import as_policy_resources

from stacks import policies, render
from tools import virtualenvs

pytestmark = pytest.mark.slow  # builds virtualenvs from the package registry, trains and serves

POLICY_DIR = virtualenvs.POLICY_DIR


# --- The policy pack ---------------------------------------------------------------------------------

# Runs policy/__main__.py in the pack's virtualenv. The engine would serve the PolicyPack over gRPC;
# here its constructor records the policies, and each one's validate is called as the engine calls it.
POLICY_DRIVER = textwrap.dedent("""
    import json, runpy, sys, types
    import pulumi_policy

    packs = []

    def record(name, policies, enforcement_level=None, initial_config=None):
        packs.append((name, policies))

    pulumi_policy.PolicyPack = record
    runpy.run_path(sys.argv[1], run_name="__main__")
    (name, policies), = packs
    resources = [types.SimpleNamespace(**r) for r in json.load(open(sys.argv[2]))]
    found = {}
    for policy in policies:
        violations = []
        policy.validate(types.SimpleNamespace(resources=resources),
                        lambda message, urn=None: violations.append(message))
        found[policy.name] = violations
    print(json.dumps({"pack": name, "violations": found}))
""")


@pytest.fixture(scope="module")
def policy_python() -> Path:
    return virtualenvs.policy_python()


def run_policy_pack(python: Path, resources: list[types.SimpleNamespace], tmp_path: Path) -> dict:
    """The pack's verdict over `resources`, run from the repository root as Pulumi runs it."""
    declared = tmp_path / "resources.json"
    declared.write_text(json.dumps([vars(resource) for resource in resources]))
    pack = POLICY_DIR / "__main__.py"
    result = subprocess.run([str(python), "-c", POLICY_DRIVER, str(pack), str(declared)], cwd=POLICY_DIR,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stack", ["local", "gke"])
def test_the_policy_pack_passes_each_stack_in_its_own_virtualenv(policy_python, stack, tmp_path):
    verdict = run_policy_pack(policy_python, as_policy_resources(render.render(stack, stack_values(stack))),
                              tmp_path)
    assert verdict["pack"] == "dist-ml"
    assert verdict["violations"] and all(found == [] for found in verdict["violations"].values()), verdict


def test_the_policy_pack_rejects_a_public_bucket_in_its_own_virtualenv(policy_python, tmp_path):
    resources = as_policy_resources(render.render("gke", stack_values("gke")))
    (bucket,) = [resource for resource in resources if resource.resource_type == policies.BUCKET]
    bucket.props = {**bucket.props, "publicAccessPrevention": "inherited"}
    verdict = run_policy_pack(policy_python, resources, tmp_path)
    assert any("public" in violation for violation in verdict["violations"]["private-buckets"]), verdict


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
