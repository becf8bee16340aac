"""The tests' pinned data: the pin table, where a pinned file is found, the checked download (from a
server on 127.0.0.1 only), missing fixtures skipped locally and failed under CI=true, and the wiring
of `make fixtures` into the Makefile and the PR workflow."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, require_fixture

from testdata import fixtures
from testdata.pins import CRD_PINS, SAMPLE_SHA256, Pin

TESTS_DIR = Path(__file__).resolve().parent
RAW_URL = re.compile(r"^https://raw\.githubusercontent\.com/[\w.-]+/[\w.-]+/[0-9a-f]{40}/(?P<path>\S+)$")
CONTENT = b"apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n" * 50


def small_pin(url: str = "http://127.0.0.1:9/unused", content: bytes = CONTENT) -> Pin:
    return Pin("sub/small.yaml", url, hashlib.sha256(content).hexdigest(), len(content))


def files_under(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file()) if directory.exists() else []


class QuietFileHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no access log on stderr
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, directory): a file server on 127.0.0.1 standing in for the upstream host."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(QuietFileHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def test_every_pin_is_a_url_at_a_fixed_commit_with_a_sha256():
    assert {"kubeflow.org_tfjobs.yaml", "serving.kserve.io_inferenceservices.yaml",
            "argoproj.io_workflows.yaml", "argoproj.io_workflowtemplates.yaml",
            "argo-v4.1.2/argoproj.io_workflows.yaml", "argo-v4.1.2/argoproj.io_workflowtemplates.yaml",
            } <= set(CRD_PINS)
    for name, pin in CRD_PINS.items():
        match = RAW_URL.match(pin.url)
        assert match and match["path"].endswith("/" + Path(name).name), pin.url
        assert re.fullmatch(r"[0-9a-f]{64}", pin.sha256) and pin.size > 0, name
    v3, v4 = (CRD_PINS[f"{d}argoproj.io_workflows.yaml"].url for d in ("", "argo-v4.1.2/"))
    assert v3.split("/")[5] != v4.split("/")[5]  # the two Argo lines are two commits


@pytest.mark.parametrize("name", sorted(CRD_PINS))
def test_each_pinned_crd_is_available_and_matches_its_checksum(name):
    path = require_fixture(lambda: fixtures.resolve(CRD_PINS[name]))
    assert fixtures.sha256_of(path) == CRD_PINS[name].sha256


def test_the_sample_is_in_the_repository_and_matches_its_checksums():
    directory = fixtures.sample_dir()
    assert directory == REPO_ROOT / "datasets" / "fashion-mnist-sample"
    assert sorted(p.name for p in directory.glob("*.gz")) == sorted(SAMPLE_SHA256)
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^SAMPLE_DIR \?= datasets/fashion-mnist-sample$", makefile, re.MULTILINE)


def test_a_changed_sample_file_is_an_error_not_a_skip(tmp_path):
    for name in SAMPLE_SHA256:
        (tmp_path / name).write_bytes(b"not the sample")
    with pytest.raises(fixtures.FixtureError, match="is not the pinned") as error:
        fixtures.sample_dir(tmp_path)
    assert not isinstance(error.value, fixtures.FixtureMissing)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(fixtures.FixtureMissing, match="t10k-labels-idx1-ubyte.gz are missing"):
        fixtures.sample_dir(tmp_path)


def test_shared_comes_first_then_the_cache(tmp_path):
    pin, shared, cache = small_pin(), tmp_path / "shared", tmp_path / "cache"
    for directory in (shared, cache):
        (directory / "sub").mkdir(parents=True)
        (directory / pin.name).write_bytes(CONTENT)
    assert fixtures.resolve(pin, shared_dir=shared, cache_dir=cache) == shared / pin.name
    (shared / pin.name).unlink()
    assert fixtures.resolve(pin, shared_dir=shared, cache_dir=cache) == cache / pin.name


def test_a_changed_copy_in_shared_is_an_error_naming_both_checksums(tmp_path):
    pin = small_pin()
    (tmp_path / "sub").mkdir()
    (tmp_path / pin.name).write_bytes(CONTENT + b"# edited\n")
    with pytest.raises(fixtures.FixtureError) as error:
        fixtures.resolve(pin, shared_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert not isinstance(error.value, fixtures.FixtureMissing)
    assert pin.sha256 in str(error.value) and str(tmp_path / pin.name) in str(error.value)


def test_missing_everywhere_without_download_says_how_to_get_it(tmp_path):
    with pytest.raises(fixtures.FixtureMissing) as error:
        fixtures.resolve(small_pin(), shared_dir=tmp_path / "a", cache_dir=tmp_path / "b")
    assert "make fixtures" in str(error.value) and "\n" not in str(error.value)
    assert files_under(tmp_path) == []


def test_download_verifies_then_caches_and_the_next_resolve_uses_the_cache(served, tmp_path):
    base, root = served
    (root / "small.yaml").write_bytes(CONTENT)
    pin, cache = small_pin(f"{base}/small.yaml"), tmp_path / "cache"
    path = fixtures.resolve(pin, shared_dir=tmp_path / "no-shared", cache_dir=cache, download_missing=True)
    assert path == cache / pin.name and path.read_bytes() == CONTENT
    assert files_under(cache) == [path]  # no temporary file left
    (root / "small.yaml").unlink()  # the server no longer has it: the cache answers
    assert fixtures.resolve(pin, shared_dir=tmp_path / "no-shared", cache_dir=cache) == path


@pytest.mark.parametrize("served_bytes", [CONTENT[:-1] + b"!", CONTENT[:100], CONTENT + b"more"],
                         ids=["same-size-other-bytes", "truncated", "too-long"])
def test_a_download_that_does_not_match_its_checksum_leaves_nothing(served, tmp_path, served_bytes):
    base, root = served
    (root / "small.yaml").write_bytes(served_bytes)
    cache = tmp_path / "cache"
    with pytest.raises(fixtures.FixtureError, match="nothing was cached") as error:
        fixtures.download(small_pin(f"{base}/small.yaml"), cache)
    assert small_pin().sha256 in str(error.value)
    assert files_under(cache) == []


def test_a_failed_download_is_one_line_and_leaves_nothing(served, tmp_path):
    base, _ = served
    cache = tmp_path / "cache"
    with pytest.raises(fixtures.FixtureError, match="404") as error:
        fixtures.download(small_pin(f"{base}/absent.yaml"), cache, timeout=5)
    assert "\n" not in str(error.value)
    with pytest.raises(fixtures.FixtureError, match="download failed"):
        fixtures.download(small_pin("http://127.0.0.1:9/closed-port.yaml"), cache, timeout=5)
    assert files_under(cache) == []


def test_the_real_table_downloads_through_the_same_path(served, tmp_path):
    """A pinned CRD, served locally from a copy in ../shared (or the cache), downloads and verifies."""
    pin = CRD_PINS["kubeflow.org_tfjobs.yaml"]
    source = require_fixture(lambda: fixtures.resolve(pin))
    base, root = served
    (root / "tfjobs.yaml").write_bytes(source.read_bytes())
    path = fixtures.download(dataclasses.replace(pin, url=f"{base}/tfjobs.yaml"), tmp_path)
    assert path == tmp_path / pin.name and fixtures.sha256_of(path) == pin.sha256


TINY_TEST = """
    import sys
    sys.path.insert(0, {tests_dir!r})
    from conftest import require_fixture
    from testdata.fixtures import FixtureMissing

    def missing():
        raise FixtureMissing("the widget is not at /nowhere; run `make widgets`")

    def test_needs_the_missing_widget():
        require_fixture(missing)

    def test_has_what_it_needs():
        assert require_fixture(lambda: 42) == 42
