"""The GitHub workflows: what each runs, the versions they pin (from the one place each is pinned),
and actionlint's read of them (built from its Go module, as the PR check runs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from conftest import REPO_ROOT, in_ci

from common.cluster_target import KUBERNETES_MINOR
from tools.control_plane import components

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
ACTIONLINT = "github.com/rhysd/actionlint/cmd/actionlint"
PULUMI_VERSION = components.locked_version(components.PULUMI_SDK).removeprefix("v")


def workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def steps_of(name: str, job: str) -> list[dict]:
    return workflow(name)["jobs"][job]["steps"]


def test_the_pr_check_runs_the_fast_tests_and_actionlint_then_previews_the_gke_stack():
    preview = workflow("preview.yml")
    assert "pull_request" in preview[True]  # YAML 1.1 reads the key `on` as true
    runs = [step.get("run", "").strip() for step in steps_of("preview.yml", "checks")]
    assert "make test-fast" in runs
    assert any(run.startswith(f'go run "{ACTIONLINT}@') for run in runs)
    job = preview["jobs"]["preview"]
    assert job["needs"] == "checks"
    (action,) = [step for step in job["steps"] if step.get("uses", "").startswith("pulumi/actions@")]
    settings = action["with"]
    assert settings["command"] == "preview" and settings["stack-name"] == "gke"
    assert settings["policyPacks"] == "policy"
    assert settings["comment-on-pr"] is True and settings["cloud-url"] == "${{ secrets.PULUMI_BACKEND_URL }}"
    assert not any("credentials_json" in json.dumps(step) for step in job["steps"])  # federation only


def test_the_pr_check_runs_no_cluster_tier():
    """A cold Go build of the tier and a real node are the nightly's (cluster-tiers.yml), not a PR's."""
    text = (WORKFLOWS / "preview.yml").read_text()
    for tier in ("make test\n", "make test-cluster", "make test-e2e", "tools.control_plane", "node-packages"):
        assert tier not in text, tier


def test_every_pulumi_cli_the_workflows_install_is_the_sdks_and_pulumi_yaml_requires_it():
    for path in WORKFLOWS.glob("*.yml"):
        document = workflow(path.name)
        for job in document["jobs"].values():
            for step in job["steps"]:
                if step.get("uses", "").startswith("pulumi/actions@"):
                    assert step["with"]["pulumi-version"] == "${{ env.PULUMI_VERSION }}", path.name
                    assert document["env"]["PULUMI_VERSION"] == PULUMI_VERSION, path.name
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    assert project["requiredPulumiVersion"] == f">={PULUMI_VERSION}"


def test_every_workflows_kubectl_is_the_stacks_minor():
    pinned = {path.name: version for path in WORKFLOWS.glob("*.yml")
              if (version := workflow(path.name).get("env", {}).get("KUBECTL_VERSION"))}
    assert pinned, "no workflow pins kubectl"
    for name, version in pinned.items():
        assert re.fullmatch(rf"v{re.escape(KUBERNETES_MINOR)}\.[0-9]+", version), (
            f"{name}: kubectl {version}, the stacks' Kubernetes is {KUBERNETES_MINOR}")


def test_the_cluster_tiers_run_nightly_in_debian_on_a_freed_runner():
    document = workflow("cluster-tiers.yml")
    assert "schedule" in document[True] and "pull_request" not in document[True]
    runs = [step.get("run", "") for step in steps_of("cluster-tiers.yml", "tiers")]
    assert "rm -rf /usr/share/dotnet" in runs[0]
    (tiers,) = [run for run in runs if "docker run" in run]
    assert "--privileged" in tiers and "$DEBIAN_IMAGE" in tiers
    assert document["env"]["DEBIAN_IMAGE"].startswith("debian:bookworm")
    for step in ("make node-packages", "tools.control_plane all", "tools.prometheus"):
        assert step in tiers, step
    assert "-e CI=true" in tiers


def test_the_drift_check_previews_the_gke_stack_nightly_expecting_no_changes():
    document = workflow("drift.yml")
    assert "schedule" in document[True]
    (action,) = [step for step in steps_of("drift.yml", "drift")
                 if step.get("uses", "").startswith("pulumi/actions@")]
    assert action["with"]["command"] == "preview" and action["with"]["stack-name"] == "gke"
    assert action["with"]["expect-no-changes"] is True and action["with"]["refresh"] is True


def actionlint_version() -> str:
    """The version the PR check runs (its one pin)."""
    return workflow("preview.yml")["env"]["ACTIONLINT_VERSION"]


def test_actionlint_finds_nothing_in_the_workflows(tmp_path):
    if shutil.which("go") is None:
        if in_ci():
            pytest.fail("go is missing: actionlint is built from its module")
        pytest.skip("go is not installed")
    command = ["go", "run", f"{ACTIONLINT}@{actionlint_version()}", "-color=false"]
    clean = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    broken = tmp_path / ".github" / "workflows"
    broken.mkdir(parents=True)
    (broken / "broken.yml").write_text("on: push\njobs:\n  j:\n    runs-on: ubuntu-latest\n    steps:\n"
                                       "      - run: echo ${{ matrix.missing }}\n")
    found = subprocess.run([*command, str(broken / "broken.yml")], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600)
    assert found.returncode != 0 and "matrix" in found.stdout  # actionlint is not blind
