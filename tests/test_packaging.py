"""The project as an installable package, and each image's lock: what it holds, what it leaves out,
and that what the image runs imports only what its lock installs."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from packaging.requirements import Requirement
from test_layering import PROJECT_PACKAGES, imports_of, project_modules

from cluster_steps.inference_service import TF_SERVING_VERSION
from infra.images import IMAGE_INPUTS
from pipeline.config import release
from tools import lock
from trainer.serving_contract import EXPORTER_TENSORFLOW

INSTALLED_PACKAGES = {"cluster_steps", "common", "engines", "trainer", "serving", "pipeline", "infra",
                      "stacks"}
TRAINING_STACK = {"tf-keras", "tensorboard", "tensorflow-datasets", "matplotlib"}
DEV_ONLY = {"pytest", "ruff", "hypothesis", "kubernetes-validate"}  # (kserve needs aiohttp, tfds psutil)
# Distributions an image must hold and must leave out, by PEP 503 name ("pulumi*" matches every
# Pulumi SDK).
# The trainer's and the serving image's MLflow client is mlflow-skinny: not MLflow's server, database
# layer and UI (the tracking server's image has them).
MLFLOW_SERVER = {"mlflow", "sqlalchemy", "alembic", "flask", "gunicorn"}
MUST_HOLD = {
    "trainer": {"tensorflow", "tf-keras", "tensorflow-datasets", "numpy", "pyyaml", "mlflow-skinny"},
    "serving": {"tensorflow", "kserve", "kubernetes", "pillow", "numpy", "pyyaml", "mlflow-skinny"},
    "tracking-server": {"mlflow", "psycopg2-binary", "google-cloud-storage"},
}
MUST_LEAVE_OUT = {
    "trainer": {"pulumi*", "kserve", *MLFLOW_SERVER, *DEV_ONLY},
    "serving": {"pulumi*", *TRAINING_STACK, *MLFLOW_SERVER, *DEV_ONLY},
    "tracking-server": {"pulumi*", "tensorflow", "kserve", "tf-keras", "tensorboard", *DEV_ONLY},
}
# The modules each image runs, and so everything they import must be in its lock. serving.loadtest
# is the load generator: it runs from the dev venv against a server (aiohttp, matplotlib).
DEV_TOOLS = {"serving.loadtest"}
IMAGE_PACKAGES = {"trainer": ("trainer",), "serving": ("serving", "engines", "cluster_steps"),
                  "trainer-gpu": ("trainer",), "tracking-server": ()}  # MLflow's own server only
GPU_IMAGE = "trainer-gpu"
ALL_IMAGES = (*lock.IMAGES, *lock.EXTENDED_IMAGES)


def lock_of(image: str) -> dict[str, str]:
    """PEP 503 name -> version."""
    return {lock.normalize(name): version
            for name, version in lock.read_lock(lock.LOCK_DIR / f"{image}.txt").items()}


def dev_lock() -> dict[str, str]:
    return {lock.normalize(name): version for name, version in lock.read_lock(lock.DEV_LOCK).items()}


def matches(name: str, patterns: set[str]) -> bool:
    return any(re.fullmatch(pattern.replace("*", ".*"), name) for pattern in patterns)


def test_pip_install_yields_the_projects_packages_and_nothing_else(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    shutil.copy(REPO_ROOT / "pyproject.toml", source)
    for top in (*PROJECT_PACKAGES, "tests", "tools"):
        if (REPO_ROOT / top).is_dir():
            shutil.copytree(REPO_ROOT / top, source / top,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # No build isolation and no index: setuptools comes from the dev lock, nothing is downloaded.
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    installed = {path.name for path in target.iterdir() if not path.name.endswith(".dist-info")}
    assert installed == INSTALLED_PACKAGES
    expected = {name for name in project_modules(REPO_ROOT) if name.split(".")[0] in INSTALLED_PACKAGES}
    assert set(project_modules(target)) == expected  # subpackages (stacks.kinds) included

    metadata = next(target.glob("dist_ml-*.dist-info")) / "METADATA"
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", metadata.read_text(), re.MULTILINE))
    assert extras == {"train", "train-gpu", "serve", "infra", "tracking-server", "dev"}

    imported = subprocess.run(
        [sys.executable, "-c", "import common.cli, common.ports, trainer.serving_contract as c; "
                               "print(c.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).is_relative_to(target)


def test_the_dev_extra_expands_the_projects_own_extras() -> None:
    pins = lock.project_requirements(("dev",))
    names = {lock.normalize(Requirement(pin).name) for pin in pins}
    assert {"pyyaml", "tensorflow", "tf-keras", "kserve", "pulumi", "pytest", "hypothesis"} <= names
    assert "dist-ml" not in names
    with pytest.raises(lock.LockError, match="no extra 'gpu'"):
        lock.project_requirements(("gpu",))


@pytest.mark.parametrize("extras, lock_path", [
    (("dev",), lock.DEV_LOCK),
    *((extras, lock.LOCK_DIR / f"{image}.txt") for image, extras in lock.IMAGES.items()),
    *((extras, lock.LOCK_DIR / f"{image}.txt") for image, (_, extras) in lock.EXTENDED_IMAGES.items()),
], ids=["dev", *lock.IMAGES, *lock.EXTENDED_IMAGES])
def test_every_direct_pin_is_in_its_lock_at_its_version(extras: tuple[str, ...], lock_path: Path) -> None:
    """A pin changed in pyproject.toml without `make lock` fails here."""
    locked = {lock.normalize(name): version for name, version in lock.read_lock(lock_path).items()}
    stale = []
    for pin in lock.project_requirements(extras):
        requirement = Requirement(pin)
        if not requirement.specifier.contains(locked.get(lock.normalize(requirement.name), "0")):
            stale.append(f"{pin} (locked: {locked.get(lock.normalize(requirement.name))})")
    assert not stale, f"{lock_path.name} does not satisfy {stale}: run make lock"


@pytest.mark.parametrize("image", lock.IMAGES)
def test_each_image_lock_is_inside_the_dev_lock(image: str) -> None:
    assert lock.outside(lock_of(image), dev_lock()) == []


@pytest.mark.parametrize("image", lock.IMAGES)
def test_each_image_lock_holds_what_it_needs_and_leaves_out_what_it_must(image: str) -> None:
    pins = lock_of(image)
    assert MUST_HOLD[image] <= set(pins)
    assert sorted(name for name in pins if matches(name, MUST_LEAVE_OUT[image])) == []


@pytest.mark.parametrize("image", lock.IMAGES)
def test_each_image_lock_is_closed_under_dependencies(image: str) -> None:
    """What `pip check` runs in the image's build (after `pip install --no-deps`), here from the
    metadata of the dev venv, which holds the same versions."""
    pins = lock_of(image)
    unsatisfied = []
    for name, version in pins.items():
        distribution = importlib.metadata.distribution(name)
        assert distribution.version == version, f"the venv does not match the lock ({name}): run make"
        for text in distribution.requires or ():
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            found = pins.get(lock.normalize(requirement.name))
            if found is None or not requirement.specifier.contains(found, prereleases=True):
                unsatisfied.append(f"{name} requires {requirement} (lock: {found})")
    assert not unsatisfied


def cuda_extra() -> dict[str, Requirement]:
    """What TensorFlow's `and-cuda` extra adds, by PEP 503 name, from the dev venv's TensorFlow (the
    locked version)."""
    requirements = [Requirement(text) for text in importlib.metadata.requires("tensorflow") or ()]
    return {lock.normalize(r.name): r for r in requirements
            if r.marker is not None and r.marker.evaluate({"extra": "and-cuda"})
            and not r.marker.evaluate({"extra": ""})}


def test_the_gpu_lock_is_the_trainers_plus_tensorflows_cuda_wheels_and_nothing_else():
    """Every distribution the GPU and CPU trainer images share has the same version (what the tests ran),
    and the GPU image adds only what tensorflow[and-cuda] names, at versions it accepts. Offline and
    without the CUDA wheels' gigabytes; their own dependencies: the slow resolver run below."""
    base, _ = lock.EXTENDED_IMAGES[GPU_IMAGE]
    gpu, trainer, cuda = lock_of(GPU_IMAGE), lock_of(base), cuda_extra()
    assert lock.outside(trainer, gpu) == []
    added = {name: version for name, version in gpu.items() if name not in trainer}
    assert set(added) == set(cuda) and "nvidia-cudnn-cu12" in added
    assert [name for name, version in added.items() if not cuda[name].specifier.contains(version)] == []


