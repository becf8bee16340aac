"""`python -m infra.preflight` against a fake PATH: small shell scripts that print what the real
tools print (versions, JSON, a Docker daemon that is down)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

DOCKER_DOWN = ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
               "Is the docker daemon running?")

# Each fake answers the arguments preflight uses and fails on anything else, so that a changed
# probe shows up here. Only shell built-ins: PATH holds nothing but the fakes.
DOCKER_UP = """\
case "$*" in
  "version --format {{.Client.Version}}") echo "27.3.1" ;;
  "--version") echo "Docker version 27.3.1, build ce12230" ;;
  "info --format {{.ServerVersion}}") echo "27.3.1" ;;
  *) exit 64 ;;
esac
"""
# What docker prints when the daemon is down: the client's version, then the error, exit 1.
DOCKER_DAEMON_DOWN = f"""\
case "$*" in
  "version --format {{{{.Client.Version}}}}") echo "27.3.1"; echo "{DOCKER_DOWN}" >&2; exit 1 ;;
  "--version") echo "Docker version 27.3.1, build ce12230" ;;
  "info --format {{{{.ServerVersion}}}}") echo; echo "{DOCKER_DOWN}" >&2; exit 1 ;;
  *) exit 64 ;;
esac
"""
# Docker 20.10 as some distributions still package it; `--format` unknown to this fake.
DOCKER_OLD = """\
case "$*" in
  "--version") echo "Docker version 20.10.24+dfsg1, build 297e128" ;;
  *) echo "unknown flag: --format" >&2; exit 125 ;;
