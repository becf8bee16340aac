"""Where the platform comes from and how its objects are applied (common/installs.py, infra/platform.py):
each chart and kustomization from upstream, an artifact directory or an OCI chart mirror; every image a
platform object names tagged as its release tags it and taken from an image mirror; the controllers'
requests for a small cluster; the artifact directory's list and what it lacks. The transforms run in the
real engine only (the control-plane tier's `pulumi up`, tests/e2e_node/test_pulumi.py): here their
functions are called on objects as the provider hands them over."""

from __future__ import annotations

import json

import pulumi
import pytest
from conftest import REPO_ROOT
from stack_checks import config_error_before_any_resource

from common.installs import (
    ArtifactSources,
    ChartInstall,
    KustomizeInstall,
    chart_source,
    kustomize_source,
    mirrored,
    qualified,
    with_images,
)
from infra import keda
from infra.platform import (
    argo_install,
    cert_manager_install,
    install_transform,
    kserve_installs,
    with_requests,
)
from stacks import artifacts, render
from stacks.config import from_pulumi_values, parse_stack_config
from stacks.installs import installed_artifacts, missing_artifacts

KUEUE = ChartInstall("kueue", "kueue", "oci://registry.k8s.io/kueue/charts", "0.19.2", "kueue-system", {})
CERT_MANAGER = cert_manager_install("v1.21.2")
TRAINER = KustomizeInstall("trainer", "https://github.com/kubeflow/trainer", "v2.3.0",
                           "manifests/overlays/manager")


@pytest.mark.parametrize("sources, chart, version, repository", [
    (ArtifactSources(), "oci://registry.k8s.io/kueue/charts/kueue", "0.19.2", None),
    (ArtifactSources(directory="/srv/a"), "/srv/a/charts/kueue-0.19.2.tgz", None, None),
    (ArtifactSources(chart_mirror="oci://harbor.example/charts/"), "oci://harbor.example/charts/kueue",
     "0.19.2", None),
    # The OCI mirror wins for charts even beside a directory (which still holds the kustomizations).
    (ArtifactSources(directory="/srv/a", chart_mirror="oci://harbor.example/charts"),
     "oci://harbor.example/charts/kueue", "0.19.2", None),
])
def test_a_chart_comes_from_upstream_a_directory_or_an_oci_mirror(sources, chart, version, repository):
    found = chart_source(KUEUE, sources)
    assert (found.chart, found.version, found.repository) == (chart, version, repository)


def test_a_chart_of_a_chart_repository_and_a_kustomization_come_from_upstream_or_the_directory():
    upstream = chart_source(CERT_MANAGER, ArtifactSources())
    assert (upstream.chart, upstream.version, upstream.repository) == (
        "cert-manager", "v1.21.2", "https://charts.jetstack.io")
    assert kustomize_source(TRAINER, ArtifactSources()) == (
        "https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0")
    # As `git clone --branch v2.3.0` lays the repository out, the kustomization at its path in it.
    assert kustomize_source(TRAINER, ArtifactSources(directory="/srv/a")) == (
        "/srv/a/kustomize/trainer-v2.3.0/manifests/overlays/manager")
    assert CERT_MANAGER.artifact == "charts/cert-manager-v1.21.2.tgz"  # as `helm pull` names it


@pytest.mark.parametrize("image, expected", [
    ("registry.k8s.io/kueue/kueue:v0.19.2", "m.example:5000/mirror/kueue/kueue:v0.19.2"),
    ("kserve/kserve-controller:v0.20.0", "m.example:5000/mirror/kserve/kserve-controller:v0.20.0"),  # Hub
    ("busybox", "m.example:5000/mirror/library/busybox"),
    ("quay.io/argoproj/argoexec@sha256:" + "a" * 64,
     "m.example:5000/mirror/argoproj/argoexec@sha256:" + "a" * 64),
    ("localhost:5000/x/y:1", "m.example:5000/mirror/x/y:1"),
])
def test_an_image_in_a_mirror_keeps_its_path_and_tag_under_the_mirrors_host(image, expected):
    assert mirrored(image, "m.example:5000/mirror/") == expected
    assert mirrored(image, None) == image


