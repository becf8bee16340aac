"""The end-to-end tier's pieces for `pulumi up`, without starting the tier (tests/e2e_node/ runs them for
real): the artifact directory filled from modules as releases package them, the stand-in for
cert-manager's issuing and CA injection, the runner's watch of the kubelet and its no-changes check."""

from __future__ import annotations

import base64
import datetime
import json
import tarfile

import pytest
import yaml
from cryptography import x509

from common.installs import ChartInstall, KustomizeInstall
from tools.control_plane import artifacts, cert_manager
from tools.control_plane.build import Built
from tools.control_plane.nodes.real import never_starts
from tools.control_plane.pulumi_stack import PulumiStack, Update, no_changes


def built(name: str, module_dir, version="v1.0.0", pinned="v1.0.0") -> Built:
    return Built(name, f"example.com/{name}", version, pinned, "x", str(module_dir), {})


def test_a_chart_is_packaged_from_its_module_with_the_release_its_tool_stamps(tmp_path):
    chart = tmp_path / "module" / "deploy" / "charts" / "cert-manager"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: cert-manager\nversion: v0.0.0\nappVersion: v0.0.0\n")
    (chart / "templates" / "a.yaml").write_text("kind: ConfigMap\n")
    install = ChartInstall("cert-manager", "cert-manager", "https://charts.jetstack.io", "v1.21.2", "cm", {})
    module = built("cert-manager", tmp_path / "module", "v1.21.2", "v1.21.2")
    provenance = artifacts.fill(tmp_path / "out", [install], {"cert-manager": module}, "kubectl")
    assert provenance["charts/cert-manager-v1.21.2.tgz"]["edits"] == ["Chart.yaml"]
    with tarfile.open(tmp_path / "out" / "charts" / "cert-manager-v1.21.2.tgz") as archive:
        names = sorted(archive.getnames())
        meta = yaml.safe_load(archive.extractfile("cert-manager/Chart.yaml"))
    assert names == ["cert-manager/Chart.yaml", "cert-manager/templates/a.yaml"]
    assert (meta["version"], meta["appVersion"]) == ("v1.21.2", "v1.21.2")
    assert json.loads((tmp_path / "out" / artifacts.PROVENANCE).read_text()) == provenance


def test_trainers_jobset_reference_is_made_local_with_jobsets_release_built_from_its_module(
        tmp_path, monkeypatch):
    trainer = tmp_path / "trainer" / "manifests" / "third-party" / "jobset"
    trainer.mkdir(parents=True)
    (trainer / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [
        "https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml"]}))
    release = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "jobset-system"}}]
    monkeypatch.setattr(artifacts, "kustomize", lambda kubectl, directory: release)
    install = KustomizeInstall("trainer", "https://github.com/kubeflow/trainer", "v2.3.0",
                               "manifests/overlays/manager")
    modules = {"trainer": built("trainer", tmp_path / "trainer", "v2.3.0", "v2.3.0"),
               "jobset": built("jobset", tmp_path / "jobset", "v0.12.0", "v0.12.0")}
    provenance = artifacts.fill(tmp_path / "out", [install], modules, "kubectl")
    copy = tmp_path / "out" / "kustomize" / "trainer-v2.3.0" / "manifests" / "third-party" / "jobset"
    assert yaml.safe_load((copy / "kustomization.yaml").read_text())["resources"] == ["manifests.yaml"]
    assert list(yaml.safe_load_all((copy / "manifests.yaml").read_text())) == release
    assert provenance["kustomize/trainer-v2.3.0"]["edits"] == [
        "third-party/jobset/kustomization.yaml", "third-party/jobset/manifests.yaml"]


def test_an_artifact_no_module_holds_is_named(tmp_path):
    install = ChartInstall("kube-prometheus-stack", "kube-prometheus-stack", "https://x", "80.4.1", "m", {})
    with pytest.raises(artifacts.NoModule, match="kube-prometheus-stack: no module of the tier's holds it"):
        artifacts.fill(tmp_path, [install], {}, "kubectl")


