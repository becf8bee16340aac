"""The local stack under Pulumi mocks: every component, config flowing into the objects, every object
valid against the real schemas, the policies, and bad config stopping before any resource."""

from __future__ import annotations

import json

import pytest
import stack_checks
from conftest import REPO_ROOT, run_module
from stack_checks import config_error_before_any_resource, embedded, objects_of, rendered_stack, validate_all

from cluster_steps.inference_service import storage_uri
from common.cluster_target import K3S_IMAGE, KUBERNETES_MINOR, STORAGE_CLAIM_NAME
from pipeline.config import ConfigError
from stacks import policies, render
from stacks.config import parse_stack_config
from trainer import tracking

STACK_FILE = REPO_ROOT / "Pulumi.local.yaml"


def stack_values(**sections: dict) -> dict[str, str]:
    return stack_checks.stack_values(STACK_FILE, **sections)


@pytest.fixture(scope="module")
def default_stack() -> render.Rendered:
    return rendered_stack("local", render.pulumi_values(STACK_FILE))


def test_the_stack_files_kubernetes_version_is_the_one_validated_against():
    config = parse_stack_config(render.from_pulumi_values(render.pulumi_values(STACK_FILE)))
    assert config.cluster.kubernetes_version == KUBERNETES_MINOR


def test_the_graph_holds_every_component(default_stack):
    types = {resource.type for resource in default_stack.resources}
    for component in ("K3dCluster", "LocalImages", "Platform", "PvcStorage", "Pipeline", "Serving",
                      "TrackingServer"):
        assert f"dist-ml:infra:{component}" in types
    commands = [r.inputs["create"] for r in default_stack.of_type("command:local:Command")]
    assert any(c.startswith("k3d cluster create dist-ml --servers=1 --agents=0 "
                            f"--image={K3S_IMAGE}") for c in commands)
    assert sum("k3d image import dist-ml/" in c for c in commands) == 3  # trainer, serving, tracking server
    directories = {r.inputs["directory"] for r in default_stack.of_type("kubernetes:kustomize/v2:Directory")}
    # Trainer's overlay and Argo's cluster install, each from its repository at its tag (KEDA's only when
    # serving scales on load: tests/test_autoscaling.py).
    assert directories == {"https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0",
                           "https://github.com/argoproj/argo-workflows.git/manifests/cluster-install?ref=v4.1.2"}
    assert not default_stack.of_type("kubernetes:yaml/v2:ConfigFile")  # no release YAML: what modules hold
    charts = {r.inputs["chart"].rpartition("/")[2]: r.inputs for r in
              default_stack.of_type("kubernetes:helm.sh/v4:Chart")}
    assert set(charts) == {"cert-manager", "kserve-crd", "kserve-resources", "kserve-runtime-configs",
                           "kueue"}
    assert (charts["cert-manager"]["repositoryOpts"], charts["cert-manager"]["version"]) == (
        {"repo": "https://charts.jetstack.io"}, "v1.21.2")
    assert {charts[c]["version"] for c in ("kserve-crd", "kserve-resources", "kserve-runtime-configs")} == {
        "v0.20.0"}
    assert (charts["kueue"]["chart"], charts["kueue"]["version"]) == ("oci://registry.k8s.io/kueue/charts/kueue",
                                                                       "0.19.2")
    assert charts["kserve-resources"]["values"]["kserve"]["controller"]["deploymentMode"] == "Standard"
    kinds = {o["kind"] for o in default_stack.objects}
    assert {"PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
            "WorkflowTemplate", "Deployment", "Service", "ClusterTrainingRuntime", "ResourceFlavor",
            "ClusterQueue", "LocalQueue"} <= kinds
    assert "Workflow" not in kinds  # pipeline.runOnUp is false
    assert "InferenceService" not in kinds  # the pipeline's serve step owns it


def test_every_declared_object_validates_against_the_real_schemas(default_stack, validate_crd):
    assert validate_all(default_stack, validate_crd, "v4", KUBERNETES_MINOR) >= 15


