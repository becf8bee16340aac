"""Issue 24: a version change rolls the predictor without dropping a request. The rendered
InferenceService surges before it stops an old pod, counts a pod ready only once its model is loaded,
keeps a terminating pod serving until the endpoints and the Gateway have let it go, and gives it time
to finish its longest request; the route moves only once the new predictor serves."""

from __future__ import annotations

import pytest
import yaml
from conftest import run_module
from fastapi import FastAPI
from fastapi.testclient import TestClient
from kserve import Model
from kserve.errors import ModelNotReady, model_not_ready_handler
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.rest.v2_endpoints import register_v2_endpoints
from stack_checks import embedded
from test_release import NAMESPACE, FakeKServe, deploy_args, manifest, run, uri_of

from cluster_steps import inference_service as m
from cluster_steps import inference_service as shape
from common.cluster_target import ClusterTarget, gcs_storage
from pipeline import argo
from pipeline.config import parse_config
from serving import client

TARGETS = {"default": ClusterTarget(),
           "logger": ClusterTarget(storage=gcs_storage("bucket-1"), logger_url="http://logger.dist-ml")}


def rendered(runtime: str, target: ClusterTarget) -> dict:
    """The InferenceService the serve step rolls out, from the WorkflowTemplate."""
    pipeline = {"rollout": {"canaryPercent": 0}} if runtime == "tensorflow" else {}
    scaling = {"autoscaling": {"metric": "cpu"}} if runtime == "tensorflow" else {}  # no load metrics
    config = parse_config({"pipeline": pipeline, "serving": {"runtime": runtime, **scaling}})
    return embedded(argo.workflow_template(config, target), "serve")


def assert_drop_free_predictor(predictor: dict) -> None:
    assert predictor["deploymentStrategy"] == {"type": "RollingUpdate",
                                               "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    grace = predictor["terminationGracePeriodSeconds"]
    assert grace > m.PRESTOP_SLEEP_SECONDS + m.LONGEST_REQUEST_SECONDS


def assert_drop_free_server(predictor: dict) -> None:
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"
    # The probe asks the port the container serves HTTP on, for the model the server loads.
    (http,) = [p for p in container["ports"] if p["name"] == m.PREDICTOR_PORT_NAME]
    args = container["args"]
    assert args[args.index("--http-port") + 1] == str(http["containerPort"])
    probe = container["readinessProbe"]
    model_name = args[args.index("--model-name") + 1]
    assert probe["httpGet"] == {"path": f"/v2/models/{model_name}/ready", "port": http["containerPort"]}
    assert 0 < probe["periodSeconds"] <= 10 and probe["failureThreshold"] >= 2
    # A terminating pod keeps serving while it leaves the endpoints; the grace period covers the sleep.
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep == ["sleep", str(m.PRESTOP_SLEEP_SECONDS)]
    assert predictor["terminationGracePeriodSeconds"] > int(sleep[1]) + m.LONGEST_REQUEST_SECONDS


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_servers_predictor_rolls_without_dropping_a_request(validate_crd, target):
    isvc = rendered("custom", TARGETS[target])
    assert_drop_free_predictor(isvc["spec"]["predictor"])
    assert_drop_free_server(isvc["spec"]["predictor"])
    assert validate_crd("serving.kserve.io_inferenceservices.yaml", isvc) == []


def test_tf_servings_predictor_gets_what_kserve_sets_on_the_predictor(validate_crd):
    isvc = rendered("tensorflow", TARGETS["logger"])
    predictor = isvc["spec"]["predictor"]
    assert_drop_free_predictor(predictor)
    assert "containers" not in predictor  # the runtime's container is KServe's to probe
    assert validate_crd("serving.kserve.io_inferenceservices.yaml", isvc) == []


def test_the_rendered_workflow_template_carries_the_settings(tmp_path):
    result = run_module("pipeline", "render", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    template = yaml.safe_load((tmp_path / "workflowtemplate.yaml").read_text())
    predictor = embedded(template, "serve")["spec"]["predictor"]
    assert_drop_free_predictor(predictor)
    assert_drop_free_server(predictor)


def test_the_longest_request_is_the_clients_timeout():
    """The server sets no request timeout of its own: the client's is the longest a request lasts."""
    assert m.LONGEST_REQUEST_SECONDS >= client.TIMEOUT_SECONDS


def test_the_probed_route_answers_ready_only_once_the_model_is_loaded():
    """KServe's v2 route the probe asks (the one our server keeps): 503 before load, 200 after. Its
    /v2/health/ready would answer 200 either way."""
    model = Model("fmnist")
    repository = ModelRepository()
    repository.update(model)
    app = FastAPI()
    register_v2_endpoints(app, DataPlane(repository), None)
    app.add_exception_handler(ModelNotReady, model_not_ready_handler)
    http = TestClient(app)
    path = m.model_ready_path("fmnist")
    assert http.get(path).status_code == 503
    assert http.get("/v2/health/ready").status_code == 200
    model.ready = True
    assert http.get(path).status_code == 200


class RecordingKServe(FakeKServe):
    """Records, at each write to the route, whether each predictor it sends requests to serves the
    version of its InferenceService on every replica."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.at_route_writes: list[dict[str, bool]] = []

    def _record(self, manifest: dict) -> None:
        backends = [b["name"] for rule in manifest["spec"]["rules"] for b in rule.get("backendRefs", [])]
        self.at_route_writes.append({name: self._serves(name) for name in backends})

    def _serves(self, predictor: str) -> bool:
        isvc = predictor.removesuffix("-predictor")
        uri = shape.storage_uri(self.isvcs[isvc])
        status = self.get_deployment(NAMESPACE, predictor)["status"]
        return uri not in self.stuck and status["availableReplicas"] == status["replicas"]

    def create_http_route(self, namespace, manifest):
        self._record(manifest)
        super().create_http_route(namespace, manifest)

    def replace_http_route(self, namespace, name, manifest):
        self._record(manifest)
        super().replace_http_route(namespace, name, manifest)


@pytest.mark.parametrize("percent", [0, 10])
def test_the_route_moves_only_after_the_new_predictor_serves(percent):
    """deploy: roll_out waits for every replica of the new version, then route_to moves the weight."""
    cluster = RecordingKServe({"fmnist": manifest("2")}, route_percent=0)
    cluster.stuck[uri_of("3")] = None  # the new pods are starting: not available yet
    polls = []

    def meanwhile() -> None:
        polls.append(cluster.log[-1])
        if len(polls) == 3:
            del cluster.stuck[uri_of("3")]

    run(cluster, *deploy_args("3", percent=percent), meanwhile=meanwhile)
    assert len(polls) >= 3  # it waited through the polls where the new version did not serve
    assert not any(entry.startswith(("route", "create route")) for entry in polls)
    assert cluster.at_route_writes and all(all(w.values()) for w in cluster.at_route_writes)
    new_isvc = "fmnist" if percent == 0 else "fmnist-canary"
    assert shape.model_version(cluster.isvcs[new_isvc]) == "3"
