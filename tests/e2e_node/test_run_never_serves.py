"""What will never serve: the serve step, run as the workflow runs it (an Argo step of the stack's
installed template, as its service account, in the serving image), of the version the first run
published, its predictor changed as a user's mistake would change it. Each fails within a minute of the
step's start, once (Argo does not retry what will never succeed), in the kubelet's words. The three run
at once, each in a Workflow of its own."""

from __future__ import annotations

import copy
import datetime
import json
import re
import threading
import time

import pytest
from e2e_runs import output, submit, wait_until_ended
from e2e_stack import NAMESPACE

from common.cluster_names import ISVC_LABEL, MANIFEST_FLAG
from pipeline import argo

SERVE_STEP = "serve"  # the template's (pipeline.definition's step name)
FAILS_WITHIN_SECONDS = 60.0  # from the step's start
STEP_SECONDS = 300.0  # the test's own bound, long past the promise: a failure names where it stands
POD_GONE_SECONDS = 120.0  # a deleted predictor's pods: their grace period, then the kubelet's cleanup
HISTORY_POLL_SECONDS = 1.0


def broken_image(container: dict) -> str:
    container["image"] = container["image"].rpartition(":")[0] + ":never-built"
    return "ErrImagePull|ImagePullBackOff"


def broken_probe(container: dict) -> str:
    container["readinessProbe"]["httpGet"]["path"] = "/v2/models/no-such-model/ready"
    return "Readiness probe failed: HTTP probe failed with statuscode: 404"


def broken_memory(container: dict) -> str:
    # Below what Python itself needs at its start: the kernel kills it within a second. A limit that
    # TensorFlow's import crosses later (96Mi) has the kernel reclaim its libraries' pages and read them
    # again for minutes first (measured: 80 s to the kill at 96Mi, none in 120 s at 32Mi): no signal
    # for the step until then.
    container["resources"] = {"requests": {"cpu": "250m", "memory": "10Mi"},
                              "limits": {"cpu": "1", "memory": "10Mi"}}
    return "OOMKilled"


BREAKS = {"unpullable-image": broken_image, "probe-on-a-missing-path": broken_probe,
          "over-its-memory-limit": broken_memory}


def serve_step_alone(template: dict, version: str, name: str, breaks) -> tuple[dict, str]:
    """A Workflow of the installed template's spec, entering at its serve step, for `version`, the
    predictor named `name` and changed by `breaks`; and the kubelet's words `breaks` expects."""
    spec = copy.deepcopy(template["spec"])
    (serve,) = [t for t in spec["templates"] if t["name"] == SERVE_STEP]
    args = serve["container"]["args"]
    at = args.index(MANIFEST_FLAG) + 1
    manifest = json.loads(args[at])
    manifest["metadata"]["name"] = name
    (container,) = manifest["spec"]["predictor"]["containers"]
    expected = breaks(container)
    args[at] = json.dumps(manifest)
    spec["entrypoint"] = SERVE_STEP
    spec["arguments"] = {"parameters": [{"name": argo.VERSION_PARAMETER, "value": version}]}
    workflow = {"apiVersion": argo.API_VERSION, "kind": "Workflow",
                "metadata": {"generateName": f"{name}-", "labels": template["metadata"].get("labels", {})},
                "spec": spec}
    return workflow, expected


class PodHistory(threading.Thread):
    """What the API server said of the pods labelled `selector`, once a second: each container's state
    when it changed, and the kubelet's warnings about them, to tell a late kubelet from a late step."""

    def __init__(self, api, selector: str) -> None:
        super().__init__(daemon=True)
        self.api, self.selector, self.stop = api, selector, threading.Event()
        self.lines: list[str] = []

    def run(self) -> None:
        last: dict[str, str] = {}
        warned: set[str] = set()
        while not self.stop.wait(HISTORY_POLL_SECONDS):
            try:
                self.look(last, warned)
            except Exception as error:  # noqa: BLE001 - one look lost; the next one sees the rest
                self.lines.append(f"{time.strftime('%H:%M:%S')} not read: {type(error).__name__}: {error}")

    def look(self, last: dict[str, str], warned: set[str]) -> None:
        """One read of the pods' states and the kubelet's warnings about them."""
        pods = self.api.list("v1", "Pod", NAMESPACE, label_selector=self.selector)
        for pod in pods:
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                key, seen = f"{pod['metadata']['name']}/{status['name']}", container_state(status)
                if last.get(key) != seen:
                    self.lines.append(f"{time.strftime('%H:%M:%S')} {key}: {seen}")
                    last[key] = seen
        names = {pod["metadata"]["name"] for pod in pods}
        for event in self.api.list("v1", "Event", NAMESPACE, field_selector="type=Warning"):
            involved = event["involvedObject"]["name"]
            if involved in names and involved not in warned and from_kubelet(event):
                warned.add(involved)
                stamp = event.get("firstTimestamp") or event["eventTime"]
                self.lines.append(f"{time.strftime('%H:%M:%S')} the kubelet's first warning on {involved} "
                                  f"({stamp}): {event['reason']}: {event['message']}")

    def __enter__(self) -> PodHistory:
        self.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop.set()
        self.join()


