"""The docs stay true: the generated reference pages are what the code gives today, every command a
docstring shows is one its module declares, and the MkDocs site builds with every internal link and
anchor resolving, the front page's links into it included."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import REPO_ROOT, in_ci

from tools import docs_reference

REGENERATE = "regenerate: python tools/docs_reference.py"
# The README's links into the docs: `docs/<page>.md` with an optional `#anchor`.
DOCS_LINK = re.compile(r"\]\((docs/[^)#\s]+\.md)(?:#([^)\s]+))?\)")


@pytest.fixture(scope="module")
def generated() -> dict[Path, str]:
    """What the generator writes today, page by page: generated once (it reads every config model and
    every module's docstring)."""
    return docs_reference.pages()


@pytest.fixture(scope="module")
def runnable() -> tuple[list[docs_reference.Command], list[str]]:
    """The commands the usage lines show, and the runnable modules without one: read once."""
    return docs_reference.commands()


@pytest.mark.parametrize("path", [docs_reference.CONFIGURATION_PAGE, docs_reference.CLI_PAGE],
                         ids=lambda path: path.name)
def test_the_committed_reference_pages_are_what_the_generator_writes(path, generated):
    assert path.exists(), REGENERATE
    assert path.read_text() == generated[path], REGENERATE


def test_the_check_command_finds_nothing_stale():
    result = subprocess.run([sys.executable, "tools/docs_reference.py", "--check"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_runnable_module_says_how_to_run_it(runnable):
    commands, missing = runnable
    assert missing == [], "add an indented `python -m ...` usage line to each module's docstring"
    assert {"python -m pipeline", "python -m trainer.train", "python -m serving.server",
            "python tools/e2e.py"} <= {command.command for command in commands}


def test_every_flag_a_usage_line_shows_is_declared_by_its_module(runnable):
    undefined = {command.name: command.undefined_flags() for command in runnable[0]}
    assert {name: flags for name, flags in undefined.items() if flags} == {}


def test_the_generator_notices_a_stale_page(tmp_path, monkeypatch):
    stale = tmp_path / "cli.md"
    stale.write_text("# Command line\n")
    monkeypatch.setattr(docs_reference, "CLI_PAGE", stale)
    assert (stale, docs_reference.REGENERATE) in docs_reference.stale_files()


class Anchors(HTMLParser):
    """The ids of a built page's elements."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids |= {value for name, value in attrs if name == "id" and value}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as `mkdocs build --strict` writes it (a warning, such as a link or anchor that does
    not resolve, fails the build)."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        if in_ci():
            pytest.fail("mkdocs and mkdocs-material are not installed (CI=true, so not skipped)",
                        pytrace=False)
        pytest.skip("mkdocs and mkdocs-material are not installed")
    site_dir = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr
    return site_dir


def test_the_site_builds_strict_with_every_page_in_it(site):
    pages = sorted(path.relative_to(REPO_ROOT / "docs").with_suffix("")
                   for path in (REPO_ROOT / "docs").rglob("*.md"))
    for page in pages:  # docs/a/b.md -> a/b/index.html, docs/a/index.md -> a/index.html
        built = site / page.parent / ("" if page.name == "index" else page.name) / "index.html"
        assert built.exists(), f"docs/{page}.md was not built"


def test_the_front_pages_links_land_in_the_site(site):
    links = DOCS_LINK.findall((REPO_ROOT / "README.md").read_text())
    assert links, "the README links into docs/"
    for page, anchor in links:
        assert (REPO_ROOT / page).exists(), page
        if anchor:
            relative = Path(page).relative_to("docs").with_suffix("")
            parser = Anchors()
            parser.feed((site / relative / "index.html").read_text())
            assert anchor in parser.ids, f"{page}#{anchor}"


def test_the_front_pages_package_table_names_every_package():
    """Each package pyproject.toml installs, and the policy pack and tools, has its row."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    installed = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {name.rstrip("*") for name in installed} | {"policy", "tools"}
    rows = set(re.findall(r"^\| `(\w+)/` \|", (REPO_ROOT / "README.md").read_text(), re.MULTILINE))
    assert rows == packages, (sorted(packages - rows), sorted(rows - packages))
