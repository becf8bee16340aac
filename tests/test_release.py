"""The cluster's rollout (cluster_steps.release): a version's InferenceService rolls out only when every
predictor replica runs it, fails with the reason when a pod cannot start, and gives up at its
timeout; the serve step deploys a new version as the canary behind a weighted HTTPRoute, and the
rollout step judges it on the predictors' metrics and promotes or rolls it back. Fake API servers
stand in for the cluster, answering as Kubernetes and KServe do."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from typing import Callable, Iterable, Iterator
from unittest import mock

import pytest
from conftest import REPO_ROOT, run_module
from mlflow import MlflowClient
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from cluster_steps import inference_service as shape
from cluster_steps import kubernetes
from cluster_steps import release as rollout
from cluster_steps.inference_service import SERVING_HTTP_PORT, inference_service
from common import cluster_names
from common import tracking_names as names
from common.cli import NEVER_SUCCEEDS_EXIT_CODE, NeverSucceeds
from common.cluster_names import GATEWAY_NAME
from common.cluster_target import PART_OF, ClusterTarget, gcs_storage
from engines import ENGINES
from pipeline import argo
from pipeline.config import parse_config
from serving import metrics
from serving.canary import Evidence
from trainer import tracking

NAMESPACE = "dist-ml"
OLD_URI, NEW_URI = "gs://bucket/releases/fmnist/2", "gs://bucket/releases/fmnist/3"


def manifest(version: str = "3") -> dict:
    target = ClusterTarget(storage=gcs_storage("bucket"))
    return inference_service(argo.predictor_spec(parse_config({}), target, version, NAMESPACE))


def deployment(uri: str, generation: int = 2, observed: int = 2, replicas: int = 2, updated: int = 2,
               total: int = 2, available: int = 2, conditions: list | None = None) -> dict:
    """The predictor's Deployment as the API server returns it; KServe writes the storage URI into
    its pod template (the storage initializer's source annotation)."""
    template = {"metadata": {"annotations": {
        "internal.serving.kserve.io/storage-initializer-sourceuri": uri}}, "spec": {"containers": []}}
    return {"metadata": {"name": "fmnist-predictor", "generation": generation},
            "spec": {"replicas": replicas, "template": template},
            "status": {"observedGeneration": observed, "replicas": total, "updatedReplicas": updated,
                       "availableReplicas": available, "conditions": conditions or []}}


def pod(uri: str, waiting: str | None = None, container: str = "storage-initializer",
        message: str = "", isvc: str = "fmnist") -> dict:
    statuses = [{"name": container, "state": {"waiting": {"reason": waiting, "message": message}}
                 if waiting else {"running": {}}}]
    key = "initContainerStatuses" if container == "storage-initializer" else "containerStatuses"
    return {"metadata": {"name": f"{isvc}-predictor-{uri[-1]}-abc",
                         "annotations": {"internal.serving.kserve.io/storage-initializer-sourceuri": uri}},
            "status": {key: statuses}}


class FakeCluster:
    """Answers each poll with the next (deployment, pods) state; records what was applied."""

    def __init__(self, states: list[tuple[dict | None, list[dict]]], existing: dict | None = None,
                 warnings: list[dict] | None = None):
        self.states, self.existing = list(states), existing
        self.created: list[dict] = []
        self.replaced: list[dict] = []
        self.warnings = warnings or []

    def list_warnings(self, namespace):
        return self.warnings

    def get_inference_service(self, namespace, name):
        return self.existing

    def create_inference_service(self, namespace, manifest):
        self.created.append(manifest)

    def replace_inference_service(self, namespace, name, manifest):
        self.replaced.append(manifest)

    def _state(self):
        return self.states[0] if len(self.states) == 1 else self.states.pop(0)

    def get_deployment(self, namespace, name):
        assert name == "fmnist-predictor"
        return self._state()[0]

    def list_pods(self, namespace, label_selector):
        assert label_selector == "serving.kserve.io/inferenceservice=fmnist"
        return self.states[0][1]


def roll(cluster: FakeCluster, timeout: float = 60.0) -> tuple[str, list[str]]:
    said, now = [], [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    reached = rollout.roll_out(cluster, NAMESPACE, manifest(), timeout,
                               rollout.Timing(5, lambda: now[0], sleep), say=said.append)
    return reached, said


def test_it_waits_through_a_rolling_update_until_every_replica_runs_the_new_version():
    cluster = FakeCluster([
        (None, []),  # KServe has not created the Deployment yet
        (deployment(OLD_URI, generation=1, observed=1), [pod(OLD_URI)]),  # nor updated it
        (deployment(NEW_URI, generation=2, observed=1), [pod(OLD_URI)]),
        (deployment(NEW_URI, updated=1, total=3), [pod(OLD_URI), pod(NEW_URI)]),
        (deployment(NEW_URI, updated=2, total=3), [pod(OLD_URI), pod(NEW_URI)]),  # old one terminating
        (deployment(NEW_URI, available=1), [pod(NEW_URI)]),
        (deployment(NEW_URI), [pod(NEW_URI)]),
    ], existing={"metadata": {"name": "fmnist", "resourceVersion": "41"}})
    reached, said = roll(cluster)
    assert reached == "2 of 2 replicas serve it"
    assert [line.removeprefix("rollout: waiting: ") for line in said[1:]] == [
        "the predictor's Deployment does not exist yet",
        "KServe has not yet updated the predictor's Deployment",
        "the Deployment controller has not yet seen the new pod template",
        "1 of 2 replicas run the new version",
        "1 replicas of an earlier version are still terminating",
        "1 of 2 new replicas are available",
    ]
    # An existing InferenceService is replaced with the run's spec, at the version it was read at.
    (replaced,) = cluster.replaced
    assert replaced["metadata"]["resourceVersion"] == "41" and cluster.created == []
    assert shape.storage_uri(replaced) == NEW_URI


def unhealthy(pod_name: str, message: str) -> dict:
    """The kubelet's event for a failed probe (pkg/kubelet/prober/prober.go)."""
    return {"type": "Warning", "reason": "Unhealthy", "message": message,
            "involvedObject": {"kind": "Pod", "name": pod_name}}


def test_a_predictor_whose_probe_path_does_not_exist_fails_the_step_with_the_kubelets_words():
    """A 404 on the readiness probe will never turn into a 200; a 503 (the model still loading) is
    waited for, and so is a missing path on an earlier version's pod."""
    new, old = pod(NEW_URI, container="kserve-container"), pod(OLD_URI)
    missing = "Readiness probe failed: HTTP probe failed with statuscode: 404"
    loading = unhealthy(new["metadata"]["name"], missing.replace("404", "503"))
    cluster = FakeCluster([(deployment(NEW_URI, available=0), [new, old])],
                          warnings=[loading, unhealthy(old["metadata"]["name"], missing)])
    with pytest.raises(rollout.RolloutFailed, match="not rolled out after 60 s") as waited:
        roll(cluster)
    assert not isinstance(waited.value, NeverSucceeds)  # a timeout: Argo's retry may see it served
    cluster.warnings.append(unhealthy(new["metadata"]["name"], missing))
    words = f"pod {new['metadata']['name']}: {missing} .*never be Ready"
    with pytest.raises(rollout.RolloutNeverSucceeds, match=words):
        roll(cluster)


def test_a_first_rollout_creates_the_inference_service():
    cluster = FakeCluster([(deployment(NEW_URI), [pod(NEW_URI)])])
    roll(cluster)
    assert [m["metadata"]["name"] for m in cluster.created] == ["fmnist"] and cluster.replaced == []


def test_a_stale_ready_status_of_the_previous_version_is_not_success():
    """The trap of KServe's status in Standard mode: everything looks ready, for the old version."""
    cluster = FakeCluster([(deployment(OLD_URI), [pod(OLD_URI)])])
    with pytest.raises(rollout.RolloutFailed, match="fmnist: not rolled out after 60 s: KServe has not yet"):
        roll(cluster)


@pytest.mark.parametrize(("waiting", "container"), [
    ("ImagePullBackOff", "kserve-container"), ("CrashLoopBackOff", "storage-initializer"),
    ("CrashLoopBackOff", "kserve-container"), ("CreateContainerConfigError", "kserve-container")])
def test_a_pod_of_the_new_version_that_cannot_start_fails_the_rollout_with_its_reason(waiting, container):
    cluster = FakeCluster([(deployment(NEW_URI, updated=1, total=3, available=2),
                            [pod(OLD_URI), pod(NEW_URI, waiting, container, "no such object: models/3")])])
    with pytest.raises(rollout.RolloutNeverSucceeds) as error:
        roll(cluster)
    assert str(error.value) == (f"pod fmnist-predictor-3-abc: container {container}: {waiting}: "
                                "no such object: models/3")


def test_a_predictor_that_will_never_serve_ends_the_step_with_the_code_argo_does_not_retry(capsys):
    """The serve step's exit code when the kubelet said the version will never serve: the step
    template's retryStrategy expression (pipeline/argo.py) refuses a retry on that code alone."""
    cluster = FakeCluster([(deployment(NEW_URI, available=0),
                            [pod(NEW_URI, "ImagePullBackOff", "kserve-container", "not found")])])
    with mock.patch.object(rollout, "ReleaseApi", lambda: cluster), pytest.raises(SystemExit) as exit_:
        rollout.main(deploy_args("3", percent=0))
    assert exit_.value.code == NEVER_SUCCEEDS_EXIT_CODE
    assert capsys.readouterr().err.strip() == (
        "rollout: deploy: pod fmnist-predictor-3-abc: container kserve-container: ImagePullBackOff: "
        "not found")
    (template,) = [t for t in argo.workflow_template(parse_config({}))["spec"]["templates"]
                   if t["name"] == "serve"]
    expression = template["retryStrategy"]["expression"]
    assert expression == f"asInt(lastRetry.exitCode) != {NEVER_SUCCEEDS_EXIT_CODE}"


def test_a_failing_pod_of_the_old_version_is_not_this_rollouts_failure():
    cluster = FakeCluster([(deployment(NEW_URI), [pod(OLD_URI, "CrashLoopBackOff", "kserve-container"),
                                                  pod(NEW_URI)])])
    assert roll(cluster)[0] == "2 of 2 replicas serve it"


def test_a_deployment_past_its_progress_deadline_fails():
    stuck = deployment(NEW_URI, updated=1, total=3, conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": 'ReplicaSet "fmnist-predictor-7d9" has timed out progressing.'}])
    with pytest.raises(rollout.RolloutFailed, match='has timed out progressing'):
        roll(FakeCluster([(stuck, [pod(NEW_URI)])]))


def test_a_version_whose_uri_is_a_prefix_of_another_is_not_mistaken_for_it():
    assert not rollout.names_uri(deployment("gs://bucket/releases/fmnist/30")["spec"]["template"], NEW_URI)
    assert rollout.names_uri(deployment(NEW_URI)["spec"]["template"], NEW_URI)


def test_the_timeout_bounds_the_wait_and_names_the_last_state():
    cluster = FakeCluster([(deployment(NEW_URI, available=0), [pod(NEW_URI)])])
    with pytest.raises(rollout.RolloutFailed) as error:
        roll(cluster, timeout=30)
    assert str(error.value) == "fmnist: not rolled out after 30 s: 0 of 2 new replicas are available"


def test_the_kubernetes_calls_are_the_ones_the_workflow_role_grants():
    """KubernetesCluster makes exactly the API calls infra's Role for the workflow's pods allows."""
    from kubernetes import client

    from infra.pipeline import workflow_pod_rules

    granted = set.intersection(*({(group, resource, verb) for rule in workflow_pod_rules(engine)
                                  for group in rule["apiGroups"] for resource in rule["resources"]
                                  for verb in rule["verbs"]}
                                 for engine in ENGINES.values()))  # whichever trains
    made = set()
    routes = ("gateway.networking.k8s.io", "v1", NAMESPACE, "httproutes")
    isvcs = ("serving.kserve.io", "v1beta1", NAMESPACE, "inferenceservices")
    calls = {  # method -> (the API call as RBAC sees it, by the group/version/plural it is made on)
        "get_namespaced_custom_object": {isvcs: ("serving.kserve.io", "inferenceservices", "get"),
                                         routes: ("gateway.networking.k8s.io", "httproutes", "get")},
        "create_namespaced_custom_object": {isvcs: ("serving.kserve.io", "inferenceservices", "create"),
                                            routes: ("gateway.networking.k8s.io", "httproutes", "create")},
        "replace_namespaced_custom_object": {isvcs: ("serving.kserve.io", "inferenceservices", "update"),
                                             routes: ("gateway.networking.k8s.io", "httproutes", "update")},
        "delete_namespaced_custom_object": {isvcs: ("serving.kserve.io", "inferenceservices", "delete")},
        "read_namespaced_deployment": ("apps", "deployments", "get"),
        "list_namespaced_pod": ("", "pods", "list"),
        "connect_get_namespaced_pod_proxy_with_path": ("", "pods/proxy", "get"),
        "list_namespaced_event": ("", "events", "list"),
    }

    def recording(name):
        def call(*args, **kwargs):
            made.add(calls[name][tuple(args[:4])] if isinstance(calls[name], dict) else calls[name])
            empty = {"list_namespaced_pod": client.V1PodList(items=[]),
                     "list_namespaced_event": client.CoreV1EventList(items=[])}
            return empty.get(name, {})
        return call

    apis = {api: mock.Mock(**{name: recording(name) for name in calls})
            for api in ("CustomObjectsApi", "AppsV1Api", "CoreV1Api")}
    with mock.patch("kubernetes.config.load_incluster_config"), \
            mock.patch.multiple("kubernetes.client", **{name: lambda *a, api=api: api
                                                        for name, api in apis.items()}):
        cluster = kubernetes.ReleaseApi()
        route = rollout.http_route("fmnist", 10)
        cluster.get_inference_service(NAMESPACE, "fmnist")
        cluster.create_inference_service(NAMESPACE, manifest())
        cluster.replace_inference_service(NAMESPACE, "fmnist", manifest())
        cluster.delete_inference_service(NAMESPACE, "fmnist-canary")
        cluster.get_http_route(NAMESPACE, "fmnist-split")
        cluster.create_http_route(NAMESPACE, route)
        cluster.replace_http_route(NAMESPACE, "fmnist-split", route)
        cluster.get_deployment(NAMESPACE, "fmnist-predictor")
        cluster.list_pods(NAMESPACE, "x=y")
        cluster.pod_metrics(NAMESPACE, "fmnist-predictor-abc", 8080)
        cluster.list_warnings(NAMESPACE)
    assert made == set(cluster_names.API_CALLS)
    assert made <= granted


# --- The canary: deploy, judge, promote or roll back -----------------------------------------------

def metrics_text(version: str, requests: int, errors: int = 0, latency_sum: float = 0.0) -> str:
    """A predictor's /metrics as our server writes them (serving.metrics), on a registry of its own."""
    registry = CollectorRegistry()
    labels = {"protocol": "v1", "version": version}
    served = Counter(metrics.REQUESTS_METRIC, "", ["protocol", "status", metrics.VERSION_LABEL],
                     registry=registry)
    failed = Counter(metrics.ERRORS_METRIC, "", ["kind", metrics.VERSION_LABEL], registry=registry)
    latency = Histogram(metrics.LATENCY_METRIC, "", ["protocol", "status", metrics.VERSION_LABEL],
                        registry=registry)
    served.labels(status="200", **labels).inc(requests - errors)
    served.labels(status="500", **labels).inc(errors)
    failed.labels(kind="internal", version=version).inc(errors)
    if requests:
        latency.labels(status="200", **labels).observe(latency_sum)
    return generate_latest(registry).decode()


def ready_pod(name: str) -> dict:
    return {"metadata": {"name": name},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


class FakeKServe:
    """The API server's side of the InferenceServices and the route, as KubernetesCluster reports it:
    each object has a resourceVersion that every write moves on; a replace at another one is a
    Conflict (409), and so is a create of an object that exists (AlreadyExists); a replace or delete of
    one that does not exist is NotFound (404). A predictor rolls out at once unless its release is
    `stuck`; each pod's /metrics is what `traffic` says it has served so far. `before_writes_to` has
    another writer act between the step's read of an object and its write."""

    def __init__(self, isvcs: dict[str, dict] | None = None, route_percent: int | None = None):
        self.revision = 0
        self.isvcs = {name: self._stamped(m, name) for name, m in (isvcs or {}).items()}
        self.routes: dict[str, dict] = {}
        if route_percent is not None:
            self.put_route(route_percent)
        self.log: list[str] = []  # the step's writes, in order
        # storage URI -> why the new predictor pod waits (None: not fatal, it is just not available yet)
        self.stuck: dict[str, str | None] = {}
        # pod name -> (InferenceService, [(requests, errors, latency sum) at each successive scrape])
        self.traffic: dict[str, tuple[str, list[tuple[int, int, float]]]] = {}
        self.unreadable: set[str] = set()  # pods whose /metrics the pod proxy cannot reach
        self.meddling: dict[str, Iterator[Callable[[], None]]] = {}
        # InferenceService -> how many reads it stays for once deleted (KServe's finalizer); None: for ever
        self.finalizing: dict[str, int | None] = {}

    # What others do: KServe's controller, another run, a person with kubectl.

    def _stamped(self, manifest: dict, name: str) -> dict:
        self.revision += 1
        return {**manifest, "metadata": {**manifest["metadata"], "name": name,
                                         "resourceVersion": str(self.revision)}}

    def put_route(self, percent: int) -> None:
        self.routes["fmnist-split"] = self._stamped(rollout.http_route("fmnist", percent), "fmnist-split")

    def touch(self, name: str) -> None:
        """Another writer updates the object (KServe writing its status): a new resourceVersion."""
        store = self.routes if name in self.routes else self.isvcs
        store[name] = self._stamped(store[name], name)

    def remove(self, name: str) -> None:
        (self.routes if name in self.routes else self.isvcs).pop(name, None)

    def before_writes_to(self, name: str, acts: Iterable[Callable[[], None]]) -> None:
        """Another writer does each of `acts` in turn, just before each of the step's writes to `name`."""
        self.meddling[name] = iter(acts)

    def _meddle(self, name: str) -> None:
        act = next(self.meddling.get(name, iter(())), None)
        if act is not None:
            act()

    # The API server.

    def _create(self, store: dict, kind: str, manifest: dict) -> None:
        name = manifest["metadata"]["name"]
        self._meddle(name)
        assert "resourceVersion" not in manifest["metadata"]  # the API server refuses one on create
        if name in store:
            raise kubernetes.Conflict(f'{kind} {NAMESPACE}/{name}: {kind.lower()}s "{name}" already exists')
        store[name] = self._stamped(manifest, name)

    def _replace(self, store: dict, kind: str, name: str, manifest: dict) -> None:
        self._meddle(name)
        if name not in store:
            raise kubernetes.NotFound(f"{kind} {NAMESPACE}/{name} does not exist")
        if manifest["metadata"]["resourceVersion"] != store[name]["metadata"]["resourceVersion"]:
            raise kubernetes.Conflict(f"{kind} {NAMESPACE}/{name}: the object has been modified")
        store[name] = self._stamped(manifest, name)

    def get_inference_service(self, namespace, name):
        isvc = self.isvcs.get(name)
        if isvc is not None and "deletionTimestamp" in isvc["metadata"] and self.finalizing[name] is not None:
            if self.finalizing[name] == 0:  # KServe's controller has removed its finalizer
                del self.isvcs[name]
                return None
            self.finalizing[name] -= 1
        return isvc

    def create_inference_service(self, namespace, manifest):
        self._create(self.isvcs, "InferenceService", manifest)
        self.log.append(f"create isvc {manifest['metadata']['name']} {shape.model_version(manifest)}")

    def replace_inference_service(self, namespace, name, manifest):
        self._replace(self.isvcs, "InferenceService", name, manifest)
        self.log.append(f"replace isvc {name} {shape.model_version(manifest)}")

    def delete_inference_service(self, namespace, name):
        self._meddle(name)
        if name not in self.isvcs:
            raise kubernetes.NotFound(f"InferenceService {NAMESPACE}/{name} does not exist")
        if name in self.finalizing:
            self.isvcs[name]["metadata"].update(deletionTimestamp="2026-11-29T00:00:00Z",
                                                finalizers=["inferenceservice.finalizers"])
        else:
            del self.isvcs[name]
        self.log.append(f"delete isvc {name}")

    def get_http_route(self, namespace, name):
        return self.routes.get(name)

    def create_http_route(self, namespace, manifest):
        self._create(self.routes, "HTTPRoute", manifest)
        self.log.append(f"create route {self.weights(manifest['metadata']['name'])}")

    def replace_http_route(self, namespace, name, manifest):
        self._replace(self.routes, "HTTPRoute", name, manifest)
        self.log.append(f"route {self.weights(name)}")

    def weights(self, name: str = "fmnist-split") -> str:
        route = self.routes[name]
        return " ".join(f"{b['name']}={b['weight']}" for b in route["spec"]["rules"][0]["backendRefs"])

    def get_deployment(self, namespace, name):
        isvc = self.isvcs.get(name.removesuffix("-predictor"))
        if isvc is None:  # KServe's garbage collection goes with the InferenceService
            return None
        uri = shape.storage_uri(isvc)
        return deployment(uri, available=0) if uri in self.stuck else deployment(uri)

    def list_pods(self, namespace, label_selector):
        isvc = label_selector.partition("=")[2]
        if isvc not in self.isvcs:
            return []
        uri = shape.storage_uri(self.isvcs[isvc])
        new = [pod(uri, self.stuck[uri], "kserve-container", isvc=isvc)] if uri in self.stuck else []
        return new + [{**pod(uri), **ready_pod(name)} for name, (owner, _) in self.traffic.items()
                      if owner == isvc]

    def list_warnings(self, namespace):
        return []

    def pod_metrics(self, namespace, pod_name, port):
        assert port == 8080
        if pod_name in self.unreadable:
            return None
        owner, series = self.traffic[pod_name]
        requests, errors, latency = series[0] if len(series) == 1 else series.pop(0)
        return metrics_text(shape.model_version(self.isvcs[owner]), requests, errors, latency)


def run(cluster, *args: str, meanwhile: Callable[[], None] = lambda: None) -> list[str]:
    """Runs the step on a fake clock; `meanwhile` happens while it sleeps."""
    said, now = [], [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        meanwhile()

    rollout.run_command(cluster, rollout.parse_args(args), rollout.Timing(5, lambda: now[0], sleep),
                        said.append)
    return said


def deploy_args(version: str, percent: int = 10) -> list[str]:
    return ["deploy", "--namespace", NAMESPACE, "--canary-percent", str(percent),
            "--manifest", json.dumps(manifest(version))]


def test_the_first_version_becomes_the_stable_version_with_every_request():
    cluster = FakeKServe()
    said = run(cluster, *deploy_args("1"))
    assert cluster.log == ["create isvc fmnist 1", "create route fmnist-predictor=100"]
    assert said[-1] == ("rollout: version 1 is the stable version (2 of 2 replicas serve it); "
                        "the route sends it every request")


def test_a_later_version_is_deployed_as_a_canary_beside_the_stable_one_with_its_share():
    cluster = FakeKServe({"fmnist": manifest("2")})
    said = run(cluster, *deploy_args("3", percent=25))
    assert cluster.log == ["create isvc fmnist-canary 3",
                           "create route fmnist-predictor=75 fmnist-canary-predictor=25"]
    canary_isvc = cluster.isvcs["fmnist-canary"]
    # The same predictor, the new release, scaling on its own pods' load.
    assert canary_isvc["spec"] == shape.renamed(manifest("3"), "fmnist-canary")["spec"]
    assert shape.storage_uri(canary_isvc) == NEW_URI
    assert shape.storage_uri(cluster.isvcs["fmnist"]) == OLD_URI
    assert said[-1].endswith("taking 25% of requests; version 2 stays stable")


def load_query(isvc: dict) -> str:
    (metric,) = isvc["spec"]["predictor"]["autoScaling"]["metrics"]
    return metric["external"]["metric"]["query"]


def test_the_canary_and_the_stable_version_each_scale_on_their_own_pods_load():
    stable = manifest("3")
    canary = shape.renamed(stable, "fmnist-canary")
    assert load_query(stable).replace('inferenceservice="fmnist"', 'inferenceservice="fmnist-canary"') == \
        load_query(canary) != load_query(stable)
    promoted = shape.renamed(canary, "fmnist")  # promotion: the stable one takes the canary's spec
    assert load_query(promoted) == load_query(stable)
    stray = shape.renamed(stable, "fmnist-canary")
    stray["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]["metric"]["query"] = "sum(up)"
    with pytest.raises(shape.ShapeError, match="does not select its own pods"):
        shape.renamed(stray, "fmnist")


def test_with_canary_percent_0_a_later_version_replaces_the_stable_one_at_once():
    cluster = FakeKServe({"fmnist": manifest("2"), "fmnist-canary": manifest("1")}, route_percent=10)
    run(cluster, *deploy_args("3", percent=0))
    assert cluster.log == ["replace isvc fmnist 3", "route fmnist-predictor=100", "delete isvc fmnist-canary"]


def test_a_version_that_is_already_stable_changes_nothing():
    """The promotion gate kept the served version: select outputs it again."""
    cluster = FakeKServe({"fmnist": manifest("3")}, route_percent=0)
    said = run(cluster, *deploy_args("3"))
    assert cluster.log == []
    assert said[-1] == ("rollout: version 3 is already the stable version (2 of 2 replicas serve it): "
                        "nothing to roll out")


def test_a_stable_version_served_before_there_were_routes_gets_its_route():
    cluster = FakeKServe({"fmnist": manifest("3")})
    run(cluster, *deploy_args("3"))
    assert cluster.log == ["create route fmnist-predictor=100"]


def test_a_pod_whose_metrics_cannot_be_read_is_left_out_of_that_look():
    cluster = canary_under_way([(100, 0, 1.0)], [(50, 0, 1.0)])
    cluster.traffic["fmnist-canary-predictor-b"] = ("fmnist-canary", [(70, 0, 1.0)])
    cluster.unreadable.add("fmnist-canary-predictor-b")
    assert rollout.scrape(cluster, NAMESPACE, cluster.isvcs["fmnist-canary"]) == {
        "fmnist-canary-predictor-a": Evidence(50, 0, 1.0)}


def test_a_canary_that_serves_no_metrics_is_refused_before_anything_changes():
    config = parse_config({"pipeline": {"rollout": {"canaryPercent": 0}},  # refused with a canary
                           "serving": {"runtime": "tensorflow", "autoscaling": {"metric": "cpu"}}})
    target = ClusterTarget(storage=gcs_storage("bucket"))
    tf_serving = inference_service(argo.predictor_spec(config, target, "3", NAMESPACE))
    cluster = FakeKServe({"fmnist": manifest("2")})
    with pytest.raises(shape.ShapeError, match="serves no /metrics"):
        rollout.deploy(cluster, NAMESPACE, tf_serving, 10, 60)
    assert cluster.log == []


def canary_under_way(stable_series, canary_series) -> FakeKServe:
    cluster = FakeKServe({"fmnist": manifest("2"),
                          "fmnist-canary": shape.renamed(manifest("3"), "fmnist-canary")}, route_percent=10)
    cluster.traffic = {"fmnist-predictor-a": ("fmnist", stable_series),
                       "fmnist-canary-predictor-a": ("fmnist-canary", canary_series)}
    return cluster


def decide_args(tmp_path, *extra: str) -> list[str]:
    return ["decide", "--namespace", NAMESPACE, "--model-name", "fmnist", "--version", "3",
            "--min-requests", "100", "--max-wait-seconds", "600",
            "--decision-file", str(tmp_path / "decision.json"), *extra]


def test_a_healthy_canary_is_promoted_once_it_has_answered_enough_requests(tmp_path):
    # The stable pod had served 5000 requests before; in the window it serves 900 more, 9 failing.
    stable = [(5000, 50, 100.0), (5400, 54, 108.0), (5900, 59, 118.0)]
    canary_series = [(40, 0, 0.8), (100, 1, 2.1)]
    cluster = canary_under_way(stable, canary_series)
    said = run(cluster, *decide_args(tmp_path))
    record = json.loads((tmp_path / "decision.json").read_text())
    assert record["decision"] == "promote"
    assert record["stable"] == {"version": "2", "requests": 900, "errors": 9, "error_rate": 0.01,
                                "mean_latency_ms": 20.0}
    assert record["canary"]["version"] == "3" and record["canary"]["requests"] == 100
    assert record["waitedSeconds"] == 15.0  # the second look, one poll later, saw enough
    assert any(line.startswith("rollout: decision: ") for line in said)
    # The stable InferenceService takes the canary's release; then all traffic to it; the canary goes.
    assert cluster.log == ["replace isvc fmnist 3", "route fmnist-predictor=100", "delete isvc fmnist-canary"]
    assert shape.storage_uri(cluster.isvcs["fmnist"]) == NEW_URI


def test_a_failing_canary_is_rolled_back_and_no_version_is_deleted(tmp_path):
    cluster = canary_under_way([(0, 0, 0.0), (1000, 0, 20.0)], [(0, 0, 0.0), (100, 30, 2.0)])
    run(cluster, *decide_args(tmp_path))
    assert json.loads((tmp_path / "decision.json").read_text())["decision"] == "rollback"
    assert cluster.log == ["route fmnist-predictor=100", "delete isvc fmnist-canary"]
    assert shape.storage_uri(cluster.isvcs["fmnist"]) == OLD_URI


def test_without_enough_requests_the_decision_comes_at_max_wait(tmp_path):
    cluster = canary_under_way([(10, 0, 0.1)], [(3, 0, 0.05)])
    run(cluster, *decide_args(tmp_path, "--max-wait-seconds", "50"))
    record = json.loads((tmp_path / "decision.json").read_text())
    assert record["waitedSeconds"] == 50.0 and record["canary"]["requests"] == 3


def test_a_restarted_stable_pod_counts_from_zero():
    start = {"a": Evidence(500, 5, 10.0), "b": Evidence(300, 0, 6.0)}
    now = {"a": Evidence(40, 0, 0.8), "b": Evidence(320, 1, 6.5), "c": Evidence(7, 0, 0.1)}
    assert rollout.window(now, start) == Evidence(40 + 20 + 7, 0 + 1 + 0, pytest.approx(0.8 + 0.5 + 0.1))


def test_analyse_decides_but_changes_nothing(tmp_path):
    cluster = canary_under_way([(0, 0, 0.0), (500, 0, 10.0)], [(0, 0, 0.0), (100, 0, 2.0)])
    run(cluster, "analyse", *decide_args(tmp_path)[1:])
    assert json.loads((tmp_path / "decision.json").read_text())["decision"] == "promote"
    assert cluster.log == []


def test_with_no_canary_of_the_runs_version_there_is_nothing_to_decide(tmp_path):
    cluster = FakeKServe({"fmnist": manifest("3")})
    said = run(cluster, *decide_args(tmp_path))
    assert json.loads((tmp_path / "decision.json").read_text()) == {
        "decision": "none", "reason": "no canary of version 3 in dist-ml: nothing to decide"}
    assert cluster.log == [] and said[-1].startswith("rollout: decision: ")


def test_promote_and_rollback_by_hand():
    cluster = canary_under_way([(0, 0, 0.0)], [(0, 0, 0.0)])
    run(cluster, "rollback", "--namespace", NAMESPACE, "--model-name", "fmnist")
    assert cluster.log == ["route fmnist-predictor=100", "delete isvc fmnist-canary"]
    with pytest.raises(rollout.RolloutFailed, match="no canary InferenceService dist-ml/fmnist-canary"):
        run(cluster, "promote", "--namespace", NAMESPACE, "--model-name", "fmnist")


# --- Failure paths: a retried step, other writers, objects that vanish ----------------------------------

def uri_of(version: str) -> str:
    return shape.storage_uri(manifest(version))


@pytest.mark.parametrize(("waiting", "failure"), [
    ("ErrImagePull", "pod fmnist-predictor-1-abc: container kserve-container: ErrImagePull"),
    (None, "fmnist: not rolled out after 60 s: 0 of 2 new replicas are available")])
def test_a_retried_first_rollout_is_waited_for_and_routed_to_only_once_it_serves(waiting, failure):
    """Argo retries the serve step: the first attempt created the stable InferenceService and failed.
    The retry finds it annotated with the version, but that says nothing about whether it serves."""
    cluster = FakeKServe()
    cluster.stuck[uri_of("1")] = waiting
    for _attempt in range(2):
        with pytest.raises(rollout.RolloutFailed) as error:
            run(cluster, *deploy_args("1"), "--timeout-seconds", "60")
        assert str(error.value).startswith(failure)
        assert cluster.routes == {}  # no request is sent to a version that does not serve
    del cluster.stuck[uri_of("1")]  # the image is pushed, or the pull was only slow
    said = run(cluster, *deploy_args("1"))
    assert cluster.log == ["create isvc fmnist 1", "create route fmnist-predictor=100"]
    assert said[-1] == ("rollout: version 1 is already the stable version (2 of 2 replicas serve it): "
                        "nothing to roll out")


def test_a_retried_rollout_with_canary_percent_0_that_broke_the_stable_version_fails_again():
    cluster = FakeKServe({"fmnist": manifest("2")}, route_percent=0)
    cluster.stuck[uri_of("3")] = "CrashLoopBackOff"
    for _attempt in range(2):
        with pytest.raises(rollout.RolloutFailed, match="container kserve-container: CrashLoopBackOff"):
            run(cluster, *deploy_args("3", percent=0))
        assert shape.model_version(cluster.isvcs["fmnist"]) == "3"  # what the first attempt wrote
        assert cluster.weights() == "fmnist-predictor=100"  # the old replicas serve on, as before


def test_with_canary_percent_0_a_retry_finishes_what_the_failed_attempt_began():
    """The stable InferenceService already names the version; the route and the canary are not done."""
    cluster = FakeKServe({"fmnist": manifest("3"), "fmnist-canary": manifest("1")}, route_percent=10)
    run(cluster, *deploy_args("3", percent=0))
    assert cluster.log == ["replace isvc fmnist 3", "route fmnist-predictor=100", "delete isvc fmnist-canary"]


def test_a_canary_that_cannot_start_fails_on_every_retry_with_traffic_left_on_the_stable_version():
    cluster = FakeKServe({"fmnist": manifest("2")}, route_percent=0)
    cluster.stuck[uri_of("3")] = "CrashLoopBackOff"
    for _attempt in range(2):
        with pytest.raises(rollout.RolloutFailed, match="pod fmnist-canary-predictor-3-abc: .*: CrashLoop"):
            run(cluster, *deploy_args("3"))
        assert cluster.weights() == "fmnist-predictor=100"
    del cluster.stuck[uri_of("3")]  # a fixed image: the next retry rolls the canary out and routes it
    said = run(cluster, *deploy_args("3"))
    assert cluster.weights() == "fmnist-predictor=90 fmnist-canary-predictor=10"
    assert said[-1].endswith("taking 10% of requests; version 2 stays stable")


@pytest.mark.parametrize("name", ["fmnist", "fmnist-split"])
def test_a_write_that_conflicts_with_another_writers_is_read_again_and_retried(name):
    """KServe's controller updates the InferenceService's status between the step's read and write."""
    cluster = FakeKServe({"fmnist": manifest("2")}, route_percent=10)
    cluster.before_writes_to(name, [lambda: cluster.touch(name)])
    run(cluster, *deploy_args("3", percent=0))
    assert cluster.log == ["replace isvc fmnist 3", "route fmnist-predictor=100"]
    assert shape.storage_uri(cluster.isvcs["fmnist"]) == uri_of("3")


def test_a_create_that_finds_the_object_already_there_replaces_it():
    cluster = FakeKServe()
    cluster.before_writes_to("fmnist-split", [lambda: cluster.put_route(10)])  # another run's serve step
    run(cluster, *deploy_args("1"))
    assert cluster.log == ["create isvc fmnist 1", "route fmnist-predictor=100"]


def test_a_write_that_conflicts_every_time_fails_after_a_bounded_number_of_attempts(capsys):
    cluster = canary_under_way([(0, 0, 0.0)], [(0, 0, 0.0)])
    touches = []

    def touch() -> None:
        touches.append("fmnist")
        cluster.touch("fmnist")

    cluster.before_writes_to("fmnist", itertools.repeat(touch))
    with mock.patch.object(rollout, "ReleaseApi", lambda: cluster), pytest.raises(SystemExit) as exit_:
        rollout.main(["promote", "--namespace", NAMESPACE, "--model-name", "fmnist"])
    assert exit_.value.code == 1  # Argo's retry may find no other writer
    assert capsys.readouterr().err.strip() == (
        "rollout: promote: InferenceService dist-ml/fmnist: not written in 5 "
        "attempts: another writer changed it between each read and write")
    assert len(touches) == 5 and cluster.log == []
    assert cluster.weights() == "fmnist-predictor=90 fmnist-canary-predictor=10"  # as it was


def test_an_inference_service_deleted_between_the_steps_read_and_its_write_is_created_again():
    cluster = canary_under_way([(0, 0, 0.0)], [(0, 0, 0.0)])
    cluster.before_writes_to("fmnist", [lambda: cluster.remove("fmnist")])
    run(cluster, "promote", "--namespace", NAMESPACE, "--model-name", "fmnist")
    assert cluster.log == ["create isvc fmnist 3", "route fmnist-predictor=100", "delete isvc fmnist-canary"]


def test_a_route_deleted_before_the_step_updates_it_is_created_again():
    cluster = FakeKServe({"fmnist": manifest("2")}, route_percent=0)
    cluster.before_writes_to("fmnist-split", [lambda: cluster.remove("fmnist-split")])
    run(cluster, *deploy_args("3"))
    assert cluster.log == ["create isvc fmnist-canary 3",
                           "create route fmnist-predictor=90 fmnist-canary-predictor=10"]


def test_an_inference_service_deleted_while_it_rolls_out_fails_at_once():
    cluster = FakeKServe()
    cluster.stuck[uri_of("1")] = None
    with pytest.raises(rollout.RolloutFailed) as error:
        run(cluster, *deploy_args("1"), meanwhile=lambda: cluster.remove("fmnist"))
    assert str(error.value) == "InferenceService dist-ml/fmnist was deleted while it rolled out"
    assert cluster.routes == {}


def test_a_canary_deleted_while_it_is_judged_is_not_judged_and_loses_its_share(tmp_path):
    cluster = canary_under_way([(0, 0, 0.0), (500, 0, 10.0)], [(40, 0, 0.8), (100, 0, 2.0)])
    with pytest.raises(rollout.RolloutFailed) as error:
        run(cluster, *decide_args(tmp_path), meanwhile=lambda: cluster.remove("fmnist-canary"))
    assert str(error.value) == ("InferenceService dist-ml/fmnist-canary was deleted while it was judged; "
                                "rolled back: version 2 serves every request")
    assert cluster.weights() == "fmnist-predictor=100"  # not 10% to a Service that is gone
    assert not (tmp_path / "decision.json").exists()


def test_analyse_of_a_canary_deleted_while_it_is_judged_fails_and_changes_nothing(tmp_path):
    cluster = canary_under_way([(0, 0, 0.0)], [(40, 0, 0.8)])
    with pytest.raises(kubernetes.NotFound, match="fmnist-canary was deleted while it was judged$"):
        run(cluster, "analyse", *decide_args(tmp_path)[1:], meanwhile=lambda: cluster.remove("fmnist-canary"))
    assert cluster.log == []


def test_a_canary_deleted_before_the_rollout_step_loses_its_share_and_the_step_fails(tmp_path):
    cluster = canary_under_way([(0, 0, 0.0)], [(0, 0, 0.0)])
    cluster.remove("fmnist-canary")
    with pytest.raises(rollout.RolloutFailed, match="fmnist-canary does not exist, yet the route sends it"):
        run(cluster, *decide_args(tmp_path))
    assert cluster.log == ["route fmnist-predictor=100"]


def test_a_canary_deleted_just_before_promote_reads_it_loses_its_share_and_the_step_fails(tmp_path):
    cluster = canary_under_way([(0, 0, 0.0), (500, 0, 10.0)], [(40, 0, 0.8), (100, 0, 2.0)])
    promote = rollout.promote

    def promote_once_it_is_gone(cluster, *args, **kwargs):
        cluster.remove("fmnist-canary")
        return promote(cluster, *args, **kwargs)

    with mock.patch.object(rollout, "promote", promote_once_it_is_gone), \
            pytest.raises(rollout.RolloutFailed) as error:
        run(cluster, *decide_args(tmp_path))
    assert str(error.value) == ("no canary InferenceService dist-ml/fmnist-canary to promote; "
                                "rolled back: version 2 serves every request")
    assert cluster.log == ["route fmnist-predictor=100"]
    assert shape.storage_uri(cluster.isvcs["fmnist"]) == OLD_URI


def test_retiring_a_canary_someone_already_deleted_is_not_an_error():
    cluster = canary_under_way([(0, 0, 0.0)], [(0, 0, 0.0)])
    cluster.before_writes_to("fmnist-canary", [lambda: cluster.remove("fmnist-canary")])
    said = run(cluster, "rollback", "--namespace", NAMESPACE, "--model-name", "fmnist")
    assert cluster.log == ["route fmnist-predictor=100"] and "fmnist-canary" not in cluster.isvcs
    assert said[-1] == "rollout: rolled back: version 2 serves every request"


def test_a_retired_canary_is_waited_for_until_kserves_finalizer_lets_it_go():
    """As `kubectl delete` waits: the next serve step must not write its canary into one on its way out."""
    cluster = canary_under_way([(0, 0, 0.0)], [(0, 0, 0.0)])
    cluster.finalizing["fmnist-canary"] = 2
    said = run(cluster, "rollback", "--namespace", NAMESPACE, "--model-name", "fmnist")
    assert "fmnist-canary" not in cluster.isvcs
    assert said[-2:] == ["rollout: deleted InferenceService dist-ml/fmnist-canary",
                         "rollout: rolled back: version 2 serves every request"]


def test_a_canary_kserve_never_lets_go_fails_the_step_naming_the_finalizer():
    cluster = canary_under_way([(0, 0, 0.0)], [(0, 0, 0.0)])
    cluster.finalizing["fmnist-canary"] = None
    with pytest.raises(rollout.RolloutFailed, match=(
            r"^InferenceService dist-ml/fmnist-canary is still there 60 s after its deletion "
            r"\(finalizers: inferenceservice\.finalizers\): is KServe's controller running\?$")):
        run(cluster, "promote", "--namespace", NAMESPACE, "--model-name", "fmnist")
    assert cluster.weights() == "fmnist-predictor=100"  # every request already on the stable version


def test_the_route_splits_between_kserves_predictor_services_and_validates(validate_crd):
    route = rollout.http_route("fmnist", 10, PART_OF)
    assert validate_crd("gateway-api-v1.2.1/gateway.networking.k8s.io_httproutes.yaml", route) == []
    (rule,) = route["spec"]["rules"]
    # KServe v0.20 Standard mode: Service <isvc>-predictor, port 80 (constants.CommonDefaultHttpPort).
    assert [(b["name"], b["port"], b["weight"]) for b in rule["backendRefs"]] == [
        ("fmnist-predictor", 80, 90), ("fmnist-canary-predictor", 80, 10)]
    # The Gateway's model listener alone: never a plain-HTTP listener kept for redirecting to HTTPS.
    assert route["spec"]["parentRefs"] == [{"name": GATEWAY_NAME, "sectionName": "model"}]
    assert "matches" not in rule  # every path: the v1 and v2 protocols, /metrics excepted by nobody
    broken = rollout.http_route("fmnist", 10)
    broken["spec"]["rules"][0]["backendRefs"][0]["weight"] = -1
    assert validate_crd("gateway-api-v1.2.1/gateway.networking.k8s.io_httproutes.yaml", broken)


def test_the_metrics_port_is_the_predictor_containers_port():
    assert shape.metrics_port(manifest()) == SERVING_HTTP_PORT


def test_the_serve_and_rollout_steps_arguments_are_ones_the_cli_accepts():
    template = argo.workflow_template(parse_config({}))
    steps = {t["name"]: t for t in template["spec"]["templates"]}
    serve = rollout.parse_args(steps["serve"]["container"]["args"])
    assert serve.command == "deploy" and serve.manifest == argo.applied_manifest(steps["serve"])
    assert serve.namespace == "{{workflow.namespace}}" and serve.canary_percent == 10
    decide = rollout.parse_args(steps["rollout"]["container"]["args"])
    assert decide.command == "decide" and decide.model_name == "fmnist"
    assert (decide.min_requests, decide.max_wait_seconds, decide.max_error_rate_increase,
            decide.max_latency_ratio) == (100, 600, 0.01, 1.5)


@pytest.mark.parametrize(("args", "message"), [
    (["deploy", "--namespace", "ns", "--manifest", "{not json"],
     "argument --manifest: not an InferenceService manifest"),
    (["deploy", "--namespace", "ns", "--manifest", json.dumps({"metadata": {"name": "x"}, "spec": {}})],
     "argument --manifest: not an InferenceService manifest with a storage URI (KeyError"),
    (["deploy", "--namespace", "ns", "--manifest", json.dumps(manifest()), "--timeout-seconds", "0"],
     "argument --timeout-seconds: must be a positive number"),
    (["deploy", "--namespace", "ns", "--manifest", json.dumps(manifest()), "--canary-percent", "100"],
     "argument --canary-percent: must be a whole percentage from 0 to 99"),
    (["decide", "--namespace", "ns", "--model-name", "fmnist", "--max-latency-ratio", "0.5"],
     "argument --max-latency-ratio: must be a number >= 1"),
    (["promote", "--namespace", "ns"], "the following arguments are required: --model-name"),
])
def test_bad_arguments_are_one_line(args, message):
    result = run_module("cluster_steps.release", *args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"cluster_steps.release {args[0]}: error: {message}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_rollout_module_needs_no_tensorflow():
    """It runs in the serve and rollout steps' pods; importing it must not pull in the training stack."""
    probe = [sys.executable, "-c", "import sys, cluster_steps.release; print('tensorflow' in sys.modules)"]
    result = subprocess.run(probe, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.parametrize(("status", "raises"), [(503, False), (404, False), (403, True)])
def test_the_pod_proxy_skips_a_pod_going_away_but_not_a_refusal(status, raises):
    from kubernetes import client

    core = mock.Mock(**{"connect_get_namespaced_pod_proxy_with_path.side_effect":
                        client.ApiException(status=status)})
    with mock.patch("kubernetes.config.load_incluster_config"), \
            mock.patch("kubernetes.client.CoreV1Api", lambda *a: core):
        cluster = kubernetes.ReleaseApi()
        if raises:  # a missing right is the operator's to fix: the step fails and says so
            with pytest.raises(client.ApiException):
                cluster.pod_metrics(NAMESPACE, "fmnist-predictor-a", 8080)
        else:
            assert cluster.pod_metrics(NAMESPACE, "fmnist-predictor-a", 8080) is None


@pytest.mark.parametrize(("status", "raised", "message"), [
    (409, "Conflict", 'Operation cannot be fulfilled on httproutes "fmnist-split": the object has been '
                      'modified'),
    (404, "NotFound", 'httproutes.gateway.networking.k8s.io "fmnist-split" not found'),
    (403, "ApiException", "httproutes is forbidden")])
def test_the_cluster_reports_conflicts_and_missing_objects_in_the_modules_own_terms(status, raised, message):
    """The logic handles Conflict and NotFound, naming the object, and never the client's exception; a
    refusal is the operator's to fix and goes through as it is."""
    from kubernetes import client

    error = client.ApiException(status=status)
    error.body = json.dumps({"kind": "Status", "message": message})
    objects = mock.Mock(**{f"{verb}_namespaced_custom_object.side_effect": error
                           for verb in ("get", "create", "replace", "delete")})
    with mock.patch("kubernetes.config.load_incluster_config"), \
            mock.patch("kubernetes.client.CustomObjectsApi", lambda *a: objects):
        cluster = kubernetes.ReleaseApi()
        route = rollout.http_route("fmnist", 0)
        writes = [lambda: cluster.create_inference_service(NAMESPACE, manifest()),
                  lambda: cluster.replace_inference_service(NAMESPACE, "fmnist", manifest()),
                  lambda: cluster.delete_inference_service(NAMESPACE, "fmnist"),
                  lambda: cluster.create_http_route(NAMESPACE, route),
                  lambda: cluster.replace_http_route(NAMESPACE, "fmnist-split", route)]
        for write in writes:
            with pytest.raises(Exception) as caught:
                write()
            assert type(caught.value).__name__ == raised
        if status == 404:  # a get of a missing object is an answer, not an error
            assert cluster.get_inference_service(NAMESPACE, "fmnist") is None
            assert cluster.get_http_route(NAMESPACE, "fmnist-split") is None
    if status != 403:
        assert str(caught.value) == f"HTTPRoute dist-ml/fmnist-split: {message}"


def test_the_workflow_runs_this_module_by_the_name_the_shared_names_give() -> None:
    assert cluster_names.RELEASE_MODULE == rollout.__name__


def test_the_rollout_steps_move_mlflows_aliases_to_what_is_served(tmp_path):
    """On a cluster the serve and rollout steps keep `champion` on the stable InferenceService's version
    and `challenger` on the canary's (trainer.tracking)."""
    env = {names.TRACKING_URI_ENV: f"sqlite:///{tmp_path}/mlflow.db", names.ARTIFACT_ROOT_ENV: str(tmp_path)}
    tracked = tracking.Tracking.from_environment("rollout", env)
    for version in (2, 3):
        tracking.register_version(tracked, "fmnist", version, f"gs://bucket/releases/fmnist/{version}",
                                  None, [])
    client = MlflowClient(tracking_uri=env[names.TRACKING_URI_ENV])

    def aliases() -> dict[str, str]:
        model = client.get_registered_model("fmnist")
        return {alias: client.get_model_version("fmnist", number).tags[names.VERSION_TAG]
                for alias, number in model.aliases.items()}

    cluster = FakeKServe({"fmnist": manifest("2")})
    run(cluster, *deploy_args("3", percent=25))
    rollout.track_rollout(cluster, NAMESPACE, "fmnist", tracked)
    assert aliases() == {names.CHAMPION: "2", names.CHALLENGER: "3"}
    run(cluster, "promote", "--namespace", NAMESPACE, "--model-name", "fmnist")
    rollout.track_rollout(cluster, NAMESPACE, "fmnist", tracked)
    assert aliases() == {names.CHAMPION: "3"}


def test_a_crash_loop_names_why_the_last_run_ended():
    """The kubelet's back-off message says nothing of the cause; the last run's reason does."""
    looping = {"metadata": {"name": "fmnist-predictor-abc"}, "status": {"containerStatuses": [{
        "name": "kserve-container",
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed"}},
        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}
    assert kubernetes.pod_failure(looping) == (
        "pod fmnist-predictor-abc: container kserve-container: CrashLoopBackOff: back-off 10s restarting "
        "failed (last run: OOMKilled, exit code 137)")
