"""The `restricted` Pod Security Standard: every pod the stacks and the workflow's steps create declares
it (common.pod_security, judged by the restricted-pods policy), Argo's executor and KServe's storage
initializer are given it, and the namespace that holds our pods enforces it on both stacks."""

from __future__ import annotations

import copy

import pytest
import stack_checks
import yaml
from conftest import REPO_ROOT
from stack_checks import objects_of, rendered_stack, workflow_namespace

from common import pod_security
from common.cluster_target import KUBERNETES_MINOR, ClusterTarget
from pipeline import argo
from pipeline.config import ConfigError, parse_config
from stacks import policies, render

PROJECT = "acme-ml-test"
PIPELINES = {  # the workflow's shapes whose pods differ
    "trainjob": {"pipeline": {"variants": ["cnn", "cnn_batchnorm"], "workers": 3}},
    "tfjob": {"pipeline": {"variants": ["cnn"], "engine": "tfjob"}},
    "parameter-servers": {"pipeline": {"variants": ["cnn"], "parameterServers": 2,
                                       "strategy": {"cnn": "parameter-server"}}},
    "tfjob-parameter-servers": {"pipeline": {"variants": ["cnn"], "engine": "tfjob", "parameterServers": 2,
                                             "strategy": {"cnn": "parameter-server"}}},
    "tf-serving": {"pipeline": {"variants": ["cnn"], "rollout": {"canaryPercent": 0}},
                   "serving": {"runtime": "tensorflow", "autoscaling": {"metric": "cpu"}}},
}


@pytest.fixture(scope="module", params=["local", "gke"])
def stack(request) -> render.Rendered:
    values = render.pulumi_values(REPO_ROOT / f"Pulumi.{request.param}.yaml")
    if request.param == "gke":
        values["gcp:project"] = PROJECT
    return rendered_stack(request.param, values)


def pod_namespaces(rendered: render.Rendered) -> set[str]:
    """Where the stack's pods run: a namespaced object's own namespace; the pods of a cluster-scoped
    object (the training runtimes) and of the objects the workflow creates, the workflow's."""
    return {obj["metadata"].get("namespace", workflow_namespace(rendered))
            for obj in rendered.objects if any(True for _ in policies.pods(obj))}


def test_the_namespace_of_every_pod_of_ours_enforces_restricted_pinned_to_the_clusters_minor(stack):
    namespaces = {obj["metadata"]["name"]: obj for obj in objects_of(stack, "Namespace")}
    held = pod_namespaces(stack)
    assert held == {workflow_namespace(stack)}  # the system's: the controllers' namespaces hold none of ours
    for name in held:
        labels = namespaces[name]["metadata"].get("labels", {})
        assert labels[pod_security.ENFORCE_LABEL] == "restricted"
        assert labels[pod_security.ENFORCE_VERSION_LABEL] == f"v{KUBERNETES_MINOR}"


def test_every_pod_of_the_stack_meets_restricted(stack):
    """The tracking server, the request logger, the training runtime's pods, the workflow's step pods
    and the predictor the serve step rolls out."""
    where = [where for obj in stack.objects for where, _, _ in policies.pods(obj)]
    assert {where.split("/")[0] for where in where} == {
        "Deployment", "ClusterTrainingRuntime", "WorkflowTemplate"}
    assert any(".args.manifest.spec.predictor" in w for w in where)  # the serve step's InferenceService
    assert policies.restricted_pods(stack.objects) == []


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_every_pod_the_workflow_creates_meets_restricted(pipeline):
    objects = list(argo.render_objects(parse_config(PIPELINES[pipeline]), ClusterTarget()).values())
    assert sum(1 for obj in objects for _ in policies.pods(obj)) >= 3  # steps, training, predictor
    assert policies.restricted_pods(objects) == []


def test_the_pods_name_no_user_and_write_the_storage_volume_as_the_images_group():
    template = argo.workflow_template(parse_config(PIPELINES["trainjob"]))
    assert template["spec"]["securityContext"] == pod_security.pod_security_context(1000)
    assert "runAsUser" not in str(template)


