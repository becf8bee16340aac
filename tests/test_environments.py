"""The paths users run, each in the environment it runs in, not in the dev virtualenv:

- the policy pack, in the virtualenv Pulumi builds for it from policy/requirements.txt alone, run over
  a rendered stack as the policy engine calls it (and shown to reject a public bucket);
- the Pulumi program after `pip install '.[infra]'` into a clean virtualenv: both stacks render;
- each image's lock installed as its Dockerfile installs it (`pip install --no-deps -r`, `pip check`),
  with only the directories the image copies: the trainer's trains a step, the server's answers a
  request for that export.

Each environment is a real virtualenv installed from the package registry, kept under .cache/envs/
by the digest of what it installs from, so a run after the first reuses it. Building one needs the
registry: where it cannot be built, the test fails (these are the paths users take).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from conftest import REPO_ROOT, train_args
from PIL import Image
from test_cluster_contracts import PROJECT, REGION, stack_values
from test_policy_pack import as_policy_resources

from common.ports import free_ports
from infra.images import IMAGE_INPUTS
from serving import client
from serving.process import stop, wait_until_ready
from stacks import policies, render
from tools import lock

pytestmark = pytest.mark.slow  # builds virtualenvs from the package registry, trains and serves

ENVS_DIR = REPO_ROOT / ".cache" / "envs"
POLICY_DIR = REPO_ROOT / "policy"
INSTALL_TIMEOUT_SECONDS = 1200
READY_MARKER = ".installed"


def digest(*paths: Path) -> str:
    hashed = hashlib.sha256()
    for path in paths:
        hashed.update(path.read_bytes())
    return hashed.hexdigest()[:16]


def virtualenv(name: str, key: str, *install_args: str, cwd: Path = REPO_ROOT) -> Path:
    """A virtualenv with `pip install install_args`, built once per key; returns its python."""
    home = ENVS_DIR / f"{name}-{key}"
    python = home / "bin" / "python"
    if (home / READY_MARKER).is_file():
        return python
    shutil.rmtree(home, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=120)
    result = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *install_args],
                            cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS)
    assert result.returncode == 0, f"pip install {' '.join(install_args)}:\n{result.stderr[-3000:]}"
    (home / READY_MARKER).touch()
    return python


def checkout_copy(destination: Path) -> Path:
    """A user's checkout: the files git tracks, as the working tree has them."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True,
                             timeout=60).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (REPO_ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, destination / name)
    return destination


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
    requirements = POLICY_DIR / "requirements.txt"
    return virtualenv("policy", digest(requirements), "-r", str(requirements))


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
    checkout = checkout_copy(tmp_path_factory.mktemp("checkout"))
    python = virtualenv("infra", digest(REPO_ROOT / "pyproject.toml"), ".[infra]", cwd=checkout)
    return checkout, python


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


# --- Each image's lock, with what its Dockerfile copies --------------------------------------------------

def image_python(image: str) -> Path:
    """The image's Python: its lock installed as the Dockerfile does, then `pip check`."""
    requirements = lock.LOCK_DIR / f"{image}.txt"
    python = virtualenv(image, digest(requirements), "--no-deps", "-r", str(requirements))
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    return python


def image_root(image: str, destination: Path) -> Path:
    """The image's /app: the project's directories its Dockerfile copies, nothing else."""
    for top in IMAGE_INPUTS[image]:
        if (REPO_ROOT / top).is_dir():
            shutil.copytree(REPO_ROOT / top, destination / top, ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def image_env(image: str) -> dict[str, str]:
    """The Dockerfile's ENV, and no PYTHONPATH leaking the checkout in."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    if image == "trainer":
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


@pytest.fixture(scope="module")
def trainer_image_export(data_dir, tmp_path_factory) -> Path:
    """One training step of `cnn` by the trainer image's lock; its export."""
    python, work = image_python("trainer"), tmp_path_factory.mktemp("trainer-image")
    root = image_root("trainer", work / "app")
    result = subprocess.run(
        [str(python), "-m", "trainer.train", *train_args("cnn", data_dir, work, "--epochs", "1",
                                                         "--steps-per-epoch", "1")],
        cwd=root, env=image_env("trainer"), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return work / "export"


def test_the_trainer_image_lock_trains_a_step(trainer_image_export):
    assert (trainer_image_export / "saved_model.pb").is_file()


def png(pixels: bytes) -> bytes:
    out = io.BytesIO()
    Image.frombytes("L", (28, 28), pixels).save(out, format="PNG")
    return out.getvalue()


def test_the_serving_image_lock_answers_a_request_for_the_trainers_export(trainer_image_export, tmp_path):
    python, repo = image_python("serving"), tmp_path / "models"
    shutil.copytree(trainer_image_export, repo / "fmnist" / "1")
    root, log, port = image_root("serving", tmp_path / "app"), tmp_path / "server.log", free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        server = subprocess.Popen([str(python), "-m", "serving.server", "--model-repo", str(repo),
                                   "--model-name", "fmnist", "--http-port", str(port), "--grpc-port", "0"],
                                  cwd=root, env=image_env("serving"), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(url, "fmnist", server, log)
        ((label, probability),) = client.predict([png(bytes(range(28)) * 28)], url=url, model_name="fmnist")
        assert isinstance(label, str) and 0.0 <= probability <= 1.0
    finally:
        stop(server)
