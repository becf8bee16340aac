"""The import rules between the project's packages, checked on every module's source with `ast`.

Floors, lowest first: `common` (neutral helpers and the cluster path's shared names and target
types, imports no project package); `trainer` and `serving` (the two images: neither the pipeline
nor Pulumi); `engines` (the training engines, as data and functions over dicts: no TensorFlow, no
Pulumi, and none of the floors above, since the train step, in the serving image, asks them too);
`cluster_steps` (the workflow's steps against the Kubernetes API, in the serving image: no
TensorFlow, and `serving` does not import them); `pipeline` (the step graph and how it runs: no
TensorFlow, no Pulumi, no infrastructure); `infra` (Pulumi components: no TensorFlow, never
`stacks`); `stacks` (composes infra, may import anything below). Every import statement counts,
including those inside functions, `try` blocks and `if TYPE_CHECKING:`, and so do
`importlib.import_module("...")` calls with a literal name.

A CLI module is a package's `__main__` or a module named `cli`: the shared CLI plumbing lives in
`common.cli`, so any other one belongs to one program and no module imports it. (Modules such as
`trainer.ingest` or `serving.client` are libraries that also run as programs; importing their
functions is fine.)

Besides the direct rule, what a module loads when it is imported (module-level imports, followed
through the project's own modules) must not bring in a forbidden third-party package either: the
pipeline must not load TensorFlow by way of a trainer module that does.

Within `stacks` (ACYCLIC), the modules' import-time imports of one another form no circle, and no
module imports another of the package inside a function: that is how a circle is hidden rather than
broken (a lower module asking a higher one for something when called).
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import fnmatch
import graphlib
from collections.abc import Sequence
from pathlib import Path

from conftest import REPO_ROOT

PROJECT_PACKAGES = ("common", "trainer", "serving", "engines", "cluster_steps", "pipeline", "infra", "stacks",
                    "testdata",
                    "benchmarks")
TENSORFLOW = ("tensorflow", "tf_keras")
PULUMI = "pulumi*"  # pulumi, pulumi_kubernetes, pulumi_gcp, pulumi_command, pulumi_policy, ...
# Package -> the top-level names (fnmatch patterns) it must not import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "common": tuple(package for package in PROJECT_PACKAGES if package != "common"),
    "trainer": ("pipeline", "infra", "stacks", "benchmarks", PULUMI),
    "serving": ("pipeline", "infra", "stacks", "benchmarks", "engines", "cluster_steps", PULUMI),
    "engines": ("pipeline", "infra", "stacks", "benchmarks", "cluster_steps", *TENSORFLOW, PULUMI),
    "cluster_steps": ("pipeline", "infra", "stacks", "benchmarks", *TENSORFLOW, PULUMI),
    "pipeline": ("infra", "stacks", "benchmarks", *TENSORFLOW, PULUMI),
    "infra": ("stacks", "benchmarks", *TENSORFLOW),
}
CLI_PLUMBING = "common.cli"
ENTRY_MODULE = "__main__"
# Crossings still in the tree, each with the reason it is tolerated; empty when the rules hold.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}
# Packages whose modules import one another in one direction only, none of them inside a function.
ACYCLIC = ("stacks",)


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str  # dotted module name, e.g. "trainer.train"
    target: str  # dotted name as imported, absolute, e.g. "pipeline.argo" or "pipeline.argo.X"
    path: str  # relative to the root, for the message
    line: int
    at_import_time: bool  # runs when the importer is imported (not inside a function)
    in_function: bool = False  # runs when a function of the importer is called


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path, packages: Sequence[str] = PROJECT_PACKAGES) -> dict[str, Path]:
    """Every module of the project's packages (or of `packages`) under `root`, by dotted name."""
    return {
        module_name(path, root): path
        for package in packages if (root / package).is_dir()
        for path in sorted((root / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """`from ..x import y` inside `importer`, as an absolute module name."""
    if level == 0:
        return module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _literal_import_module(node: ast.Call) -> str | None:
    """The name in `importlib.import_module("x")`, `import_module("x")` or `__import__("x")`."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in ("import_module", "__import__") and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def imports_of(path: Path, importer: str, root: Path) -> list[Import]:
    """Every import in the module, each marked with whether it runs when the module is imported."""
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, at_import_time: bool, in_function: bool = False) -> None:
        def add(target: str) -> None:
            found.append(Import(importer, target, str(path.relative_to(root)), node.lineno,
                                at_import_time, in_function))

        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, importer, is_package)
            add(base)
            for alias in node.names:  # `from pkg import mod` imports the submodule pkg.mod
                if alias.name != "*":
                    add(f"{base}.{alias.name}")
        elif isinstance(node, ast.Call) and (literal := _literal_import_module(node)):
            add(literal)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            at_import_time, in_function = False, True
        children_time = at_import_time and not (isinstance(node, ast.If) and _is_type_checking(node))
        for child in ast.iter_child_nodes(node):
            visit(child, children_time, in_function)

    visit(ast.parse(path.read_text(), filename=str(path)), True)
    return found


def _forbidden_by(package: str, target: str) -> str | None:
    top = target.split(".")[0]
    for pattern in FORBIDDEN.get(package, ()):
        if fnmatch.fnmatchcase(top, pattern):
            return pattern
    return None


def _is_cli_module(target: str) -> bool:
    parts = target.split(".")
    if parts[0] not in PROJECT_PACKAGES or target == CLI_PLUMBING:
        return False
    return ENTRY_MODULE in parts[1:] or (parts[-1] == "cli" and len(parts) == 2)


def direct_crossings(imports: list[Import]) -> list[tuple[Import, str]]:
    crossings = []
    for found in imports:
        package = found.importer.split(".")[0]
        if pattern := _forbidden_by(package, found.target):
            crossings.append((found, f"{package} must not import {pattern}"))
        elif _is_cli_module(found.target):
            crossings.append((found, "a CLI module belongs to one program; shared CLI code is in "
                                     f"{CLI_PLUMBING}"))
    return crossings


def _parents(module: str) -> list[str]:
    """Importing a.b.c runs a, a.b and a.b.c."""
    parts = module.split(".")
    return [".".join(parts[: n]) for n in range(1, len(parts) + 1)]


def loaded_at_import(start: str, imports_by_module: dict[str, list[Import]]) -> dict[str, list[str]]:
    """Every module that importing `start` runs, project and third-party, each with the shortest chain
    of modules that leads to it (the first one imported by `start` or its packages, itself last)."""
    chains: dict[str, list[str]] = {}
    queue = collections.deque((module, [module]) for module in _parents(start))
    while queue:
        module, chain = queue.popleft()
        if module in chains:
            continue
        chains[module] = chain
        for found in imports_by_module.get(module, ()):
            if found.at_import_time:
                queue.extend((loaded, [*chain, loaded]) for loaded in _parents(found.target))
    return chains


def transitive_crossings(imports_by_module: dict[str, list[Import]]) -> list[str]:
    """Forbidden third-party packages a module loads by way of other project modules."""
    problems = []
    for module in sorted(imports_by_module):
        package = module.split(".")[0]
        for loaded, chain in loaded_at_import(module, imports_by_module).items():
            if "." in loaded or loaded in PROJECT_PACKAGES:
                continue
            pattern = _forbidden_by(package, loaded)
            if pattern and len(chain) > 2:  # an import of the module's own is a direct crossing
                problems.append(f"{module} loads {loaded} when imported, through "
                                f"{' -> '.join(chain[1:-1])} ({package} must not import {pattern})")
    return problems


def crossings(root: Path) -> list[str]:
    """Every crossing of the import rules under `root`, one line each, known exceptions left out."""
    imports_by_module = {name: imports_of(path, name, root)
                         for name, path in project_modules(root).items()}
    problems = [
        f"{found.path}:{found.line}: {found.importer} imports {found.target}: {why}"
        for found, why in direct_crossings([i for imports in imports_by_module.values() for i in imports])
        if (found.importer, found.target) not in KNOWN_EXCEPTIONS
    ]
    return sorted(set(problems)) + transitive_crossings(imports_by_module)


def test_the_project_keeps_its_import_rules() -> None:
    problems = crossings(REPO_ROOT)
    assert not problems, "import rule crossings:\n" + "\n".join(problems)


def imported_module(target: str, modules: set[str]) -> str | None:
    """The project module an import names: `stacks.kinds.base.Cluster` -> `stacks.kinds.base`."""
    parts = target.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules),
                None)


def circles_and_dodges(root: Path, package: str) -> list[str]:
    """The import circle among `package`'s modules, if any (module-level imports), and each import of
    one of its modules by another inside a function; one line each."""
    modules = {name: path for name, path in project_modules(root).items() if name.split(".")[0] == package}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    problems = []
    for name, path in modules.items():
        for found in imports_of(path, name, root):
            target = imported_module(found.target, set(modules))
            if target is None or target == name:
                continue
            if found.at_import_time:
                graph[name].add(target)
            elif found.in_function:
                problems.append(f"{found.path}:{found.line}: {name} imports {target} inside a function "
                                "(an import circle dodged): import it at module level, and break the circle")
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        problems.append(f"{package} imports in a circle: {' -> '.join(reversed(error.args[1]))}")
    return sorted(set(problems))


def test_stacks_modules_import_one_another_in_one_direction() -> None:
    problems = [problem for package in ACYCLIC for problem in circles_and_dodges(REPO_ROOT, package)]
    assert not problems, "\n".join(problems)


def test_the_walk_sees_every_package_and_module() -> None:
    modules = project_modules(REPO_ROOT)
    assert {name.split(".")[0] for name in modules} >= set(FORBIDDEN)
    assert "common.cli" in modules and "trainer.train" in modules
    assert "trainer.cli" not in modules  # moved to common.cli


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


CLEAN_TREE = {
    "common/__init__.py": "",
    "common/cli.py": "import argparse\n",
    "trainer/__init__.py": "",
    "trainer/train.py": "import tensorflow\nfrom common import cli\n",
    "pipeline/__init__.py": "",
    "pipeline/local.py": "from trainer import cluster\n",
    "trainer/cluster.py": "import json\n\ndef f():\n    import tensorflow\n",
    "infra/__init__.py": "",
    "infra/thing.py": "import pulumi\nfrom pipeline import local\n",
    "stacks/__init__.py": "",
    "stacks/compose.py": "from infra import thing\nfrom pipeline import local\n",
}


def test_a_clean_tree_has_no_crossings(tmp_path: Path) -> None:
    write_tree(tmp_path, CLEAN_TREE)
    assert crossings(tmp_path) == []


def test_each_kind_of_crossing_is_found(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        **CLEAN_TREE,
        # inside a function still counts
        "serving/__init__.py": "",
        "serving/server.py": "def main():\n    from pipeline.argo import x\n",
        # relative import resolved against the package
        "pipeline/argo.py": "from ..infra import thing\nimport tf_keras\n",
        "infra/render.py": "import importlib\nimportlib.import_module('stacks.compose')\n",
        "common/ports.py": "from trainer import cluster\n",
        "trainer/launch.py": "from pipeline.__main__ import main\nimport pulumi_kubernetes\n",
        "serving/client.py": "from trainer import cli\n",
    })
    found = "\n".join(crossings(tmp_path))
    expected = [
        "serving.server imports pipeline.argo: serving must not import pipeline",
        "pipeline.argo imports infra.thing: pipeline must not import infra",
        "pipeline.argo imports tf_keras: pipeline must not import tf_keras",
        "infra.render imports stacks.compose: infra must not import stacks",
        "common.ports imports trainer.cluster: common must not import trainer",
        "trainer.launch imports pipeline.__main__: trainer must not import pipeline",
        "trainer.launch imports pulumi_kubernetes: trainer must not import pulumi*",
        "serving.client imports trainer.cli: a CLI module belongs to one program",
    ]
    missing = [line for line in expected if line not in found]
    assert not missing, f"not reported: {missing}\nreported:\n{found}"


def test_importing_an_entry_module_is_a_crossing_even_within_a_package(tmp_path: Path) -> None:
    write_tree(tmp_path, {**CLEAN_TREE, "stacks/render.py": "from stacks.__main__ import main\n"})
    assert any("stacks.render imports stacks.__main__: a CLI module" in line
               for line in crossings(tmp_path))


def test_what_a_module_loads_through_another_counts(tmp_path: Path) -> None:
    """pipeline.local imports trainer.cluster, allowed; once trainer.cluster imports TensorFlow at
    module level, importing pipeline.local loads TensorFlow."""
    write_tree(tmp_path, {**CLEAN_TREE, "trainer/cluster.py": "import tensorflow\n"})
    assert crossings(tmp_path) == [
        "infra.thing loads tensorflow when imported, through pipeline.local -> trainer.cluster "
        "(infra must not import tensorflow)",
        "pipeline.local loads tensorflow when imported, through trainer.cluster "
        "(pipeline must not import tensorflow)",
    ]


STACKS_TREE = {
    "stacks/__init__.py": "",
    "stacks/settings.py": "from pipeline import local\n",
    "stacks/kinds/__init__.py": "from stacks.kinds.k3d import K3dKind\n",
    "stacks/kinds/k3d.py": "from stacks.settings import StackSettings\n",
    "stacks/config.py": "from stacks.kinds import KINDS\nfrom stacks.settings import StackConfig\n",
}


def test_stacks_in_one_direction_pass(tmp_path: Path) -> None:
    write_tree(tmp_path, {**CLEAN_TREE, **STACKS_TREE})
    assert circles_and_dodges(tmp_path, "stacks") == []


def test_an_import_circle_in_stacks_is_named(tmp_path: Path) -> None:
    write_tree(tmp_path, {**CLEAN_TREE, **STACKS_TREE,
                          "stacks/kinds/k3d.py": "from stacks.config import StackSettings\n"})
    (problem,) = circles_and_dodges(tmp_path, "stacks")
    cycle = problem.removeprefix("stacks imports in a circle: ").split(" -> ")
    assert cycle[0] == cycle[-1]
    arrows = set(zip(cycle, cycle[1:]))  # importer -> imported
    assert arrows == {("stacks.config", "stacks.kinds"), ("stacks.kinds", "stacks.kinds.k3d"),
                      ("stacks.kinds.k3d", "stacks.config")}


def test_a_circle_dodged_by_an_import_inside_a_function_is_named(tmp_path: Path) -> None:
    write_tree(tmp_path, {**CLEAN_TREE, **STACKS_TREE, "stacks/settings.py": (
        "import importlib\n\ndef kinds():\n    from stacks.kinds import KINDS\n    return KINDS\n\n"
        "def config():\n    return importlib.import_module('stacks.config')\n")})
    assert circles_and_dodges(tmp_path, "stacks") == [
        f"stacks/settings.py:{line}: stacks.settings imports {module} inside a function (an import circle "
        "dodged): import it at module level, and break the circle"
        for line, module in ((4, "stacks.kinds"), (8, "stacks.config"))]


def test_imports_under_type_checking_are_not_loaded_at_import_time(tmp_path: Path) -> None:
    write_tree(tmp_path, {**CLEAN_TREE, "trainer/cluster.py":
                          "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tensorflow\n"})
    assert crossings(tmp_path) == []