@pytest.mark.slow  # asks the package registry (index pages and wheel metadata only)
def test_the_gpu_lock_is_closed_under_dependencies_by_pips_resolver(tmp_path):
    """pip resolves the GPU lock (with dependencies, for this Linux and Python 3.11, as the image's
    python:3.11-slim) to exactly itself, so the image's `pip install --no-deps` then `pip check` pass.
    fast-deps reads each wheel's metadata by HTTP range requests where the index serves no PEP 658
    metadata file, instead of downloading the CUDA wheels' gigabytes (docs/results/gpu.md)."""
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--use-feature=fast-deps", "--report", str(report), "-r", str(lock.LOCK_DIR / f"{GPU_IMAGE}.txt")],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = {lock.normalize(item["metadata"]["name"]): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    assert resolved == lock_of(GPU_IMAGE)


def modules_under(*prefixes: str) -> list[str]:
    """The project modules named by `prefixes` or inside them."""
    return [name for name in project_modules(REPO_ROOT)
            if any(name == prefix or name.startswith(f"{prefix}.") for prefix in prefixes)]


def reached_from(starts: list[str], modules: dict[str, Path] | None = None) -> set[str]:
    """The modules `starts` and every project module (or one of `modules`) they import (anywhere in
    them), transitively."""
    modules = project_modules(REPO_ROOT) if modules is None else modules
    pending = list(starts)
    reached: set[str] = set()
    while pending:
        name = pending.pop()
        if name in reached or name not in modules:
            continue
        reached.add(name)
        for found in imports_of(modules[name], name, REPO_ROOT):
            parts = found.target.split(".")
            pending.extend(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return reached


def modules_run_by(image: str) -> set[str]:
    """The image's modules and every project module they import (anywhere in them), transitively."""
    starts = [name for name in project_modules(REPO_ROOT)
              if name.split(".")[0] in IMAGE_PACKAGES[image] and name not in DEV_TOOLS]
    return reached_from(starts)


def third_party_imports(modules: set[str]) -> dict[str, str]:
    """Top-level name of each import outside the project and the standard library -> an importer."""
    paths = project_modules(REPO_ROOT)
    found_in: dict[str, str] = {}
    for name in sorted(modules):
        for found in imports_of(paths[name], name, REPO_ROOT):
            top = found.target.split(".")[0]
            if top and top not in PROJECT_PACKAGES and top not in sys.stdlib_module_names:
                found_in.setdefault(top, f"{found.path}:{found.line}")
    return found_in


@pytest.mark.parametrize("image", ALL_IMAGES)
def test_every_import_of_an_image_resolves_to_a_distribution_in_its_lock(image: str) -> None:
    modules = modules_run_by(image)
    copied = {top for top in IMAGE_INPUTS[image] if (REPO_ROOT / top).is_dir()}
    assert {name.split(".")[0] for name in modules} <= copied, "a module the image runs is not copied in"

    pins, providers = lock_of(image), importlib.metadata.packages_distributions()
    missing = {
        top: where for top, where in third_party_imports(modules).items()
        if not any(lock.normalize(dist) in pins for dist in providers.get(top, ()))
    }
    assert not missing, f"imported but not in requirements/{image}.txt: {missing}"


def test_the_check_sees_an_import_outside_the_lock() -> None:
    """serving.loadtest, left out of the serving image, plots with matplotlib."""
    providers = importlib.metadata.packages_distributions()
    imported = third_party_imports({"serving.loadtest"})
    pins = lock_of("serving")
    outside = {top for top in imported if not any(lock.normalize(d) in pins for d in providers.get(top, ()))}
    assert "matplotlib" in outside


def dockerfile_copies(image: str) -> tuple[str, set[str]]:
    """The lock a Dockerfile installs and the directories it copies, from its COPY lines."""
    sources = [line.split()[1:-1] for line in (REPO_ROOT / image / "Dockerfile").read_text().splitlines()
               if line.startswith("COPY ")]
    flat = [source.rstrip("/") for group in sources for source in group if not source.startswith("--")]
    locks = [source for source in flat if source.startswith("requirements")]
    assert len(locks) == 1, f"{image}/Dockerfile copies {locks}"
    return locks[0], set(flat) - set(locks)


@pytest.mark.parametrize("image", IMAGE_INPUTS)
def test_image_inputs_are_what_each_dockerfile_copies(image: str) -> None:
    """The content tag digests IMAGE_INPUTS, so a file the build uses and the tag misses would let a
    changed image keep its tag."""
    lock_file, directories = dockerfile_copies(image)
    assert lock_file == f"requirements/{image}.txt"
    assert set(IMAGE_INPUTS[image]) == {f"{image}/Dockerfile", lock_file, *directories}


SIMULATED_IMAGE = textwrap.dedent("""
    # Runs in the dev venv as if only the image's lock were installed: the finder of installed
    # modules is replaced by one that finds nothing of a distribution outside the lock, so an import
    # fails as it would there and importlib.util.find_spec returns None (TensorFlow probes for
    # tf_keras that way).
    import importlib.machinery, importlib.metadata, re, sys
    allowed = {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower()
               for line in open(sys.argv[1]) if "==" in line and not line.startswith("#")}
    providers = importlib.metadata.packages_distributions()
    refused = set()

    class OnlyTheLock(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            dists = providers.get(name.split(".")[0])
            if dists and not any(re.sub(r"[-_.]+", "-", d).lower() in allowed for d in dists):
                refused.add(name.split(".")[0])
                return None
            return super().find_spec(name, path, target)

    sys.meta_path[:] = [OnlyTheLock if finder is importlib.machinery.PathFinder else finder
                        for finder in sys.meta_path]
    exec(sys.argv[2])
""")


def run_as_image(image: str, code: str, cwd: Path, env: dict[str, str] | None = None,
                 ) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SIMULATED_IMAGE, str(lock.LOCK_DIR / f"{image}.txt"), code],
        capture_output=True, text=True, cwd=cwd, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
    )


