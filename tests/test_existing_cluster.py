"""cluster.kind existing: a cluster the user already has, reached by a kubeconfig's context. Its stack
renders under Pulumi's mocks with every object valid, no command provider (so `pulumi up` needs no
kubectl), the Gateway API's CRDs read rather than waited for, and the images as the user pushed them or
as the stack pushes them; its config errors name their keys. The control-plane tier's end-to-end run
applies such a stack for real (tests/e2e_node/)."""

from __future__ import annotations

import json

import pytest
from conftest import REPO_ROOT
from stack_checks import objects_of, rendered_stack, validate_all, workflow_namespace

from common.cluster_target import KUBERNETES_MINOR
from infra import preflight
from pipeline.validation import ConfigError
from stacks import render
from stacks.compose import cluster_prometheus
from stacks.config import from_pulumi_values, parse_stack_config

PUSHED = {"trainer": "registry.example:5000/dist-ml/trainer@sha256:" + "1" * 64,
          "serving": "registry.example:5000/dist-ml/serving@sha256:" + "2" * 64,
          "trackingServer": "registry.example:5000/dist-ml/tracking-server@sha256:" + "3" * 64}
CLUSTER = {"kind": "existing", "context": "kind-dist-ml", "gatewayClass": "eg"}


def values(cluster: dict | None = None, images: dict | None = None, **sections: dict) -> dict[str, str]:
    """Pulumi.local.yaml's pipeline and serving sections, on a cluster the user has."""
    local = render.pulumi_values(REPO_ROOT / "Pulumi.local.yaml")
    found = {key: local[key] for key in ("dist-ml:pipeline", "dist-ml:serving", "dist-ml:platform")}
    found["dist-ml:cluster"] = json.dumps(CLUSTER if cluster is None else cluster)
    found["dist-ml:images"] = json.dumps(PUSHED if images is None else images)
    for section, value in sections.items():
        found[f"dist-ml:{section}"] = json.dumps(value)
    return found


@pytest.fixture(scope="module")
def existing() -> render.Rendered:
    return rendered_stack("existing", values())


def test_the_stack_renders_valid_with_the_pushed_images_and_no_command(existing, validate_crd):
    assert validate_all(existing, validate_crd, "v4", KUBERNETES_MINOR) >= 15
    assert not existing.of_type("command:local:Command")
    (provider,) = [r for r in existing.of_type("pulumi:providers:kubernetes")]
    assert provider.inputs["context"] == "kind-dist-ml" and "kubeconfig" not in provider.inputs
    (tracking,) = [o for o in objects_of(existing, "Deployment") if "mlflow" in json.dumps(o)]
    images = {c["image"] for c in tracking["spec"]["template"]["spec"]["containers"]}
    assert PUSHED["trackingServer"] in images
    assert existing.outputs["kubeContext"] == "kind-dist-ml" and "kubeconfig" not in existing.outputs
    (gateway,) = objects_of(existing, "Gateway")
    assert gateway["spec"]["gatewayClassName"] == "eg"
    # The cluster's own Gateway API CRDs, read (a missing one fails naming it), not waited for.
    reads = {r.name for r in existing.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")}
    assert reads == {"gateway-crd-gateways", "gateway-crd-httproutes"}


def test_the_stack_builds_and_pushes_the_images_to_a_registry_when_asked():
    rendered = rendered_stack("existing", values(images={"registry": "registry.example:5000/team"}))
    builds = rendered.of_type(render.IMAGE_BUILD)
    assert len(builds) == 3 and all(build.inputs["push"] for build in builds)
    assert all(build.inputs["tags"][0].startswith("registry.example:5000/team/dist-ml/") for build in builds)


@pytest.mark.parametrize("cluster, images, message", [
    ({"kind": "existing", "gatewayClass": "eg"}, PUSHED, "cluster.context: "),
    ({"kind": "existing", "context": "c"}, PUSHED, "cluster.gatewayClass: "),
    (CLUSTER, {"trainer": PUSHED["trainer"]}, "images.serving: needs the images you pushed"),
    (CLUSTER, {**PUSHED, "registry": "registry.example"}, "images.trainer: names an image you pushed, and "
                                                          "images.registry has the stack build them"),
    (CLUSTER, {**PUSHED, "baseImage": "mirror.example/python:3.11-slim"},
     "images.baseImage: applies only when the stack builds the images"),
    ({**CLUSTER, "nodePools": {}}, PUSHED, "cluster.nodePools: does not apply to cluster.kind existing"),
])
def test_bad_config_names_its_key(cluster, images, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_stack_config(from_pulumi_values(values(cluster, images)))


def test_the_other_kinds_refuse_the_images_of_an_existing_cluster():
    local = render.stack_values(REPO_ROOT / "Pulumi.local.yaml", images={"trainer": PUSHED["trainer"]})
    with pytest.raises(ConfigError, match="images.trainer: applies only to cluster.kind existing"):
        parse_stack_config(from_pulumi_values(local))


def test_the_clusters_own_prometheus_installs_no_chart_and_is_where_keda_reads():
    url = "http://prometheus-operated.monitoring.svc:9090"
    monitoring = {"enabled": True, "prometheusUrl": url}
    serving = {**json.loads(values()["dist-ml:serving"]), "autoscaling": {"metric": "inflight"}}
    rendered = rendered_stack("existing", values(monitoring=monitoring, serving=serving))
    assert not [r for r in rendered.of_type("kubernetes:helm.sh/v4:Chart")
                if r.inputs["chart"] == "kube-prometheus-stack"]
    assert cluster_prometheus(parse_stack_config(from_pulumi_values(values(monitoring=monitoring,
                                                                             serving=serving)))) == url
    (dashboard,) = [o for o in objects_of(rendered, "ConfigMap")
                    if o["metadata"]["name"] == "dist-ml-dashboard"]
    # In the stack's namespace, where the cluster's Grafana finds it.
    assert dashboard["metadata"]["namespace"] == workflow_namespace(rendered)
    assert "grafana" not in rendered.outputs
    with pytest.raises(ConfigError, match="monitoring.prometheusUrl: names the Prometheus"):
        parse_stack_config(from_pulumi_values(values(monitoring={"enabled": False, "prometheusUrl": url})))


def test_preflight_for_an_existing_cluster_asks_for_pulumi_and_git_only():
    assert [tool.name for tool in preflight.TOOLS_BY_STACK["existing"]] == ["pulumi", "git"]
