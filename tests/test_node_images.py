"""The control-plane tier's node images (tools/control_plane/images.py): the names the kubelet asks for,
the Dockerfiles' replaceable base, the commands the builder runs, and what it says when this machine
cannot build; then (slow) the images a build left in buildah's storage, if there are any."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO_ROOT, in_ci

from infra.images import BASE_IMAGES, IMAGE_INPUTS, image_ref
from tools.control_plane import build, images

DEFAULT_BASE = "python:3.11-slim"


@pytest.mark.parametrize(("ref", "name"), [
    ("dist-ml/trainer:0123456789ab", "docker.io/dist-ml/trainer:0123456789ab"),
    ("busybox", "docker.io/library/busybox"),
    ("busybox:latest", "docker.io/library/busybox:latest"),
    ("registry.k8s.io/pause:3.10.1", "registry.k8s.io/pause:3.10.1"),
    ("localhost/dist-ml/python-standin:3.11", "localhost/dist-ml/python-standin:3.11"),
    ("localhost:5000/dist-ml/trainer:1", "localhost:5000/dist-ml/trainer:1"),
])
def test_names_are_qualified_as_containerd_normalizes_them(ref, name):
    assert images.qualified(ref) == name


@pytest.mark.parametrize("image", IMAGE_INPUTS)
def test_every_dockerfile_takes_its_base_as_an_argument_defaulting_to_python_slim(image):
    lines = [line for line in (REPO_ROOT / image / "Dockerfile").read_text().splitlines()
             if line and not line.startswith("#")]
    froms = [line for line in lines if line.startswith("FROM ")]
    assert froms == ["FROM ${BASE_IMAGE}"]
    assert lines.index(f"ARG BASE_IMAGE={DEFAULT_BASE}") < lines.index(froms[0])


def pause_source(tmp_path: Path, makefile: str = "TAG ?= 3.10.1\nCFLAGS = -Os -Wall -static "
                                                  "-DVERSION=v$(TAG)-$(REV)\n") -> images.PauseSource:
    directory = tmp_path / images.PAUSE_DIR
    (directory / "linux").mkdir(parents=True)
    (directory / "linux" / "pause.c").write_text("int main(void) { return 0; }\n")
    (directory / "Makefile").write_text(makefile)
    return images.pause_source(tmp_path, "v1.33.4")


def test_the_pause_image_is_built_with_upstreams_makefile_flags_and_named_by_its_tag(tmp_path):
    source = pause_source(tmp_path)
    assert source.cflags == ("-Os", "-Wall", "-static", "-DVERSION=v3.10.1-v1.33.4")
    assert images.pause_name(source) == "registry.k8s.io/pause:3.10.1"


def test_a_kubernetes_module_without_the_pause_source_is_refused(tmp_path):
    with pytest.raises(build.BuildError, match="no build/pause/linux/pause.c"):
        images.pause_source(tmp_path, "v1.33.4")
    with pytest.raises(build.BuildError, match="TAG and CFLAGS"):
        pause_source(tmp_path, makefile="TAG := 3.10.1\n")


def test_the_images_are_named_as_the_stack_and_the_provisioner_name_them(tmp_path):
    names = images.image_names(pause_source(tmp_path))
    assert list(names) == ["pause", "busybox", *BASE_IMAGES]
    assert names["busybox"] == "docker.io/library/busybox:latest"
    for image in BASE_IMAGES:
        assert names[image] == f"docker.io/{image_ref(image)}"


def test_a_project_image_is_built_from_its_dockerfile_on_the_stand_in(tmp_path):
    name = images.qualified(image_ref("trainer"))
    bundle = tmp_path / "ca-certificates.crt"
    assert "--volume" not in images.project_build_argv("trainer", name, ca_bundle=bundle)
    bundle.write_text("")
    argv = images.project_build_argv("trainer", name, ca_bundle=bundle)
    assert argv[0] == "build" and "--layers" in argv and "--force-rm" in argv
    assert argv[argv.index("--volume") + 1] == f"{bundle}:{bundle}:ro"  # while RUN steps run, not kept
    assert argv[argv.index("--network") + 1] == "host"  # pip reaches PyPI during RUN
    assert argv[argv.index("--build-arg") + 1] == f"BASE_IMAGE={images.STANDIN}"
    assert argv[argv.index("-f") + 1] == str(REPO_ROOT / "trainer" / "Dockerfile")
    assert argv[argv.index("-t") + 1] == name
    assert argv[-1] == str(REPO_ROOT)


def test_the_stand_in_is_made_from_the_machines_debian_sources(tmp_path):
    (tmp_path / "debian.sources").write_text("Types: deb\nURIs: http://deb.debian.org/debian\n"
                                             "Suites: bookworm bookworm-updates\nComponents: main\n")
    (tmp_path / "security.list").write_text("deb [arch=amd64] http://deb.debian.org/debian-security "
                                            "bookworm-security main\n# deb http://x bookworm main\n")
    (tmp_path / "cloud-sdk.list").write_text("deb https://packages.cloud.google.com/apt "
                                             "cloud-sdk-bookworm main\n")
    (tmp_path / "nodesource.sources").write_text("Types: deb\nURIs: https://deb.nodesource.com/node_20.x\n"
                                                 "Suites: nodistro\nComponents: main\n")
    (tmp_path / "old.list.disabled").write_text("deb http://deb.debian.org/debian bookworm main\n")
    sources = images.apt_sources((tmp_path / "absent.list", tmp_path))
    assert sources == [tmp_path / "debian.sources", tmp_path / "security.list"]
    assert images.source_suites((tmp_path / "security.list").read_text()) == {"bookworm-security"}

    argv = images.mmdebstrap_argv(tmp_path / "rootfs.tar", sources)
    assert argv[:2] == ["mmdebstrap", "--variant=minbase"]
    assert "--include=python3,python3-pip,python-is-python3,passwd,ca-certificates" in argv
    assert 'rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED' in " ".join(argv)
    assert argv[-4:] == ["bookworm", str(tmp_path / "rootfs.tar"), *map(str, sources)]


def test_archives_are_named_after_their_image_outside_the_clone():
    archive = images.archive_path("docker.io/dist-ml/trainer:0123456789ab")
    assert archive.name == "docker.io_dist-ml_trainer_0123456789ab.tar"
    assert not archive.is_relative_to(REPO_ROOT)


@pytest.mark.parametrize(("ci", "status"), [("", 0), ("true", 1)])
def test_without_buildah_it_says_so_and_fails_only_under_ci(monkeypatch, capsys, ci, status):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(shutil, "which", lambda program: None)
    assert images.main([]) == status
    assert "buildah is not on PATH" in capsys.readouterr().err


def test_an_unreachable_debian_mirror_is_unavailable_not_a_build_error(monkeypatch, tmp_path):
    monkeypatch.setattr(images, "CACHE", tmp_path)
    monkeypatch.setattr(images, "image_config", lambda name: None)
    monkeypatch.setattr(shutil, "which", lambda program: f"/usr/bin/{program}")

    def unreachable(*argv):
        raise build.BuildError("mmdebstrap: E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/"
                               "InRelease  Temporary failure resolving 'deb.debian.org'")

    monkeypatch.setattr(images, "run", unreachable)
    with pytest.raises(build.Unavailable, match="Debian's mirror cannot be reached"):
        images.build_standin()


# --- What a build left (slow: runs containers) ---------------------------------------------------------

def built_image(name: str, build_it) -> dict:
    """buildah's record of `name`. The tier's run builds the images (python -m tools.control_plane.images)
    and this suite does not, so without one it skips; under CI=true, which runs every test, it builds
    it with `build_it()` (the builder under test), failing if this machine cannot."""
    config = images.image_config(name) if shutil.which("buildah") else None
    if config is None:
        if not in_ci():
            pytest.skip(f"no image {name} in buildah's storage "
                        "(python -m tools.control_plane.images builds it)")
        try:
            build_it()
        except build.Unavailable as missing:
            pytest.fail(f"cannot build {name} (CI=true, so not skipped): {missing}", pytrace=False)
        config = images.image_config(name)
    return config


def run_in(name: str, *command: str) -> str:
    """`command`'s output in a throwaway container of `name`."""
    container = subprocess.run(["buildah", "from", "--pull-never", name], capture_output=True, text=True,
                               check=True).stdout.strip()
    try:
        return subprocess.run(["buildah", "run", container, "--", *command], capture_output=True, text=True,
                              check=True, timeout=300).stdout
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)


@pytest.mark.slow
def test_the_stand_in_base_is_debians_python_3_11_with_pip_free_to_install():
    built_image(images.STANDIN, images.build_standin)
    assert re.fullmatch(r"Python 3\.11\.\d+\n", run_in(images.STANDIN, "python", "--version"))
    assert run_in(images.STANDIN, "ls", "/usr/lib/python3.11").split().count("EXTERNALLY-MANAGED") == 0


@pytest.mark.slow
def test_the_trainer_image_runs_as_uid_1000_and_imports_the_trainer():
    name = images.qualified(image_ref("trainer"))
    config = built_image(name, lambda: images.build_images(("trainer",)))
    assert config["OCIv1"]["config"]["User"] == "1000"
    uid = run_in(name, "python", "-c", "import json, os, trainer; print(json.dumps(os.getuid()))")
    assert json.loads(uid) == 1000