def test_config_changes_the_objects(validate_crd):
    rendered = rendered_stack("local", stack_values(
        pipeline={"workers": 3, "variants": ["cnn"], "runOnUp": True},
        serving={"minReplicas": 2, "maxReplicas": 5, "autoscaling": {"metric": "cpu", "target": 50}},
        platform={"argoVersion": "v3.7.18", "kserveVersion": "v0.19.0", "trainerVersion": "v2.3.1",
                  "kueueVersion": "v0.19.3"},
        cluster={"trainingQuota": {"cpu": "3", "memory": "5Gi"}},
        storage={"size": "25Gi"},
    ))
    validate_all(rendered, validate_crd, "v3", KUBERNETES_MINOR)
    (template,) = objects_of(rendered, "WorkflowTemplate")
    trains = [t["name"] for t in template["spec"]["templates"] if t["name"].startswith("train-")]
    assert trains == ["train-cnn"]
    assert embedded(template, "train-cnn")["spec"]["trainer"]["numNodes"] == 3
    predictor = embedded(template, "serve")["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"], predictor["scaleTarget"]) == (2, 5, 50)
    charts = {r.inputs["chart"].rpartition("/")[2]: r.inputs["version"]
              for r in rendered.of_type("kubernetes:helm.sh/v4:Chart")}
    assert charts == {"cert-manager": "v1.21.2", "kserve-crd": "v0.19.0", "kserve-resources": "v0.19.0",
                      "kserve-runtime-configs": "v0.19.0", "kueue": "0.19.3"}
    directories = {r.inputs["directory"] for r in rendered.of_type("kubernetes:kustomize/v2:Directory")}
    assert directories == {"https://github.com/argoproj/argo-workflows.git/manifests/cluster-install?ref=v3.7.18",
                           "https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.1"}
    (queue,) = objects_of(rendered, "ClusterQueue")
    (quota,) = queue["spec"]["resourceGroups"][0]["flavors"]
    assert {r["name"]: r["nominalQuota"] for r in quota["resources"]} == {"cpu": "3", "memory": "5Gi"}
    claims = {claim["metadata"]["name"]: claim for claim in objects_of(rendered, "PersistentVolumeClaim")}
    assert claims[STORAGE_CLAIM_NAME]["spec"]["resources"]["requests"]["storage"] == "25Gi"
    (run,) = objects_of(rendered, "Workflow")
    assert run["spec"]["workflowTemplateRef"]["name"] == template["metadata"]["name"]


def test_kserve_runs_in_standard_mode_and_knative_is_not_offered():
    """Knative mode could not work here (locally built images are resolved on Docker Hub, and with
    Kourier the InferenceService's address names an Istio gateway), so it is not an option."""
    rendered = rendered_stack("local", render.pulumi_values(STACK_FILE))
    charts = {r.inputs["chart"].rpartition("/")[2]: r.inputs
              for r in rendered.of_type("kubernetes:helm.sh/v4:Chart")}
    assert charts["kserve-resources"]["values"]["kserve"]["controller"]["deploymentMode"] == "Standard"
    files = [r.inputs.get("file", "") for r in rendered.of_type("kubernetes:yaml/v2:ConfigFile")]
    assert not any("knative" in file for file in files)
    (template,) = objects_of(rendered, "WorkflowTemplate")
    isvc = embedded(template, "serve")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    assert "containerConcurrency" not in isvc["spec"]["predictor"]  # a Knative setting


def test_policies_hold_and_are_not_blind(default_stack):
    assert policies.violations(default_stack.objects) == []
    assert policies.secret_outputs(["kubeconfig"], default_stack.secret_outputs) == []
    bad = [
        {"kind": "ClusterRoleBinding", "metadata": {"name": "x"}, "roleRef": {"name": "cluster-admin"}},
        {"kind": "Deployment", "metadata": {"name": "y"}, "spec": {"template": {"spec": {"containers": [
            {"name": "c", "image": "busybox:latest", "resources": {"requests": {"cpu": "1"}}}]}}}},
    ]
    found = policies.violations(bad)
    assert any("binds cluster-admin" in v for v in found)
    assert any("no requests for memory" in v for v in found) and any("no limits for cpu" in v for v in found)
    assert any("busybox:latest is not pinned" in v for v in found)
    assert policies.secret_outputs(["kubeconfig"], set()) == ["stack output kubeconfig is not secret"]


