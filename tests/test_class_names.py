"""Names say what things are: no two classes of the product share a name, so `RolloutError` or
`Cluster` in a traceback, an import or a doc means one thing. The benchmarks and tools are programs
of their own and may reuse a name for their own things."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from conftest import REPO_ROOT

PRODUCT = ("common", "trainer", "serving", "engines", "cluster_steps", "pipeline", "infra", "stacks",
           "policy")


def classes_by_name(root: Path, packages: tuple[str, ...]) -> dict[str, list[str]]:
    defined = defaultdict(list)
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    defined[node.name].append(str(path.relative_to(root)))
    return defined


def shared_names(root: Path, packages: tuple[str, ...]) -> dict[str, list[str]]:
    return {name: modules for name, modules in classes_by_name(root, packages).items() if len(modules) > 1}


def test_no_two_classes_of_the_product_share_a_name():
    assert shared_names(REPO_ROOT, PRODUCT) == {}


def test_a_shared_name_is_found(tmp_path):
    for package in ("one", "two"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "errors.py").write_text("class RolloutError(Exception):\n    pass\n")
    assert shared_names(tmp_path, ("one", "two")) == {"RolloutError": ["one/errors.py", "two/errors.py"]}