def test_the_stand_ins_certificate_is_self_signed_for_its_names():
    certificate = {"metadata": {"name": "serving-cert", "namespace": "kserve"},
                   "spec": {"dnsNames": ["kserve-webhook-server-service.kserve.svc"], "secretName": "s",
                            "issuerRef": {"name": "selfsigned-issuer"}}}
    cert_pem, _ = cert_manager.self_signed(certificate)
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.issuer == cert.subject  # its own CA: what a self-signed issuer makes
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["kserve-webhook-server-service.kserve.svc"]


def test_the_stand_in_injects_a_ca_where_cainjector_writes_it_and_only_when_it_differs():
    ca = base64.b64encode(b"ca").decode()
    webhook = {"kind": "ValidatingWebhookConfiguration", "webhooks": [
        {"name": "a", "clientConfig": {"service": {"name": "s"}}}]}
    assert cert_manager.with_ca_bundle(webhook, ca) == {"webhooks": [
        {"name": "a", "clientConfig": {"service": {"name": "s"}, "caBundle": ca}}]}
    injected = {**webhook, "webhooks": [{"name": "a", "clientConfig": {"caBundle": ca}}]}
    assert cert_manager.with_ca_bundle(injected, ca) is None
    crd = {"kind": "CustomResourceDefinition", "spec": {"conversion": {"webhook": {"clientConfig": {}}}}}
    assert cert_manager.with_ca_bundle(crd, ca) == {
        "spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": ca}}}}}
    assert cert_manager.with_ca_bundle({"kind": "CustomResourceDefinition", "spec": {}}, ca) is None
    assert cert_manager.with_ca_bundle({"kind": "APIService", "spec": {}}, ca) == {"spec": {"caBundle": ca}}


class Pods:
    def __init__(self, pods):
        self.pods = pods

    def list(self, api_version, kind, namespace=None):
        return self.pods


def pod(name: str, created: str, reason: str) -> dict:
    return {"metadata": {"name": name, "namespace": "kueue-system", "creationTimestamp": created},
            "status": {"containerStatuses": [{"name": "manager", "state": {"waiting": {
                "reason": reason, "message": f"{reason} words"}}}]}}


def test_the_watch_names_what_the_kubelet_says_never_of_the_updates_own_pods():
    since = datetime.datetime(2026, 11, 29, 1, 0, 0, tzinfo=datetime.timezone.utc)
    api = Pods([pod("old", "2026-11-29T00:59:59Z", "ErrImagePull"),  # an earlier update's: not this one's
                pod("new", "2026-11-29T01:00:00Z", "ErrImagePull"),
                pod("starting", "2026-11-29T01:00:03Z", "ContainerCreating")])
    assert never_starts(api, since=since) == [
        "pod kueue-system/new container manager: ErrImagePull: ErrImagePull words"]


def test_a_second_look_that_would_change_anything_fails_naming_it():
    no_changes(Update("up", {"same": 250, "read": 2}, 1.0), [])
    with pytest.raises(AssertionError,
                       match=r"would change 1 resources \(\{'replace': 1\}\): replace Secret s"):
        no_changes(Update("up", {"same": 250, "replace": 1}, 1.0), ["replace Secret s (data)"])


def test_the_engine_and_provider_keep_their_files_in_the_tiers_directory_and_reach_nothing_outside(tmp_path):
    """The provider writes a kubeconfig into the temporary directory at each start and never removes
    it: TMPDIR is the tier's. No plugin is downloaded and no update checked: a missing plugin fails."""
    env = PulumiStack(tmp_path, "pulumi", "pulumi-resource-kubernetes", "4.34.2", {}, api=None).env
    for key in ("PULUMI_HOME", "TMPDIR"):
        assert env[key].startswith(str(tmp_path)), key
    assert env["PULUMI_BACKEND_URL"] == f"file://{tmp_path / 'state'}"
    assert env["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] == env["PULUMI_SKIP_UPDATE_CHECK"] == "true"