def test_images_are_tagged_from_their_content(default_stack):
    (template,) = objects_of(default_stack, "WorkflowTemplate")
    isvc = embedded(template, "serve")
    assert embedded(template, "train-cnn")["spec"]["trainer"]["image"].startswith("dist-ml/trainer:")
    (runtime,) = objects_of(default_stack, "ClusterTrainingRuntime")
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    (container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("dist-ml/trainer:")
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert isvc["spec"]["predictor"]["containers"][0]["image"].startswith("dist-ml/serving:")


def test_the_tfjob_engine_installs_the_training_operator_instead_and_its_steps_create_tfjobs(validate_crd):
    platform = {"trainerVersion": None, "kueueVersion": None, "trainingOperatorVersion": "v1.9.3"}
    values = stack_values(pipeline={"engine": "tfjob"}, platform=platform, cluster={"trainingQuota": None})
    rendered = rendered_stack("local", values)
    validate_all(rendered, validate_crd, "v4", KUBERNETES_MINOR)
    directories = {r.inputs["directory"] for r in rendered.of_type("kubernetes:kustomize/v2:Directory")}
    assert "https://github.com/kubeflow/trainer.git/manifests/overlays/standalone?ref=v1.9.3" in directories
    assert not [r for r in rendered.of_type("kubernetes:helm.sh/v4:Chart") if "kueue" in r.inputs["chart"]]
    kinds = {o["kind"] for o in rendered.objects}
    assert not kinds & {"ClusterTrainingRuntime", "ResourceFlavor", "ClusterQueue", "LocalQueue"}
    (template,) = objects_of(rendered, "WorkflowTemplate")
    assert embedded(template, "train-cnn")["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 2


BAD_STACK_CONFIG = [
    ({"cluster": {"agents": 1}}, "cluster.agents: pods on several nodes share the storage volume"),
    ({"serving": {"scaleMetric": "cpu"}}, "serving.scaleMetric: replaced by serving.autoscaling.metric"),
    ({"serving": {"autoscaling": {"metric": "inflight"}}},
     "serving.autoscaling.metric: inflight is read from the stack's Prometheus, and monitoring.enabled "
     "is false"),
    ({"serving": {"containerConcurrency": 1}}, "serving.containerConcurrency: unknown setting"),
    ({"platform": {"kserveDeploymentMode": "Knative"}}, "platform.kserveDeploymentMode: unknown setting"),
    ({"pipeline": {"workers": 0}}, "pipeline.workers: must be an integer >= 1"),
    ({"pipeline": {"variants": ["vgg"]}}, "pipeline.variants: unknown variant 'vgg'"),
    ({"pipeline": {"storageRoot": "/data"}}, "pipeline.storageRoot: applies only to the local engine"),
    ({"serving": {"httpPort": 9000}}, "serving.httpPort: applies only to the local engine"),
    ({"pipeline": {"runOnUp": "yes"}}, "pipeline.runOnUp: must be true or false"),
    ({"platform": {"argoVersion": "v2.12.0"}}, "platform.argoVersion: must be an Argo Workflows release"),
    ({"platform": {"kserveVersion": "0.20"}}, "platform.kserveVersion: must be a release tag"),
    ({"cluster": {"k3sImage": "rancher/k3s:latest"}}, "cluster.k3sImage: must be a rancher/k3s image"),
    ({"cluster": {"kind": None}}, "cluster.kind: is required"),
    ({"images": {"baseImage": "Python 3.11"}}, "images.baseImage: must be an image reference"),
    ({"storage": {"accessMode": "ReadOnlyMany"}}, "storage.accessMode: must be one of"),
    ({"serving": {"runtime": "tensorflow"}},
     "pipeline.rollout.canaryPercent: must be 0 with serving.runtime tensorflow: TF Serving serves no"),
    ({"pipeline": {"engine": "kubeflow"}}, "pipeline.engine: must be one of trainjob, tfjob"),
    ({"platform": {"trainingOperatorVersion": "v1.9.4"}},
     "platform.trainingOperatorVersion: applies only to pipeline.engine tfjob, and this stack's is trainjob"),
    ({"pipeline": {"engine": "tfjob"}},
     "platform.trainerVersion: applies only to pipeline.engine trainjob, and this stack's is tfjob"),
    ({"cluster": {"trainingQuota": {"cpu": "2"}}}, "cluster.trainingQuota.memory: is required"),
    ({"pipeline": {"workers": 5}},
     "pipeline.workers: cnn's TrainJob asks for 2.5 CPU at once, more than cluster.trainingQuota holds (2)"),
    ({"serving": {"runtime": "tensorflow", "autoscaling": {"metric": "rps"}},
      "monitoring": {"enabled": True}},
     "serving.autoscaling.metric: rps is read from our server's metrics, and runtime tensorflow"),
]


@pytest.mark.parametrize(("changes", "message"), BAD_STACK_CONFIG,
                         ids=[m.split(":")[0] for _, m in BAD_STACK_CONFIG])
def test_bad_stack_config_fails_naming_the_key_before_any_resource(changes, message):
    values = stack_values(**{section: keys for section, keys in changes.items()})
    assert config_error_before_any_resource("local", values).startswith(f"stack config: {message}")


def test_an_unknown_key_is_an_error():
    with pytest.raises(ConfigError, match="^replicas: unknown setting"):
        parse_stack_config({"cluster": {"kind": "k3d"}, "replicas": 3})


def test_render_writes_one_file_per_object_and_a_summary(tmp_path):
    result = run_module("stacks.render", "--stack", "local", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    files = {path.name for path in tmp_path.iterdir()}
    assert {"workflowtemplate-dist-ml-dist-ml-pipeline.yaml", "configmap-argo-dist-ml-memoize.yaml",
            "persistentvolumeclaim-dist-ml-dist-ml-storage.yaml", "summary.txt"} <= files
    summary = (tmp_path / "summary.txt").read_text()
    assert "oci://ghcr.io/kserve/charts/kserve-resources" in summary and "v0.20.0" in summary
    assert "kubeconfig: [secret]" in summary
    assert "apiVersion: v1\nkind: Config" not in summary


def test_the_tracking_server_keeps_sqlite_on_a_volume_of_its_own_one_writer_at_a_time(default_stack):
    (server,) = [d for d in objects_of(default_stack, "Deployment") if d["metadata"]["name"] == "mlflow"]
    assert server["spec"]["replicas"] == 1 and server["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = server["spec"]["template"]["spec"]["containers"]
    args = {flag: container["args"][i + 1] for i, flag in enumerate(container["args"][:-1])
            if flag.startswith("--")}
    assert args["--backend-store-uri"] == "sqlite:////mlflow/mlflow.db"
    (migrate,) = server["spec"]["template"]["spec"]["initContainers"]  # before the server, on its volume
    assert migrate["command"] == ["mlflow", "db", "upgrade", args["--backend-store-uri"]]
    assert migrate["volumeMounts"] == container["volumeMounts"] and migrate["image"] == container["image"]
    claims = {c["metadata"]["name"]: c for c in objects_of(default_stack, "PersistentVolumeClaim")}
    assert claims["mlflow"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    (policy,) = objects_of(default_stack, "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": stack_checks.STACK_NAMESPACE}}}]
    off = rendered_stack("local", stack_values(pipeline={"tracking": {"enabled": False}}))
    assert not [d for d in objects_of(off, "Deployment") if d["metadata"]["name"] == "mlflow"]
    (template,) = objects_of(off, "WorkflowTemplate")
    assert "MLFLOW_TRACKING_URI" not in str(template)


def test_the_images_are_built_on_the_configured_base_else_on_their_dockerfiles_own(default_stack):
    def build_args(rendered: render.Rendered) -> list:
        return [resource.inputs.get("buildArgs") for resource in rendered.resources
                if resource.type == "docker-build:index:Image"]

    assert build_args(default_stack) == [None, None, None]
    mirror = "mirror.example/library/python:3.11-slim"
    on_mirror = rendered_stack("local", stack_values(images={"baseImage": mirror}))
    assert build_args(on_mirror) == [{"BASE_IMAGE": mirror}] * 3


def test_the_rollout_finds_the_version_select_registered_by_the_uri_it_serves(default_stack):
    """select registers a version under `<its --releases-uri>/<model>/<N>`; the serve step's
    InferenceService serves a storageUri, and the rollout's aliases follow the versions of that URI's
    repository (trainer.tracking.registered_versions): the two must name one repository."""
    (template,) = objects_of(default_stack, "WorkflowTemplate")
    argv = {t["name"]: t["container"].get("command", []) + t["container"].get("args", [])
            for t in template["spec"]["templates"] if "container" in t}
    select, serve = argv["select"], argv["serve"]
    releases = select[select.index("--releases-uri") + 1]
    manifest = json.loads(serve[serve.index("--manifest") + 1].replace("{{inputs.parameters.version}}", "7"))
    model = select[select.index("--model-name") + 1]
    assert storage_uri(manifest) == f"{releases}/{model}/7"
    assert tracking.repository_of(storage_uri(manifest)) == f"{releases}/{model}"
