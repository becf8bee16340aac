"""serving/kserve_overrides.py holds every replacement, restatement and reach into KServe's internals,
beside the KServe release it was read at: this test fails, naming what to re-read, when the installed
KServe is another release or when one of the upstream functions changed."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import inspect

import pytest
from conftest import REPO_ROOT

from serving import kserve_overrides
from serving.kserve_overrides import KSERVE_VERSION, UPSTREAM_SOURCES

SERVING = REPO_ROOT / "serving"


def source_hash(qualified: str) -> str:
    module_name, _, path = qualified.partition(":")
    found = importlib.import_module(module_name)
    for name in path.split("."):
        found = getattr(found, name)
    return hashlib.sha256(inspect.getsource(found).encode()).hexdigest()[:16]


def test_the_installed_kserve_and_every_pin_are_the_release_the_overrides_were_read_at():
    assert importlib.metadata.version("kserve") == KSERVE_VERSION
    for pins in ("requirements.txt", "requirements/serving.txt"):
        assert f"kserve=={KSERVE_VERSION}" in (REPO_ROOT / pins).read_text().splitlines(), pins
    assert f'"kserve=={KSERVE_VERSION}"' in (REPO_ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize("upstream", UPSTREAM_SOURCES)
def test_each_upstream_function_we_replace_is_as_at_the_pinned_release(upstream):
    expected, depending = UPSTREAM_SOURCES[upstream]
    assert source_hash(upstream) == expected, (
        f"{upstream} is not as in kserve {KSERVE_VERSION}: re-read {', '.join(depending)} "
        "(serving/kserve_overrides.py) against it, then record its new hash")


def test_every_name_the_table_points_at_is_there():
    for upstream, (_, depending) in UPSTREAM_SOURCES.items():
        for name in depending:
            module, owner = ((importlib.import_module(name.rpartition(".")[0]), name.rpartition(".")[2])
                             if name.startswith("serving.") else (kserve_overrides, name))
            found = module
            for attribute in owner.split("."):
                assert hasattr(found, attribute), (upstream, name)
                found = getattr(found, attribute)


def kserve_subclasses_and_patches(path) -> list[str]:
    """Classes deriving from a KServe class, and assignments into a KServe module, in one file."""
    tree = ast.parse(path.read_text())
    kserve_names = {alias.asname or alias.name for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kserve")
                    for alias in node.names}
    found = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
             and any(isinstance(base, ast.Name) and base.id in kserve_names for base in node.bases)]
    found += [ast.unparse(target) for node in ast.walk(tree) if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Attribute)
              and isinstance(target.value, ast.Name) and target.value.id in kserve_names]
    return found


def test_no_other_serving_module_subclasses_or_patches_kserve():
    """The one module to re-read on an upgrade is the only one that subclasses or patches KServe:
    the rest of serving/ uses its public API (Model, ModelServer, its errors and types)."""
    elsewhere = {path.name: kserve_subclasses_and_patches(path) for path in sorted(SERVING.glob("*.py"))
                 if path.name != "kserve_overrides.py"}
    assert {name: found for name, found in elsewhere.items() if found} == {}
    assert kserve_subclasses_and_patches(SERVING / "kserve_overrides.py")  # the check sees them there