def test_the_policy_is_not_blind():
    loose = {"kind": "Deployment", "metadata": {"name": "loose"}, "spec": {"template": {"spec": {
        "hostNetwork": True, "securityContext": {"runAsUser": 0},
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        "initContainers": [{"name": "init", "securityContext": {
            "privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}}],
        "containers": [{"name": "c"}]}}}}
    found = policies.restricted_pods([loose])
    pod = "Deployment/loose.spec.template.spec"
    assert found == [
        f"{pod}: runAsNonRoot is not true (on the pod, or on every container)",
        f"{pod}: no seccompProfile RuntimeDefault (on the pod, or on every container)",
        f"{pod}: names a user (runAsUser): the image's USER runs",
        f"{pod}: hostNetwork is true",
        f"{pod}: volume root: hostPath is not allowed",
        f"{pod}: {pod}.containers[0]: allowPrivilegeEscalation is not false",
        f"{pod}: {pod}.containers[0]: capabilities do not drop ALL",
        f"{pod}: {pod}.initContainers[0]: allowPrivilegeEscalation is not false",
        f"{pod}: {pod}.initContainers[0]: capabilities do not drop ALL",
        f"{pod}: {pod}.initContainers[0]: adds capabilities beyond NET_BIND_SERVICE",
        f"{pod}: {pod}.initContainers[0]: privileged",
    ]


def test_the_policy_sees_a_step_container_and_the_embedded_predictor_without_their_context():
    template = argo.workflow_template(parse_config(PIPELINES["trainjob"]))
    stripped = copy.deepcopy(template)
    (ingest,) = [t for t in stripped["spec"]["templates"] if t["name"] == "ingest"]
    del ingest["container"]["securityContext"]
    found = policies.restricted_pods([stripped])
    assert found == [f"WorkflowTemplate/dist-ml-pipeline.spec: WorkflowTemplate/dist-ml-pipeline.spec."
                     f"templates[{stripped['spec']['templates'].index(ingest)}].container: {why}"
                     for why in ("allowPrivilegeEscalation is not false", "capabilities do not drop ALL")]
    serve = stack_checks.embedded(template, "serve")
    del serve["spec"]["predictor"]["securityContext"]
    del serve["spec"]["predictor"]["containers"][0]["securityContext"]
    assert len(policies.restricted_pods([serve])) == 4


def test_argos_executor_runs_the_nonroot_image_under_the_restricted_context(stack):
    (patch,) = [obj for obj in objects_of(stack, "ConfigMap")
                if obj["metadata"]["name"] == argo.CONTROLLER_CONFIG_MAP]
    assert patch["metadata"]["namespace"] == argo.ARGO_NAMESPACE
    assert (stack.of_type("kubernetes:core/v1:ConfigMapPatch")[0].inputs["metadata"]["name"]
            == argo.CONTROLLER_CONFIG_MAP)
    executor = yaml.safe_load(patch["data"]["executor"])
    assert executor == {"image": "quay.io/argoproj/argoexec:v4.1.2-nonroot",
                        "securityContext": pod_security.container_security_context()}


def test_an_argo_without_a_nonroot_executor_image_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"platform.argoVersion v3.6.5: its executor image runs as root"):
        argo.executor_config("v3.6.5")
    assert argo.executor_config("v3.7.0")["image"].endswith(":v3.7.0-nonroot")


def test_kserves_storage_initializer_is_given_the_restricted_context(stack):
    (chart,) = [r for r in stack.of_type("kubernetes:helm.sh/v4:Chart")
                if r.inputs["chart"].endswith("/kserve-resources")]
    storage = chart.inputs["values"]["kserve"]["storage"]
    assert storage["containerSecurityContext"] == pod_security.container_security_context()


@pytest.mark.parametrize("version", ["v1.33", "1.33.4", "latest", "2.0"])
def test_a_kubernetes_version_other_than_a_minor_is_refused(version):
    with pytest.raises(ValueError, match="expected a minor like 1.35"):
        pod_security.enforcing_labels(version)