def from_kubelet(event: dict) -> bool:
    return "kubelet" in ((event.get("source") or {}).get("component"), event.get("reportingComponent"))


def container_state(status: dict) -> str:
    (state, detail), = ((key, value) for key, value in (status.get("state") or {}).items() if value)
    last = ((status.get("lastState") or {}).get("terminated") or {}).get("reason")
    return (f"{state} {(detail or {}).get('reason') or ''} restarts={status.get('restartCount')}"
            f"{' last=' + last if last else ''}")


def seconds_between(start: str, end: str) -> float:
    return (datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(start)).total_seconds()


@pytest.fixture(scope="module")
def never_serving(cluster, first_run, say) -> dict[str, tuple[dict, str, str]]:
    """Each case's ended Workflow, the words it expects, and the pods' history, the three run at once;
    their predictors deleted afterwards, their pods gone before the next scenario asks the node for room."""
    api, model = cluster.api, cluster.config.pipeline.model_name
    template = api.get(argo.API_VERSION, "WorkflowTemplate", argo.WORKFLOW_TEMPLATE_NAME, NAMESPACE)
    version = output(first_run.workflow, SERVE_STEP, argo.VERSION_PARAMETER)
    names = {case: f"{model}-{case}" for case in BREAKS}
    selector = f"{ISVC_LABEL} in ({','.join(names.values())})"
    with PodHistory(api, selector) as history:
        submitted = {}
        for case, breaks in BREAKS.items():
            workflow, expected = serve_step_alone(template, version, names[case], breaks)
            submitted[case] = (submit(api, workflow, say), expected)
        # Their predictors never start, by design: the step must say so, not this wait.
        ended = {case: (wait_until_ended(api, name, say, STEP_SECONDS, stuck_fails=False)[0], expected)
                 for case, (name, expected) in submitted.items()}
    lines = "\n".join(history.lines)
    say(lines)
    yield {case: (workflow, expected, lines) for case, (workflow, expected) in ended.items()}
    for case, (name, _) in submitted.items():
        api.delete(argo.API_VERSION, "Workflow", name, NAMESPACE)
        api.delete("serving.kserve.io/v1beta1", "InferenceService", names[case], NAMESPACE)
    api.wait(lambda: not api.list("v1", "Pod", NAMESPACE, label_selector=selector),
             "the never-serving predictors' pods gone", POD_GONE_SECONDS)


@pytest.mark.parametrize("case", list(BREAKS))
def test_a_predictor_that_will_never_serve_fails_the_serve_step_within_a_minute_of_its_start(
    never_serving, case, say
):
    workflow, expected, history = never_serving[case]
    name, status = workflow["metadata"]["name"], workflow["status"]
    steps = [node for node in status["nodes"].values() if node.get("templateName") == SERVE_STEP]
    attempts = [node for node in steps if node["type"] == "Pod"]
    words = "; ".join(f"{node['displayName']}: {node.get('phase')}: {node.get('message')}"
                      for node in attempts)
    started = min(node["startedAt"] for node in steps)
    seconds = seconds_between(started, max(node.get("finishedAt") or started for node in steps))
    say(f"{case}: the serve step ended {status['phase']} {seconds:.0f} s after its start, "
        f"{len(attempts)} attempt(s): {words[-500:]}")
    assert status["phase"] == "Failed", f"workflow {name}: {status.get('phase')}: {words}\n{history}"
    assert all(re.search(expected, node.get("message") or "") for node in attempts), f"{words}\n{history}"
    assert len(attempts) == 1, f"Argo retried a step that will never succeed: {words}"
    # The API server's times have whole seconds.
    assert seconds < FAILS_WITHIN_SECONDS + 1, f"{seconds:.0f} s: {words}\n{history}"
