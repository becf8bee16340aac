"""The docs name only what exists: every file path, module, dotted name and stack config key a page
quotes in backticks resolves in the code as it is today, so a rename or a move fails here instead of
sending a reader to `common/cluster_names.py` when it was still elsewhere. The results pages are
records of a commit and keep the names they had; the rest is held to the tree."""

from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from tools import docs_reference

RECORDS = "docs/results/"  # dated results: each names the tree of its own commit
CODE = re.compile(r"`([^`\n]+)`")
# A path into the repository: a top-level folder of ours, then at least one more part.
PATH = re.compile(r"(?<![\w./:-])([a-z_][\w-]*(?:/[\w.*-]+)+/?)")
DOTTED = re.compile(r"([a-z_]\w*(?:\.\w+)+)(?:\(\))?")
FILE_NAME = re.compile(r"\w+\.py")
# "`some/module.py` (`NAME`, `other_name`": the names quoted right after a module are defined in it.
NAMES_AFTER_MODULE = re.compile(r"`([\w/]+\.py)` \(([^)]*)")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# "- **serving/**: ..." in the architecture page: the package's files it lists, up to the next item.
PACKAGE_ITEM = re.compile(r"^- \*\*(\w+)/\*\*")


@cache
def tracked() -> tuple[str, ...]:
    listing = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout
    return tuple(path for path in listing.split() if (REPO_ROOT / path).exists())


def pages() -> list[str]:
    docs = [path for path in tracked() if path.startswith("docs/") and path.endswith(".md")]
    return ["README.md"] + [page for page in docs if not page.startswith(RECORDS)]


@cache
def top_level_names() -> dict[str, frozenset[str]]:
    """Each module of ours (dotted) and the names its top level defines or imports."""
    modules = {}
    for path in tracked():
        if not path.endswith(".py"):
            continue
        tree = ast.parse((REPO_ROOT / path).read_text())
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {name.id for target in targets for name in ast.walk(target)
                          if isinstance(name, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        module = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        modules[module] = frozenset(names)
    return modules


@cache
def config_keys() -> frozenset[str]:
    """Every key and section name the generated configuration reference documents."""
    text = docs_reference.CONFIGURATION_PAGE.read_text()
    keys = set(re.findall(r"^\| \[?`(\w+)`", text, re.MULTILINE))
    sections = {part for heading in re.findall(r"^#+ ([\w.]+)", text, re.MULTILINE)
                for part in heading.split(".")}
    return frozenset(keys | sections)


@dataclass(frozen=True)
class Reference:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: `{self.text}`"


def quoted(page: str) -> list[tuple[int, str, str]]:
    """(line number, line, backticked text) of each quote on the page, outside fenced code."""
    found, fenced = [], False
    for number, line in enumerate((REPO_ROOT / page).read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            found += [(number, line, text.strip()) for text in CODE.findall(line)]
    return found


def path_resolves(path: str) -> bool:
    path = path.rstrip("/")
    if "*" in path:
        pattern = re.compile(re.escape(path).replace(r"\*", "[^/]*"))
        return any(pattern.match(file) for file in tracked())
    return any(file == path or file.startswith(path + "/") for file in tracked())


def dotted_resolves(name: str) -> bool:
    """A module of ours and a name in it (`pipeline.argo.render`), or a stack config key
    (`pipeline.rollout.canaryPercent`)."""
    parts = name.split(".")
    modules = top_level_names()
    for length in range(len(parts), 0, -1):
        module = ".".join(parts[:length])
        if module in modules and length > 1:
            rest = parts[length:]
            return not rest or rest[0] in modules[module]
    return all(part in config_keys() for part in parts[1:])


def broken_references() -> list[Reference]:
    folders = {path.split("/")[0] for path in tracked() if "/" in path}
    packages = {module.split(".")[0] for module in top_level_names() if "." in module}
    file_names = {Path(path).name for path in tracked()}
    broken = []
    for page in pages():
        for number, line, text in quoted(page):
            for path in PATH.findall(text):
                if path.split("/")[0] in folders and not path_resolves(path):
                    broken.append(Reference(page, number, path))
            dotted = DOTTED.fullmatch(text)
            if dotted and dotted.group(1).split(".")[0] in packages and not dotted_resolves(dotted.group(1)):
                broken.append(Reference(page, number, text))
            if FILE_NAME.fullmatch(text) and text not in file_names:
                broken.append(Reference(page, number, text))
        broken += names_after_modules(page)
    return broken + package_lists()


def names_after_modules(page: str) -> list[Reference]:
    broken = []
    for number, line in enumerate((REPO_ROOT / page).read_text().splitlines(), 1):
        for path, names in NAMES_AFTER_MODULE.findall(line):
            module = path.removesuffix(".py").replace("/", ".")
            defined = top_level_names().get(module, frozenset())
            broken += [Reference(page, number, f"{path}: {name}") for name in CODE.findall(names)
                       if IDENTIFIER.fullmatch(name) and name not in defined]
    return broken


def package_lists() -> list[Reference]:
    """The architecture page's list of packages: each file it names under a package is in it."""
    page = "docs/concepts/architecture.md"
    broken, package = [], None
    for number, line in enumerate((REPO_ROOT / page).read_text().splitlines(), 1):
        item = PACKAGE_ITEM.match(line)
        if item or not line.startswith("  "):
            package = item.group(1) if item else None
        if package is None:
            continue
        for text in CODE.findall(line):
            if FILE_NAME.fullmatch(text) and not path_resolves(f"{package}/{text}"):
                broken.append(Reference(page, number, f"{package}/{text}"))
    return broken


def test_every_path_module_name_and_key_the_docs_quote_exists():
    assert [str(reference) for reference in broken_references()] == []


@pytest.mark.parametrize("quote, resolves", [
    ("common/cluster_names.py", True), ("pipeline/manifests.py", False), ("engines/", True),
    ("pipeline.argo", True), ("serving.kserve_overrides.StrictDataPlane", True),
    ("pipeline.manifests.training_runtime", False), ("serving.dataplane.StrictDataPlane", False),
    ("pipeline.rollout.canaryPercent", True), ("pipeline.rollout.canaryShare", False),
])
def test_the_check_tells_a_moved_name_from_a_present_one(quote, resolves):
    check = path_resolves if "/" in quote else dotted_resolves
    assert check(quote) is resolves


def test_names_quoted_after_a_module_are_held_to_it(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("holds the calls in `common/cluster_names.py` (`API_CALLS`, `TFJOB_STEP_CALLS`;\n")
    monkeypatch.setattr("test_docs_references.REPO_ROOT", tmp_path)
    assert [reference.text for reference in names_after_modules("page.md")] == [
        "common/cluster_names.py: TFJOB_STEP_CALLS"]