def test_images_are_named_as_containerd_names_them():
    assert qualified("busybox") == "docker.io/library/busybox"
    assert qualified("kserve/agent:v0.20.0") == "docker.io/kserve/agent:v0.20.0"
    assert qualified("registry.k8s.io/pause:3.10.1") == "registry.k8s.io/pause:3.10.1"


def deployment(*containers: dict) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"containers": list(containers)}}}}


def test_a_kustomizations_images_get_their_releases_tags_and_the_mirrors_host():
    """As Argo's and KEDA's releases tag their `:latest` and `:main` images (their Makefiles); every
    `image` an object names, the pod template's and others (KServe's storage container), is mirrored."""
    argo = dict(argo_install("v4.1.2").tags)
    found = with_images(deployment({"name": "c", "image": "quay.io/argoproj/workflow-controller:latest"},
                                   {"name": "s", "image": "quay.io/argoproj/argocli:latest"}), argo, "r:5000")
    assert [c["image"] for c in found["spec"]["template"]["spec"]["containers"]] == [
        "r:5000/argoproj/workflow-controller:v4.1.2", "r:5000/argoproj/argocli:v4.1.2"]
    keda_images = dict(keda.install("2.21.0").tags)
    assert with_images({"image": "ghcr.io/kedacore/keda:main"}, keda_images, None) == {
        "image": "ghcr.io/kedacore/keda:2.21.0"}
    # A schema's `image` property (a CRD's) is not an image: only text values are.
    schema = {"properties": {"image": {"type": "string"}}}
    assert with_images(schema, argo, "r:5000") == schema