"""


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_missing_fixture_skips_with_one_line_but_fails_under_ci(tmp_path, ci):
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent(TINY_TEST.format(tests_dir=str(TESTS_DIR))))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if ci:
        env["CI"] = ci
    result = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "test_tiny.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    last = result.stdout.strip().splitlines()[-1]
    if ci:
        assert result.returncode == 1 and "1 failed, 1 passed" in last, result.stdout
        assert "missing fixture (CI=true, so not skipped): the widget is not at /nowhere" in result.stdout
    else:
        assert result.returncode == 0 and "1 passed, 1 skipped" in last, result.stdout
        (reason,) = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
        assert reason.endswith("missing fixture: the widget is not at /nowhere; run `make widgets`")


def test_the_fixtures_cache_is_ignored_by_git():
    result = subprocess.run(["git", "check-ignore", "-q", ".cache/fixtures/kubeflow.org_tfjobs.yaml"],
                            cwd=REPO_ROOT, capture_output=True, timeout=30)
    assert result.returncode == 0


def test_the_pr_workflow_fetches_the_fixtures_caches_them_and_runs_the_tests_under_ci():
    workflow = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "preview.yml").read_text())
    steps = workflow["jobs"]["checks"]["steps"]
    runs = [step.get("run", "").strip() for step in steps]
    uses = [step.get("uses", "") for step in steps]
    restore = next(i for i, u in enumerate(uses) if u.startswith("actions/cache/restore@"))
    save = next(i for i, u in enumerate(uses) if u.startswith("actions/cache/save@"))
    fetch = runs.index("make fixtures")
    tests = runs.index("make test-fast")
    assert restore < fetch < save < tests
    for cache in (steps[restore], steps[save]):
        assert cache["with"]["path"] == ".cache/fixtures"
        assert "hashFiles('testdata/pins.py')" in cache["with"]["key"]
    assert steps[tests]["env"]["CI"] == "true"
    preview = next(s for s in workflow["jobs"]["preview"]["steps"]
                   if s.get("uses", "").startswith("pulumi/actions@"))
    assert preview["with"]["upsert"] is True
    config = yaml.safe_load(preview["with"]["config-map"])
    assert set(config) == {"gcp:project", "gcp:region"}
    assert all("${{ vars." in entry["value"] for entry in config.values())


def test_make_fixtures_runs_the_testdata_module():
    result = subprocess.run(["make", "--no-print-directory", "-n", "fixtures"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "-m testdata" in result.stdout, result.stderr
