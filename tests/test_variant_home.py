"""A variant has one home: a fourth CNN variant added to trainer/variants.py alone reaches the
pipeline's default config, the Argo render (its own train step and TrainJob), both stacks' rendered
WorkflowTemplates and `make demo`, with no other file touched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

from trainer.variants import VARIANTS

FOURTH = "cnn_wide"  # one more variant than the tree defines
# What a newcomer adds: one function, here at the very end of the module.
FOURTH_SOURCE = f'''

@variant
def {FOURTH}(layers):
    return [layers.Conv2D(128, 3, activation="relu"), layers.Flatten()]
'''
STACK_FILES = ("Pulumi.local.yaml", "Pulumi.gke.yaml")
# What the probe reports, run with the fourth variant in place (a fresh interpreter: the config's
# default is read when pipeline.config is first imported).
PROBE = f'''
import json, sys
from pathlib import Path
import yaml
from pipeline import argo
from pipeline.config import load_config
from stacks import render

config = load_config(None)
template = argo.workflow_template(config)
templates = {{t["name"]: t for t in template["spec"]["templates"]}}
train = templates.get("train-cnn-wide", {{}})
trainjob = argo.applied_manifest(train) if train else {{}}
stacks = {{}}
for stack in {STACK_FILES!r}:
    name = stack.split(".")[1]
    values = render.pulumi_values(Path(sys.argv[1]) / stack)
    if name == "gke":  # what `pulumi config set` gives a GKE stack
        values.update({{"gcp:project": "dist-ml-test-4821", "gcp:region": "us-central1"}})
    (rendered,) = [o for o in render.render(name, values).objects if o["kind"] == "WorkflowTemplate"]
    stacks[stack] = [t["name"] for t in rendered["spec"]["templates"]]
print(json.dumps({{
    "default": list(config.variants),
    "tasks": {{t["name"]: t.get("depends") for t in templates["pipeline"]["dag"]["tasks"]}},
    "job_kind": trainjob.get("kind"),
    "command": trainjob["spec"]["trainer"]["command"] if trainjob else [],
    "stacks": stacks,
    "tensorflow_imported": "tensorflow" in sys.modules,
}}))
'''


@pytest.fixture(scope="module")
def fourth_variant_tree(tmp_path_factory) -> Path:
    """A `trainer` package whose variants.py is the repository's plus one function, every other
    trainer module the repository's own (the package's path continues into the real one)."""
    root = tmp_path_factory.mktemp("fourth-variant")
    trainer = root / "trainer"
    trainer.mkdir()
    init = (REPO_ROOT / "trainer" / "__init__.py").read_text()
    (trainer / "__init__.py").write_text(f"{init}\n__path__.append({str(REPO_ROOT / 'trainer')!r})\n")
    variants = (REPO_ROOT / "trainer" / "variants.py").read_text()
    (trainer / "variants.py").write_text(variants + FOURTH_SOURCE)
    for stack in STACK_FILES:
        shutil.copy(REPO_ROOT / stack, root / stack)
    return root


def environment(root: Path) -> dict[str, str]:
    """This environment without what would steer make or Python elsewhere: the fourth variant's
    package first, then the repository."""
    steering = {"VARIANTS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHONPATH"}
    env = {key: value for key, value in os.environ.items() if key not in steering}
    return {**env, "PYTHONPATH": os.pathsep.join([str(root), str(REPO_ROOT)])}


@pytest.mark.slow  # a fresh interpreter runs both stacks' programs, which made it the fast lane's costliest
def test_the_config_the_render_and_both_stacks_follow_the_variants_module(fourth_variant_tree):
    result = subprocess.run([sys.executable, "-c", PROBE, str(fourth_variant_tree)],
                            cwd=fourth_variant_tree, env=environment(fourth_variant_tree),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["default"] == [*VARIANTS, FOURTH]
    assert found["tasks"]["train-cnn-wide"] == "ingest"
    assert found["tasks"]["select"] == " && ".join(
        "train-" + name.replace("_", "-") for name in (*VARIANTS, FOURTH))
    assert found["job_kind"] == "TrainJob"
    command = found["command"]
    assert command[:3] == ["python", "-m", "trainer.train"]
    assert command[command.index("--model") + 1] == FOURTH
    for stack in STACK_FILES:
        assert "train-cnn-wide" in found["stacks"][stack], stack
    assert found["tensorflow_imported"] is False  # the names are read without TensorFlow


def test_make_demo_trains_every_variant_of_the_module_by_default(fourth_variant_tree):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    result = subprocess.run(
        ["make", "--no-print-directory", "-f", str(REPO_ROOT / "Makefile"), "-n", "demo",
         "INSTALLED=", f"PYTHON={sys.executable}", "DEMO_SKIP="],
        cwd=fourth_variant_tree, env=environment(fourth_variant_tree),
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"--variants {' '.join(VARIANTS)} {FOURTH} --batch-size-per-replica" in result.stdout


@pytest.mark.parametrize("stack", STACK_FILES)
def test_the_stack_files_name_no_variants_so_the_module_decides(stack):
    pipeline = yaml.safe_load((REPO_ROOT / stack).read_text())["config"]["dist-ml:pipeline"]
    assert "variants" not in pipeline


@pytest.mark.parametrize(("module", "path"), [("pipeline.config", "pipeline/config.schema.json"),
                                              ("stacks.config", "stacks/stack.schema.json")])
def test_the_committed_schemas_do_not_change_with_a_new_variant(fourth_variant_tree, module, path):
    result = subprocess.run([sys.executable, "-m", module, "--schema"], cwd=fourth_variant_tree,
                            env=environment(fourth_variant_tree), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == json.loads((REPO_ROOT / path).read_text())