def test_the_controllers_ask_for_what_a_small_cluster_gives_them_and_keep_their_limits():
    found = with_requests(deployment(
        {"name": "manager", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                                          "limits": {"cpu": "2", "memory": "512Mi"}}},
        {"name": "proxy", "resources": {"limits": {"cpu": "30m"}}},
        {"name": "plain"}), {"cpu": "50m"})
    resources = [c["resources"] for c in found["spec"]["template"]["spec"]["containers"]]
    assert resources == [
        {"requests": {"cpu": "50m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "512Mi"}},
        {"limits": {"cpu": "30m"}, "requests": {"cpu": "30m"}},  # never above its limit
        {"requests": {"cpu": "50m"}}]
    service = {"kind": "Service", "spec": {"ports": []}}
    assert with_requests(service, {"cpu": "50m"}) is service
    assert with_requests(deployment({"name": "c"}), {}) == deployment({"name": "c"})


def test_an_installs_secrets_leave_their_data_to_its_controllers():
    """Trainer's overlay makes its webhook certificate's Secret empty, which its rotator fills: the
    provider would replace it on every `up` (found by the tier's third `up`)."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "type": "Opaque", "data": {}}
    transformed = install_transform({}, None, {})(pulumi.ResourceTransformArgs(
        True, "kubernetes:core/v1:Secret", "s", secret, pulumi.ResourceOptions()))
    assert transformed.props == secret and transformed.opts.ignore_changes == ["data"]
    service = {"kind": "Service", "metadata": {"name": "s"}}
    kept = install_transform({}, None, {})(pulumi.ResourceTransformArgs(
        True, "kubernetes:core/v1:Service", "s", service, pulumi.ResourceOptions()))
    assert not kept.opts.ignore_changes


def test_kserves_configured_images_come_from_the_mirror_and_only_then_are_set():
    _, resources, _ = kserve_installs("v0.20.0", {"deploymentMode": "Standard"}, None)
    assert set(resources.values["kserve"]) == {"controller", "storage"}
    _, mirrored_resources, _ = kserve_installs("v0.20.0", {"deploymentMode": "Standard"}, "r:5000")
    assert mirrored_resources.values["kserve"]["agent"] == {"image": "r:5000/kserve/agent"}
    assert mirrored_resources.values["kserve"]["storage"]["image"] == "r:5000/kserve/storage-initializer"


def test_cert_managers_chart_is_rendered_as_its_release_yaml_with_its_images_at_the_release():
    values = cert_manager_install("v1.21.2", "r:5000").values
    assert values["crds"] == {"enabled": True} and values["startupapicheck"]["enabled"] is False
    assert {values["image"]["tag"], values["webhook"]["image"]["tag"], values["cainjector"]["image"]["tag"],
            values["acmesolver"]["image"]["tag"]} == {"v1.21.2"}
    assert values["imageRegistry"] == "r:5000"  # the ACME solver's image too, an argument of the controller


def local_config(**platform):
    values = render.stack_values(REPO_ROOT / "Pulumi.local.yaml", platform=platform)
    return parse_stack_config(from_pulumi_values(values))


def test_an_artifact_directory_must_hold_every_artifact_the_stack_installs(tmp_path):
    config = local_config(artifactDirectory=str(tmp_path))
    wanted = [install.artifact for install in installed_artifacts(config)]
    assert wanted == ["kustomize/trainer-v2.3.0", "charts/kueue-0.19.2.tgz",
                      "kustomize/argo-workflows-v4.1.2",
                      "charts/cert-manager-v1.21.2.tgz", "charts/kserve-crd-v0.20.0.tgz",
                      "charts/kserve-resources-v0.20.0.tgz", "charts/kserve-runtime-configs-v0.20.0.tgz"]
    assert missing_artifacts(config) == wanted
    (tmp_path / "charts").mkdir()
    (tmp_path / "charts" / "kueue-0.19.2.tgz").write_bytes(b"")
    assert "charts/kueue-0.19.2.tgz" not in missing_artifacts(config)
    # With an OCI chart mirror, only the kustomizations are the directory's.
    mirrored_charts = local_config(artifactDirectory=str(tmp_path), chartMirror="oci://harbor.example/charts")
    assert missing_artifacts(mirrored_charts) == ["kustomize/trainer-v2.3.0",
                                                  "kustomize/argo-workflows-v4.1.2"]
    assert missing_artifacts(local_config()) == []


def test_a_missing_artifact_fails_the_program_naming_each(tmp_path):
    values = render.stack_values(REPO_ROOT / "Pulumi.local.yaml",
                                 platform={"artifactDirectory": str(tmp_path)})
    said = config_error_before_any_resource("local", values)
    assert said.startswith(f"stack config: platform.artifactDirectory: {tmp_path} lacks "
                           "kustomize/trainer-v2.3.0, charts/kueue-0.19.2.tgz, "), said
    assert said.endswith("(docs/guides/air-gapped.md says what goes there)"), said


def test_the_artifact_list_says_how_to_fetch_each_piece(capsys):
    artifacts.main(["--stack", "local", "--directory", "/srv/a"])
    out = capsys.readouterr().out
    assert "helm pull oci://registry.k8s.io/kueue/charts/kueue --version 0.19.2 -d /srv/a/charts" in out
    assert ("helm pull cert-manager --repo https://charts.jetstack.io --version v1.21.2 "
            "-d /srv/a/charts") in out
    assert ("git clone --depth 1 --branch v4.1.2 https://github.com/argoproj/argo-workflows "
            "/srv/a/kustomize/argo-workflows-v4.1.2") in out
    # Trainer's overlay names JobSet's release by URL: fetched beside it, and named there.
    assert "manifests/third-party/jobset/manifests.yaml" in out and "sed -i" in out


def test_the_platform_sources_settings_are_checked():
    with pytest.raises(Exception, match="platform.chartMirror: must be an OCI repository"):
        local_config(chartMirror="https://harbor.example/charts")
    with pytest.raises(Exception, match="platform.imageMirror: must be a registry"):
        local_config(imageMirror="https://harbor.example")
    config = local_config(controllerRequests={"cpu": "50m"})
    assert config.platform.controller_requests.as_requests() == {"cpu": "50m"}
    assert json.loads(json.dumps(config.platform.sources(REPO_ROOT).__dict__))["directory"] is None
