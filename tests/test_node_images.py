"""The control-plane tier's node images (tools/control_plane/nodes/images.py): the names the kubelet asks for,
the Dockerfiles' replaceable base, the commands the builder runs, and what it says when this machine
cannot build. The images themselves run in the tier, on its real node (tests/e2e_node/test_node.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from infra.images import BASE_IMAGES, IMAGE_INPUTS, image_ref
from tools.control_plane import build
from tools.control_plane.nodes import images

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
    names = images.image_names(images.Inputs(pause=pause_source(tmp_path)))
    assert list(names) == ["pause", "busybox", *BASE_IMAGES]
    assert names["busybox"] == "docker.io/library/busybox:latest"
    for image in BASE_IMAGES:
        assert names[image] == f"docker.io/{image_ref(image)}"


def test_the_table_has_a_row_per_image_the_stacks_build_and_a_key_per_row():
    """The project's rows are the images every stack builds; each row's key names one image."""
    assert [image.key for image in images.images_of(images.PROJECT)] == list(BASE_IMAGES)
    keys = [image.key for image in images.IMAGES]
    assert len(keys) == len(set(keys)), keys
    assert {image.role for image in images.IMAGES} == {images.NODE, images.PROJECT, images.PLATFORM}


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


def test_each_platform_image_is_a_static_program_named_as_the_stacks_config_names_it():
    from pipeline.argo import executor_config
    from tools.control_plane import build, components

    pins = components.pins()
    platform = images.images_of(images.PLATFORM)
    (executor,) = [image for image in platform if image.component == "argoexec"]
    argo = build.Built("argoexec", "m", "v4.0.5", pins.argo, "x", "/m", {})
    assert executor.name(images.Inputs(programs={"argoexec": argo})) == executor_config(pins.argo)["image"]
    # Upstream's argoexec-nonroot: a user of its own, which the restricted step pods require.
    assert executor.user == 8737 and executor.path == "/bin/argoexec"
    makers = {name: getattr(components, name.replace("-", "_")) for name in
              {image.component for image in platform}}
    for image in platform:
        component = makers[image.component]("v1.0.0")
        programs = {build.program_name(component.name, command) for command in component.commands}
        assert component.static and image.program in programs, image
        assert isinstance(image.user, int) and image.user != 0, image  # runAsNonRoot checks a numeric user


def test_a_built_images_id_is_buildahs_and_said_cached_when_unchanged(monkeypatch):
    said, ids = [], iter(["sha256:old", "sha256:new", "sha256:same", "sha256:same", None, None])
    monkeypatch.setattr(images, "image_id", lambda name: next(ids))
    assert images.built("x:1", lambda: None, said.append) == "sha256:new"
    assert images.built("x:1", lambda: None, said.append) == "sha256:same"
    assert [line.endswith("(cached)") for line in said] == [False, True]
    with pytest.raises(images.BuildError, match="buildah holds no image x:1 after building it"):
        images.built("x:1", lambda: None, said.append)


def test_the_manifest_names_the_node_its_pause_and_helper_by_their_rows(monkeypatch, tmp_path):
    monkeypatch.setattr(images, "MANIFEST", tmp_path / "node-images.json")
    assert images.read_manifest() is None
    written = [images.BuiltImage("pause", "registry.k8s.io/pause:3.10.1", "a", images.NODE),
               images.BuiltImage("busybox", images.HELPER_IMAGE, "b", images.NODE),
               images.BuiltImage("trainer", "docker.io/dist-ml/trainer:1", "c", images.PROJECT)]
    images.write_manifest(written)
    manifest = images.read_manifest()
    assert manifest.built == written
    assert (manifest.pause, manifest.helper) == ("registry.k8s.io/pause:3.10.1", images.HELPER_IMAGE)
    assert [image.key for image in manifest.of(images.NODE)] == ["pause", "busybox"]


def test_a_prune_removes_what_no_checkout_uses_and_keeps_a_running_builds_images():
    """Old tags of the tier's repositories, and images that lost their name to a newer build, go; the
    names in use, other repositories' images, and anything built within a build's longest time stay."""
    now, old = 1_000_000_000, 1_000_000_000 - images.BUILDAH_TIMEOUT_SECONDS - 1
    in_use = {"docker.io/dist-ml/serving:new", "registry.k8s.io/pause:3.10.1", images.STANDIN}
    stored = [
        images.StoredImage("a1", ("docker.io/dist-ml/serving:new",), old),
        images.StoredImage("a2", ("docker.io/dist-ml/serving:old",), old),
        images.StoredImage("a3", ("docker.io/dist-ml/serving:building",), now - 60),  # a running build's
        images.StoredImage("b1", ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.10.1"), old),
        images.StoredImage("c1", (), old),  # its name went to a newer build
        images.StoredImage("c2", (), now - 60),  # a running build's last step, no child yet
        images.StoredImage("d1", ("docker.io/library/postgres:16",), old),  # not the tier's
        images.StoredImage("e1", (images.STANDIN,), old),
    ]
    assert images.stale(stored, in_use, now) == ["docker.io/dist-ml/serving:old", "registry.k8s.io/pause:3.9",
                                                  "c1"]


def test_the_names_in_use_are_every_checkouts_on_the_machine_and_a_gone_checkouts_go(monkeypatch, tmp_path):
    monkeypatch.setattr(images, "IN_USE", tmp_path / "in-use")
    here, there, gone = tmp_path / "here", tmp_path / "there", tmp_path / "gone"
    here.mkdir()
    there.mkdir()
    images.write_in_use(["docker.io/dist-ml/serving:a"], checkout=here)
    images.write_in_use(["docker.io/dist-ml/serving:b"], checkout=there)
    images.write_in_use(["docker.io/dist-ml/serving:c"], checkout=gone)
    images.write_in_use(["docker.io/dist-ml/serving:a2"], checkout=here)  # its last run's, not every run's
    assert images.names_in_use() == {"docker.io/dist-ml/serving:a2", "docker.io/dist-ml/serving:b",
                                     images.STANDIN}
    assert not images.in_use_record(gone).exists()
