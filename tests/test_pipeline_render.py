"""The Argo engine: the rendered objects validate against the upstream schemas and follow the config."""

from __future__ import annotations

import dataclasses

import kubernetes_validate
import pytest
import yaml
from conftest import run_module
from stack_checks import PUBLISHED_VERSION, STACK_NAMESPACE, WORKFLOW_NAME, embedded

from cluster_steps.inference_service import TF_SERVING_VERSION
from common import cluster_names
from common.cli import NEVER_SUCCEEDS_EXIT_CODE
from common.cluster_target import (
    KUBERNETES_MINOR,
    TRAINER_SERVICE_ACCOUNT,
    ClusterTarget,
    ImageMissing,
    Images,
    gcs_storage,
)
from engines.trainjob import TRAINING_QUEUE
from pipeline import argo
from pipeline.config import ConfigError, parse_config
from pipeline.definition import ingest_memo_key

ARGO_CRDS = {  # Argo release -> the directory of its full CRDs (testdata/pins.py)
    "v4.1.2": "argo-v4.1.2/",
    "v3.7.18": "",
}
CONFIG = {"pipeline": {"variants": ["cnn", "cnn_batchnorm"], "workers": 3, "epochs": 4}}
TFJOB_CONFIG = {"pipeline": {**CONFIG["pipeline"], "engine": "tfjob"}}
TRAINER_CRDS = "trainer-v2.3.0/trainer.kubeflow.org_"
NOT_NEVER = f"asInt(lastRetry.exitCode) != {NEVER_SUCCEEDS_EXIT_CODE}"  # Argo retries all but NeverSucceeds
TF_SERVING = {"runtime": "tensorflow", "autoscaling": {"metric": "cpu"}}  # no load metrics: CPU


def templates(template: dict) -> dict[str, dict]:
    return {t["name"]: t for t in template["spec"]["templates"]}


@pytest.mark.parametrize("argo_version", sorted(ARGO_CRDS))
@pytest.mark.parametrize("runtime", ["custom", "tensorflow"])
def test_every_rendered_object_validates_against_the_upstream_schemas(validate_crd, argo_version, runtime):
    canary = {"rollout": {"canaryPercent": 0 if runtime == "tensorflow" else 10}}
    config = parse_config({"pipeline": {**CONFIG["pipeline"], **canary},
                           "serving": TF_SERVING if runtime == "tensorflow" else {}})
    objects = argo.render_objects(config, ClusterTarget(argo_version=argo_version))
    crds = ARGO_CRDS[argo_version]
    template = objects["workflowtemplate.yaml"]
    assert validate_crd(f"{crds}argoproj.io_workflowtemplates.yaml", template) == []
    assert validate_crd(f"{crds}argoproj.io_workflows.yaml", objects["workflow.yaml"]) == []
    for variant in ("cnn", "cnn-batchnorm"):
        assert validate_crd(f"{TRAINER_CRDS}trainjobs.yaml", embedded(template, f"train-{variant}")) == []
    assert validate_crd(f"{TRAINER_CRDS}clustertrainingruntimes.yaml",
                        objects["clustertrainingruntime-dist-ml-tensorflow.yaml"]) == []
    assert validate_crd("serving.kserve.io_inferenceservices.yaml", embedded(template, "serve")) == []
    kubernetes_validate.validate(objects["memoize-cache.yaml"], KUBERNETES_MINOR, strict=True)
    tfjobs = argo.workflow_template(parse_config(TFJOB_CONFIG), ClusterTarget(argo_version=argo_version))
    for variant in ("cnn", "cnn-batchnorm"):
        assert validate_crd("kubeflow.org_tfjobs.yaml", embedded(tfjobs, f"train-{variant}")) == []