def test_the_simulated_image_refuses_what_its_lock_leaves_out(tmp_path: Path) -> None:
    result = run_as_image("serving", "import tf_keras", tmp_path)
    assert result.returncode != 0 and "No module named 'tf_keras'" in result.stderr
    assert run_as_image("serving", "import kserve", tmp_path).returncode == 0


@pytest.mark.slow  # imports TensorFlow and tf-keras in a subprocess
def test_the_trainer_images_modules_import_with_its_lock_alone(tmp_path: Path) -> None:
    modules = sorted(name for name in modules_run_by("trainer") if name.startswith("trainer."))
    result = run_as_image("trainer", f"import {', '.join(modules)}", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


def dockerfile_env(image: str) -> dict[str, str]:
    """The variables a Dockerfile's ENV lines set (continuation lines joined)."""
    text = (REPO_ROOT / image / "Dockerfile").read_text().replace("\\\n", " ")
    return dict(item.split("=", 1) for line in text.splitlines() if line.startswith("ENV ")
                for item in shlex.split(line)[1:])


@pytest.mark.slow  # imports TensorFlow and tf-keras in a subprocess
def test_the_gpu_images_trainer_without_gpu_libraries_stops_in_one_line_naming_them(tmp_path):
    """The GPU image's modules import with its lock alone, and on a node whose GPU TensorFlow cannot
    reach (here: none, no CUDA wheels, no driver) the trainer refuses at once, naming what is missing
    and the library path the image sets."""
    modules = sorted(name for name in modules_run_by(GPU_IMAGE) if name.startswith("trainer."))
    argv = ["--model", "cnn", "--data-dir", "data", "--checkpoint-dir", "c", "--export-dir", "e",
            "--gpus", "2"]
    env = dockerfile_env(GPU_IMAGE)
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"  # where GKE mounts the driver's libraries
    result = run_as_image(GPU_IMAGE, f"import {', '.join(modules)}\nfrom trainer import train\n"
                                     f"train.run({argv!r})", tmp_path,
                          env={"LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"]})
    assert result.returncode == 1, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("train: error: given 2 GPUs (--gpus 2), TensorFlow sees none: the CUDA libraries "
                           "of tensorflow[and-cuda] are not installed (no nvidia-"), line
    assert "does not load with LD_LIBRARY_PATH='/usr/local/nvidia/lib64'" in line
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.slow  # exports a model, then loads it in a subprocess
def test_the_server_loads_and_runs_an_export_without_the_training_stack(tmp_path: Path) -> None:
    """The SavedModel holds a tf-keras model, but loading it needs TensorFlow alone."""
    base = tmp_path / "fmnist"
    export = subprocess.run(
        [sys.executable, "-c", "import sys; from trainer import export, models; "
                               "export.save_for_serving(models.build_model('cnn'), sys.argv[1])",
         str(base / "1")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert export.returncode == 0, export.stderr[-2000:]
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import tensorflow as tf
        import serving.logger, cluster_steps.release, serving.server
        from serving.model import load_version
        version = load_version(Path({str(base)!r}), 1)
        outputs = version.serve_pixels(pixels=tf.zeros([2, 28, 28, 1]))
        assert outputs["probabilities"].shape == (2, 10), outputs
        loaded = {{name.split(".")[0] for name in sys.modules}}
        print(sorted(loaded & {{"tf_keras", "tensorboard", "tensorflow_datasets", "matplotlib"}}))
    """)
    result = run_as_image("serving", code, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_tf_serving_is_no_older_than_the_tensorflow_that_writes_the_exports() -> None:
    (tensorflow,) = [Requirement(pin) for pin in lock.project_requirements(("train",))
                     if Requirement(pin).name == "tensorflow"]
    pinned = tuple(int(part) for part in str(tensorflow.specifier).lstrip("=").split(".")[:2])
    assert EXPORTER_TENSORFLOW == pinned, "trainer.serving_contract.EXPORTER_TENSORFLOW follows the pin"
    assert release(TF_SERVING_VERSION) >= EXPORTER_TENSORFLOW


def distribution_closure(requirements: list[str]) -> set[str]:
    """The distributions `requirements` install, by PEP 503 name, from the dev venv's metadata (which
    holds the locked versions of all of them)."""
    pending, found = [Requirement(text) for text in requirements], set()
    while pending:
        requirement = pending.pop()
        name = lock.normalize(requirement.name)
        if name in found:
            continue
        found.add(name)
        for text in importlib.metadata.distribution(name).requires or ():
            needed = Requirement(text)
            if needed.marker is None or needed.marker.evaluate({"extra": ""}):
                pending.append(needed)
    return found


POLICY_PACK_REQUIREMENTS = REPO_ROOT / "policy" / "requirements.txt"


def policy_pack_requirements() -> list[str]:
    """policy/requirements.txt but pulumi-policy, which the dev venv leaves out (it pins protobuf 5)."""
    lines = [line.split("#")[0].strip() for line in POLICY_PACK_REQUIREMENTS.read_text().splitlines()]
    return [line for line in lines if line and lock.normalize(Requirement(line).name) != "pulumi-policy"]


@pytest.mark.parametrize("starts, requirements", [
    (("stacks", "infra"), lambda: lock.project_requirements(("infra",))),  # pip install '.[infra]'
    (("stacks.policy_pack",), policy_pack_requirements),
], ids=["pulumi-program", "policy-pack"])
def test_what_each_program_imports_is_in_the_environment_it_runs_in(starts, requirements) -> None:
    """The fast, static twin of tests/test_environments.py: every third-party import reachable from
    the program (anywhere in its modules) belongs to a distribution its environment installs."""
    installed = distribution_closure(requirements())
    providers = importlib.metadata.packages_distributions()
    missing = {top: where for top, where in third_party_imports(reached_from(modules_under(*starts))).items()
               if not any(lock.normalize(dist) in installed for dist in providers.get(top, ()))}
    assert not missing, f"imported but not installed where it runs: {missing}"


@pytest.mark.parametrize(("tool", "reaches"), [
    ("tools.virtualenvs", {"tools.virtualenvs", "tools.lock", "tools.uv"}),
    ("tools.uv", {"tools.uv"}),
    ("tools.prometheus", {"tools.prometheus"}),
])
def test_the_tools_make_runs_before_the_dev_install_import_the_standard_library_alone(tool, reaches) -> None:
    """`make test` runs these with the system python, beside (or before) the install of .venv."""
    modules = project_modules(REPO_ROOT, (*PROJECT_PACKAGES, "tools"))
    reached = reached_from([tool], modules)
    outside = {found.target: f"{found.path}:{found.line}" for name in reached
               for found in imports_of(modules[name], name, REPO_ROOT)
               if found.target.split(".")[0] not in {"tools", *sys.stdlib_module_names}}
    assert reached == reaches and not outside, (reached, outside)