esac
"""
K3D = """\
[ "$*" = "version" ] || exit 64
echo "k3d version v5.8.3"
echo "k3s version v1.31.5-k3s1 (default)"
"""
# Too old, and the k3s line carries a newer-looking number that must not be taken for k3d's.
K3D_OLD = """\
[ "$*" = "version" ] || exit 64
echo "k3d version v5.4.6"
echo "k3s version v5.24.4-k3s1 (default)"
"""
PULUMI = '[ "$*" = "version" ] || exit 64\necho "v3.190.0"\n'
PULUMI_GARBLED = '[ "$*" = "version" ] || exit 64\necho "dev build"\n'
KUBECTL = """\
[ "$*" = "version --client -o json" ] || exit 64
echo '{'
echo '  "clientVersion": {'
echo '    "major": "1",'
echo '    "minor": "35",'
echo '    "gitVersion": "v1.35.8",'
echo '    "gitCommit": "74cdb426431d6ff1d3a6b3a5c61df8c30da6e56e",'
echo '    "gitTreeState": "clean",'
echo '    "buildDate": "2025-08-12T18:04:35Z",'
echo '    "goVersion": "go1.24.5",'
echo '    "compiler": "gc",'
echo '    "platform": "linux/amd64"'
echo '  },'
echo '  "kustomizeVersion": "v5.6.0"'
echo '}'
"""
GCLOUD = """\
[ "$*" = "version --format json" ] || exit 64
echo '{'
echo '  "Google Cloud SDK": "540.0.0",'
echo '  "bq": "2.1.22",'
echo '  "core": "2025.09.12",'
echo '  "gke-gcloud-auth-plugin": "0.5.10",'
echo '  "gsutil": "5.35"'
echo '}'
"""
GKE_AUTH_PLUGIN = """\
[ "$*" = "--version" ] || exit 64
echo "Kubernetes v1.30.0+1ddd3c8d4d5a6d0b2ab4f5e7c0b3c5bde0d3a1f4"
"""
# As Apple's build prints it: the version, then its own.
GIT = '[ "$*" = "--version" ] || exit 64\necho "git version 2.39.5 (Apple Git-154)"\n'
GIT_UNVERSIONED = '[ "$*" = "--version" ] || exit 64\necho "dev build"\n'

LOCAL_TOOLS = {"docker": DOCKER_UP, "k3d": K3D, "pulumi": PULUMI, "kubectl": KUBECTL, "git": GIT}
GKE_TOOLS = {**LOCAL_TOOLS, "gcloud": GCLOUD, "gke-gcloud-auth-plugin": GKE_AUTH_PLUGIN}

OK_DOCKER = "ok: docker 27.3.1 (>= 24.0), daemon answers"
OK_K3D = "ok: k3d 5.8.3 (>= 5.6)"
OK_PULUMI = "ok: pulumi 3.190.0 (>= 3.120)"
OK_KUBECTL = "ok: kubectl 1.35.8 (>= 1.34)"
OK_GIT = "ok: git 2.39.5"


def fake_path(directory: Path, tools: dict[str, str]) -> Path:
    directory.mkdir()
    for name, body in tools.items():
        script = directory / name
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(0o755)
    return directory


def preflight(path: Path, *args: str) -> subprocess.CompletedProcess:
    # PATH is only the fakes: no real docker or kubectl on the machine can answer instead.
    return subprocess.run([sys.executable, "-m", "infra.preflight", *args], cwd=REPO_ROOT,
                          env={"PATH": str(path)}, capture_output=True, text=True, timeout=120)


def test_all_present_prints_each_version_and_exits_0(tmp_path):
    result = preflight(fake_path(tmp_path / "bin", LOCAL_TOOLS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [OK_DOCKER, OK_K3D, OK_PULUMI, OK_KUBECTL, OK_GIT,
                                          "preflight: ready for `pulumi up --stack local`"]
    assert result.stderr == ""


def test_a_missing_tool_is_one_line_naming_its_install_page(tmp_path):
    tools = {name: body for name, body in LOCAL_TOOLS.items() if name != "k3d"}
    result = preflight(fake_path(tmp_path / "bin", tools), "--stack", "local")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        OK_DOCKER,
        'problem: k3d is not on PATH; install k3d >= 5.6: see k3d.io "Installation"',
        OK_PULUMI, OK_KUBECTL, OK_GIT,
    ]
    assert result.stderr.splitlines() == [
        "preflight: 1 problem(s) for `pulumi up --stack local`; fix them and run "
        "`make preflight STACK=local` again"]


def test_too_old_tools_say_what_they_are_older_than_and_why(tmp_path):
    result = preflight(fake_path(tmp_path / "bin", {**LOCAL_TOOLS, "k3d": K3D_OLD, "docker": DOCKER_OLD}))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "problem: docker 20.10.24 is older than 24.0 (needed for BuildKit builds); upgrade it: "
        'see Docker docs "Install Docker Engine" or "Install Docker Desktop"',
        "problem: k3d 5.4.6 is older than 5.6 (needed for k3s 1.35 images); upgrade it: "
        'see k3d.io "Installation"',
        OK_PULUMI, OK_KUBECTL, OK_GIT,
    ]
    assert "2 problem(s)" in result.stderr


def test_docker_whose_daemon_does_not_answer_is_a_problem(tmp_path):
    result = preflight(fake_path(tmp_path / "bin", {**LOCAL_TOOLS, "docker": DOCKER_DAEMON_DOWN}))
    assert result.returncode == 1
    assert result.stdout.splitlines()[0] == (
        "problem: docker 27.3.1 is installed but its daemon does not answer (`docker info`: exit "
        f"status 1: {DOCKER_DOWN}); start Docker Desktop or the docker service "
        "(`sudo systemctl start docker`)")
    assert result.stdout.splitlines()[1:] == [OK_K3D, OK_PULUMI, OK_KUBECTL, OK_GIT]


def test_a_version_that_cannot_be_read_is_a_problem_not_a_pass(tmp_path):
    bin_dir = fake_path(tmp_path / "bin", {**LOCAL_TOOLS, "pulumi": PULUMI_GARBLED})
    result = preflight(bin_dir)
    assert result.returncode == 1
    assert result.stdout.splitlines()[2] == (
        f"problem: pulumi at {bin_dir / 'pulumi'}: `pulumi version` printed no version (dev build); "
        'reinstall it: see Pulumi docs "Download & install Pulumi"')


def test_gke_needs_gcloud_and_its_auth_plugin_but_not_k3d(tmp_path):
    tools = {name: body for name, body in GKE_TOOLS.items() if name != "k3d"}
    result = preflight(fake_path(tmp_path / "bin", tools), "--stack", "gke")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        OK_DOCKER, OK_PULUMI, OK_KUBECTL, "ok: gcloud 540.0.0 (>= 400.0)",
        "ok: gke-gcloud-auth-plugin 1.30.0", OK_GIT, "preflight: ready for `pulumi up --stack gke`"]


def test_gke_without_gcloud_or_the_plugin_lists_both(tmp_path):
    result = preflight(fake_path(tmp_path / "bin", LOCAL_TOOLS), "--stack", "gke")
    assert result.returncode == 1
    assert result.stdout.splitlines()[3:] == [
        "problem: gcloud is not on PATH; install gcloud >= 400.0: "
        'see Google Cloud docs "Install the gcloud CLI"',
        "problem: gke-gcloud-auth-plugin is not on PATH; install gke-gcloud-auth-plugin: run "
        "`gcloud components install gke-gcloud-auth-plugin` (GKE docs "
        '"Install kubectl and configure cluster access")',
        OK_GIT,
    ]
    assert "2 problem(s) for `pulumi up --stack gke`" in result.stderr


@pytest.mark.parametrize("stack", ["local", "gke"])
def test_git_is_checked_for_both_stacks(tmp_path, stack):
    """kustomize fetches the training operator's manifests with git, on either stack."""
    tools = {name: body for name, body in GKE_TOOLS.items() if name != "git"}
    result = preflight(fake_path(tmp_path / "bin", tools), "--stack", stack)
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1] == (
        'problem: git is not on PATH; install git: see git-scm.com "Downloads"')
    assert f"1 problem(s) for `pulumi up --stack {stack}`" in result.stderr


def test_a_git_that_prints_no_version_but_runs_passes(tmp_path):
    """git has no minimum, so a build whose --version says no number still passes."""
    result = preflight(fake_path(tmp_path / "bin", {**LOCAL_TOOLS, "git": GIT_UNVERSIONED}))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: git runs" in result.stdout.splitlines()


@pytest.mark.parametrize("args", [["--stack", "aws"], ["--bogus"]])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args):
    result = preflight(fake_path(tmp_path / "bin", LOCAL_TOOLS), *args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("preflight: error: ")