def test_the_validator_is_not_blind(validate_crd):
    template = argo.workflow_template(parse_config(CONFIG))
    template["spec"]["templates"][1]["memoize"]["maxAge"] = 24
    trainjob = embedded(template, "train-cnn")
    trainjob["spec"]["trainer"]["numNodes"] = "three"
    assert validate_crd("argo-v4.1.2/argoproj.io_workflowtemplates.yaml", template)
    assert validate_crd(f"{TRAINER_CRDS}trainjobs.yaml", trainjob)
    tfjob = embedded(argo.workflow_template(parse_config(TFJOB_CONFIG)), "train-cnn")
    tfjob["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "three"
    assert validate_crd("kubeflow.org_tfjobs.yaml", tfjob)


def test_the_dag_runs_ingest_then_each_variant_in_parallel_then_select_then_serve():
    template = argo.workflow_template(parse_config(CONFIG))
    tasks = {t["name"]: t.get("depends") for t in templates(template)["pipeline"]["dag"]["tasks"]}
    assert tasks == {"ingest": None, "train-cnn": "ingest", "train-cnn-batchnorm": "ingest",
                     "select": "train-cnn && train-cnn-batchnorm", "serve": "select",
                     "rollout": "serve"}


def test_trainjobs_follow_the_config_on_our_runtime_in_kueues_queue():
    config = parse_config(CONFIG)
    objects = argo.render_objects(config)
    template = objects["workflowtemplate.yaml"]
    train = templates(template)["train-cnn-batchnorm"]
    assert train["container"]["command"] == ["python", "-m", cluster_names.TRAIN_STEP_MODULE]
    assert train["retryStrategy"] == {"limit": str(config.retries), "retryPolicy": "OnFailure",
                                      "expression": NOT_NEVER}
    trainjob = embedded(template, "train-cnn-batchnorm")
    assert trainjob["metadata"]["name"] == f"{WORKFLOW_NAME}-train-cnn-batchnorm"
    assert trainjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == TRAINING_QUEUE
    (owner,) = trainjob["metadata"]["ownerReferences"]  # deleting the workflow deletes the job
    assert (owner["kind"], owner["name"]) == ("Workflow", WORKFLOW_NAME)
    runtime = objects["clustertrainingruntime-dist-ml-tensorflow.yaml"]
    reference = {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                 "name": runtime["metadata"]["name"]}
    assert trainjob["spec"]["runtimeRef"] == reference
    trainer = trainjob["spec"]["trainer"]
    assert trainer["numNodes"] == 3 and {"name": "DIST_ML_NUM_NODES", "value": "3"} in trainer["env"]
    command = trainer["command"]
    assert command[:3] == ["python", "-m", "trainer.train"]
    assert command[command.index("--model") + 1] == "cnn_batchnorm"
    assert command[command.index("--epochs") + 1] == "4"
    assert trainer["resourcesPerNode"] == config.trainer_resources.as_manifest()
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["failurePolicy"]["maxRestarts"] == config.retries  # then the step's retry
    (node,) = jobset["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["volumeMounts"] == [{"name": "storage", "mountPath": "/mnt/dist-ml"}]
    # Its own identity: the workflow's pods may create TrainJobs and InferenceServices, training may not.
    assert pod["serviceAccountName"] == TRAINER_SERVICE_ACCOUNT
    assert TRAINER_SERVICE_ACCOUNT != template["spec"]["serviceAccountName"]


def test_tfjobs_follow_the_config():
    config = parse_config(TFJOB_CONFIG)
    template = argo.workflow_template(config)
    train = templates(template)["train-cnn-batchnorm"]
    assert train["container"]["command"] == ["python", "-m", cluster_names.TRAIN_STEP_MODULE]
    assert train["retryStrategy"] == {"limit": str(config.retries), "retryPolicy": "OnFailure",
                                      "expression": NOT_NEVER}
    timeout = train["container"]["args"][train["container"]["args"].index("--timeout-seconds") + 1]
    assert int(timeout) == config.train_timeout_seconds < train["activeDeadlineSeconds"]
    tfjob = embedded(template, "train-cnn-batchnorm")
    assert tfjob["metadata"]["name"] == f"{WORKFLOW_NAME}-train-cnn-batchnorm"
    (owner,) = tfjob["metadata"]["ownerReferences"]  # deleting the workflow deletes the job
    assert (owner["kind"], owner["name"]) == ("Workflow", WORKFLOW_NAME)
    assert owner["apiVersion"] == argo.API_VERSION
    assert tfjob["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3 and worker["restartPolicy"] == "OnFailure"
    pod = worker["template"]
    assert pod["metadata"]["labels"]["workflows.argoproj.io/workflow"] == WORKFLOW_NAME
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "tensorflow"
    command = container["command"]
    assert command[:3] == ["python", "-m", "trainer.train"]
    assert command[command.index("--model") + 1] == "cnn_batchnorm"
    assert command[command.index("--epochs") + 1] == "4"
    assert container["volumeMounts"] == [{"name": "storage", "mountPath": "/mnt/dist-ml"}]
    # Its own identity: the workflow's pods may create TFJobs and InferenceServices, training may not.
    assert pod["spec"]["serviceAccountName"] == TRAINER_SERVICE_ACCOUNT
    assert TRAINER_SERVICE_ACCOUNT != template["spec"]["serviceAccountName"]


def test_a_training_pod_given_gpus_needs_the_gpu_trainer_image():
    config = parse_config(CONFIG)
    gpus = ClusterTarget(training_gpus=1)
    with pytest.raises(ImageMissing, match="^step train-cnn: its pods are given GPUs, which need the GPU "
                                           "trainer image, and the cluster target has none$"):
        argo.workflow_template(config, gpus)
    target = dataclasses.replace(gpus, images=Images(trainer_gpu="dist-ml/trainer-gpu:1"))
    objects = argo.render_objects(config, target)
    template = objects["workflowtemplate.yaml"]
    trainer = embedded(template, "train-cnn")["spec"]["trainer"]
    assert trainer["image"] == "dist-ml/trainer-gpu:1" and trainer["command"][-2:] == ["--gpus", "1"]
    (node,) = objects["clustertrainingruntime-dist-ml-tensorflow.yaml"]["spec"]["template"]["spec"][
        "replicatedJobs"]
    assert node["template"]["spec"]["template"]["spec"]["containers"][0]["image"] == "dist-ml/trainer-gpu:1"
    assert templates(template)["ingest"]["container"]["image"] == Images().trainer
    (worker,) = embedded(argo.workflow_template(parse_config(TFJOB_CONFIG), target), "train-cnn")["spec"][
        "tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert worker["image"] == "dist-ml/trainer-gpu:1" and worker["command"][-2:] == ["--gpus", "1"]


def test_ingest_is_memoized_on_the_data_source_and_checksums():
    config = parse_config(CONFIG)
    ingest = templates(argo.workflow_template(config))["ingest"]
    assert ingest["memoize"]["key"] == ingest_memo_key(config)
    assert ingest["memoize"]["maxAge"] == "24h"
    assert ingest["memoize"]["cache"]["configMap"]["name"] == argo.memo_cache()["metadata"]["name"]
    assert argo.memo_cache()["metadata"]["labels"]["workflows.argoproj.io/configmap-type"] == "Cache"
    # A memo hit of a template with a retryStrategy leaves the run Running for ever (Argo v4.0.5; the
    # tier's end-to-end run found it): ingest is memoized, not retried.
    assert "retryStrategy" not in ingest
    # Argo's controller reads and writes the cache in its own namespace, whatever the workflow's.
    assert argo.memo_cache()["metadata"]["namespace"] == argo.ARGO_NAMESPACE == "argo"
    other_source = parse_config({"pipeline": {"dataSource": "https://mirror.example/fmnist/"}})
    assert ingest_memo_key(other_source) != ingest_memo_key(config)


def test_serve_rolls_out_the_version_select_published_and_autoscales_from_config():
    config = parse_config({"serving": {"minReplicas": 2, "maxReplicas": 6,
                                       "autoscaling": {"metric": "memory", "target": 70}}})
    template = argo.workflow_template(config)
    select, serve = templates(template)["select"], templates(template)["serve"]
    # select writes the version it published where Argo reads its output...
    command = select["container"]["command"]
    written = command[command.index("--published-version-file") + 1]
    (output,) = select["outputs"]["parameters"]
    assert output == {"name": "version", "valueFrom": {"path": written}}
    # ...and the DAG hands it to serve, which rolls the InferenceService out to it and waits.
    (task,) = [t for t in templates(template)["pipeline"]["dag"]["tasks"] if t["name"] == "serve"]
    assert task["arguments"]["parameters"] == [
        {"name": "version", "value": "{{tasks.select.outputs.parameters.version}}"}]
    assert serve["inputs"]["parameters"] == [{"name": "version"}]
    assert serve["container"]["command"] == ["python", "-m", "cluster_steps.release"]
    args = serve["container"]["args"]
    assert args[0] == "deploy"
    assert args[args.index("--canary-percent") + 1] == str(config.rollout.canary_percent)
    assert args[args.index("--namespace") + 1] == "{{workflow.namespace}}"
    assert 0 < float(args[args.index("--timeout-seconds") + 1]) < serve["activeDeadlineSeconds"]
    assert serve["retryStrategy"]["limit"] == str(config.retries)
    isvc = embedded(template, "serve")
    assert isvc["metadata"]["annotations"]["dist-ml/model-version"] == PUBLISHED_VERSION
    predictor = isvc["spec"]["predictor"]
    assert {k: predictor[k] for k in ("minReplicas", "maxReplicas", "scaleMetric", "scaleTarget")} == {
        "minReplicas": 2, "maxReplicas": 6, "scaleMetric": "memory", "scaleTarget": 70}
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "hpa"
    assert "autoScaling" not in predictor
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"
    # One version, the run's: a release holding only <version>/, served as a TF-Serving base path.
    release = f"pvc://dist-ml-storage/releases/fmnist/{PUBLISHED_VERSION}"
    assert {"name": "STORAGE_URI", "value": release} in container["env"]
    assert container["args"][:4] == ["--model-base-path", "/mnt/models", "--model-name", "fmnist"]


TF_SERVING_NO_CANARY = {"rollout": {"canaryPercent": 0}}  # TF Serving serves no /metrics to judge one on


def test_the_tensorflow_runtime_serves_the_release_with_a_pinned_tf_serving():
    config = parse_config({"pipeline": TF_SERVING_NO_CANARY, "serving": TF_SERVING})
    target = ClusterTarget(storage=gcs_storage("bucket-1"))
    model = embedded(argo.workflow_template(config, target), "serve")["spec"]["predictor"]["model"]
    # KServe v0.20's default (2.6.2) predates the TensorFlow that writes the export.
    assert model["modelFormat"] == {"name": "tensorflow"} and model["runtimeVersion"] == TF_SERVING_VERSION
    assert model["storageUri"] == f"gs://bucket-1/releases/fmnist/{PUBLISHED_VERSION}"
    chosen = parse_config({"pipeline": TF_SERVING_NO_CANARY,
                           "serving": {**TF_SERVING, "runtimeVersion": "2.22.1"}})
    assert embedded(argo.workflow_template(chosen), "serve")["spec"]["predictor"]["model"][
        "runtimeVersion"] == "2.22.1"


def test_render_writes_one_file_per_object(tmp_path):
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(CONFIG))
    result = run_module("pipeline", "render", "--out", tmp_path / "out", "--config", config_file)
    assert result.returncode == 0, result.stderr
    kinds = {path.name: yaml.safe_load(path.read_text())["kind"] for path in (tmp_path / "out").iterdir()}
    assert kinds == {"workflowtemplate.yaml": "WorkflowTemplate", "workflow.yaml": "Workflow",
                     "memoize-cache.yaml": "ConfigMap",
                     "clustertrainingruntime-dist-ml-tensorflow.yaml": "ClusterTrainingRuntime"}
    workflow = yaml.safe_load((tmp_path / "out" / "workflow.yaml").read_text())
    assert workflow["spec"]["workflowTemplateRef"]["name"] == argo.WORKFLOW_TEMPLATE_NAME


@pytest.mark.parametrize(("metric", "series"), [("inflight", "dist_ml_requests_in_flight"),
                                                ("rps", "dist_ml_requests_total")])
def test_by_default_the_predictor_scales_on_its_own_load_through_keda(metric, series):
    """KServe's keda class with one External metric: the query sums this InferenceService's pods'
    series in the workflow's namespace, read from the Prometheus the target names; the target is per
    replica, the scale-down window from config."""
    config = parse_config({"serving": {"minReplicas": 2, "maxReplicas": 7, "autoscaling": {
        "metric": metric, "target": 6, "scaleDownStabilization": "10m"}}})
    target = ClusterTarget(prometheus_url="http://prometheus.example:9090")
    isvc = embedded(argo.workflow_template(config, target), "serve")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "keda"
    predictor = isvc["spec"]["predictor"]
    assert "scaleMetric" not in predictor and "scaleTarget" not in predictor  # KServe refuses them with keda
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 7)
    (external,) = [m["external"] for m in predictor["autoScaling"]["metrics"] if m["type"] == "External"]
    assert external["metric"]["backend"] == "prometheus"
    assert external["metric"]["serverAddress"] == "http://prometheus.example:9090"
    query = external["metric"]["query"]
    assert query.startswith("sum(") and series in query
    assert f'namespace="{STACK_NAMESPACE}"' in query
    assert 'serving_kserve_io_inferenceservice="fmnist"' in query
    assert external["target"] == {"type": "Value", "value": "6"}
    assert predictor["autoScaling"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}


def test_without_a_prometheus_a_load_metric_cannot_be_rendered():
    with pytest.raises(ConfigError, match="^serving.autoscaling.metric: inflight is read from Prometheus"):
        argo.workflow_template(parse_config({}), ClusterTarget(prometheus_url=None))
    isvc = embedded(argo.workflow_template(parse_config({"serving": {"autoscaling": {"metric": "cpu"}}}),
                                           ClusterTarget(prometheus_url=None)), "serve")
    assert isvc["spec"]["predictor"]["scaleMetric"] == "cpu"


def test_render_takes_the_clusters_prometheus(tmp_path):
    result = run_module("pipeline", "render", "--out", tmp_path, "--prometheus-url", "http://prom.obs:9090")
    assert result.returncode == 0, result.stderr
    template = yaml.safe_load((tmp_path / "workflowtemplate.yaml").read_text())
    (metric,) = embedded(template, "serve")["spec"]["predictor"]["autoScaling"]["metrics"]
    external = metric["external"]
    assert external["metric"]["serverAddress"] == "http://prom.obs:9090"


def test_render_refuses_a_canary_tf_serving_cannot_be_judged_on_in_one_line(tmp_path):
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump({"pipeline": {"rollout": {"canaryPercent": 10}},
                                           "serving": TF_SERVING}))
    result = run_module("pipeline", "render", "--out", tmp_path / "out", "--config", config_file)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "pipeline.rollout.canaryPercent" in result.stderr, result.stderr
    assert not any((tmp_path / "out").glob("*"))


def test_the_rollout_step_judges_the_version_serve_deployed_within_bounded_waits():
    config = parse_config({"pipeline": {"rollout": {"canaryPercent": 20, "minRequests": 500, "maxWait": "15m",
                                                    "maxErrorRateIncrease": 0.02, "maxLatencyRatio": 2}}})
    template = argo.workflow_template(config)
    serve, step = templates(template)["serve"], templates(template)["rollout"]
    # serve outputs the version it deployed, where it writes it; the DAG hands it to the rollout step.
    serve_args = serve["container"]["args"]
    assert serve["outputs"]["parameters"] == [
        {"name": "version", "valueFrom": {"path": serve_args[serve_args.index("--version-file") + 1]}}]
    (task,) = [t for t in templates(template)["pipeline"]["dag"]["tasks"] if t["name"] == "rollout"]
    assert task["arguments"]["parameters"] == [
        {"name": "version", "value": "{{tasks.serve.outputs.parameters.version}}"}]
    assert serve_args[serve_args.index("--canary-percent") + 1] == "20"
    args = step["container"]["args"]
    flag = {name: args[args.index(name) + 1] for name in (
        "--min-requests", "--max-wait-seconds", "--max-error-rate-increase", "--max-latency-ratio",
        "--version", "--decision-file", "--timeout-seconds")}
    assert args[0] == "decide" and step["container"]["command"] == ["python", "-m", "cluster_steps.release"]
    assert (flag["--min-requests"], flag["--max-wait-seconds"], flag["--max-error-rate-increase"],
            float(flag["--max-latency-ratio"])) == ("500", "900", "0.02", 2.0)
    assert flag["--version"] == "{{inputs.parameters.version}}"
    # The decision and its numbers are the step's output; Argo keeps it with the workflow.
    assert step["outputs"]["parameters"] == [
        {"name": "decision", "valueFrom": {"path": flag["--decision-file"]}}]
    # Bounded: the wait for evidence plus a promotion's rollout fit within the step's deadline.
    assert 900 + float(flag["--timeout-seconds"]) < step["activeDeadlineSeconds"]


PS_CONFIG = {"pipeline": {"variants": ["cnn", "cnn_batchnorm"], "workers": 3, "parameterServers": 2,
                          "strategy": {"cnn": "parameter-server"}}}
PS_TFJOB_CONFIG = {"pipeline": {**PS_CONFIG["pipeline"], "engine": "tfjob"}}


def test_under_parameter_servers_a_trainjob_runs_on_the_ps_runtime_beside_the_synchronous_one(validate_crd):
    objects = argo.render_objects(parse_config(PS_CONFIG))
    template = objects["workflowtemplate.yaml"]
    runtimes = {name: o for name, o in objects.items() if o["kind"] == "ClusterTrainingRuntime"}
    assert set(runtimes) == {"clustertrainingruntime-dist-ml-tensorflow.yaml",
                             "clustertrainingruntime-dist-ml-tensorflow-ps.yaml"}
    for runtime in runtimes.values():
        assert validate_crd(f"{TRAINER_CRDS}clustertrainingruntimes.yaml", runtime) == []
    ps_runtime = runtimes["clustertrainingruntime-dist-ml-tensorflow-ps.yaml"]["spec"]["template"]["spec"]
    jobs = {job["name"]: job["template"]["spec"] for job in ps_runtime["replicatedJobs"]}
    assert (jobs["ps"]["parallelism"], jobs["ps"]["completions"]) == (2, 2)
    trainjob = embedded(template, "train-cnn")
    assert validate_crd(f"{TRAINER_CRDS}trainjobs.yaml", trainjob) == []
    assert trainjob["spec"]["runtimeRef"]["name"] == "dist-ml-tensorflow-ps"
    assert trainjob["spec"]["trainer"]["numNodes"] == 4  # the chief and 3 workers
    assert embedded(template, "train-cnn-batchnorm")["spec"]["runtimeRef"]["name"] == "dist-ml-tensorflow"


@pytest.mark.parametrize("argo_version", sorted(ARGO_CRDS))
def test_a_parameter_server_tfjob_validates_against_the_upstream_schemas(validate_crd, argo_version):
    template = argo.workflow_template(parse_config(PS_TFJOB_CONFIG), ClusterTarget(argo_version=argo_version))
    assert validate_crd(f"{ARGO_CRDS[argo_version]}argoproj.io_workflowtemplates.yaml", template) == []
    tfjob = embedded(template, "train-cnn")
    assert set(tfjob["spec"]["tfReplicaSpecs"]) == {"Chief", "Worker", "PS"}
    assert validate_crd("kubeflow.org_tfjobs.yaml", tfjob) == []


def test_a_parameter_server_tfjob_has_a_chief_workers_and_ps_and_ends_with_the_chief():
    template = argo.workflow_template(parse_config(PS_TFJOB_CONFIG))
    tfjob = embedded(template, "train-cnn")
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    assert {kind: spec["replicas"] for kind, spec in replicas.items()} == {"Chief": 1, "Worker": 3, "PS": 2}
    # A lost worker (or ps, or the chief) restarts in place; a failed pod would fail the job.
    assert {spec["restartPolicy"] for spec in replicas.values()} == {"OnFailure"}
    commands = {kind: spec["template"]["spec"]["containers"][0]["command"] for kind, spec in replicas.items()}
    assert commands["Chief"] == commands["Worker"] == commands["PS"]  # TF_CONFIG gives each its role
    # Done when the Chief is (successPolicy "", not AllWorkers: the workers never exit by themselves);
    # then the running workers and parameter servers are deleted.
    assert tfjob["spec"].get("successPolicy", "") == ""
    assert tfjob["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    # The synchronous variant beside it is unchanged: Workers only, pods kept.
    sync = embedded(template, "train-cnn-batchnorm")
    assert set(sync["spec"]["tfReplicaSpecs"]) == {"Worker"}
    assert sync["spec"]["runPolicy"]["cleanPodPolicy"] == "None"


