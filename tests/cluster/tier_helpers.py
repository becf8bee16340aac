"""What the tier's tests share: the workflow's objects as a run submits them, the cluster steps run as
the workflow's pods run them (their own process, the workflow's service account), and the pods that
KWOK runs, ended with the exit status a test gives them."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from stack_checks import STACK_NAMESPACE as NAMESPACE  # where the tier's tests work: the local stack's
from stack_checks import embedded, template_of

from engines.trainjob import JOBSET_NAME_LABEL
from stacks import render
from tools.control_plane.build import ROOT
from tools.control_plane.kube import Api
from tools.control_plane.nodes.kwok import EXIT_CODE_ANNOTATION

RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
POD_WAIT_SECONDS = 90.0
STEP_TIMEOUT_SECONDS = 300
ROLLOUT_SECONDS = 180  # the serve step's wait for one InferenceService


def trainjob(rendered: render.Rendered, name: str, step: str = "train-cnn") -> dict:
    """A train step's TrainJob as the WorkflowTemplate has the step create it, named `name`."""
    manifest = copy.deepcopy(embedded(template_of(rendered), step))
    manifest["metadata"]["name"] = name
    # Its owner, the Workflow run, is not there: the garbage collector would delete it at once.
    manifest["metadata"].pop("ownerReferences")
    return manifest


class Step:
    """A cluster step's process, as an Argo step runs it, with `kubeconfig`'s identity; its output is
    read as it comes."""

    def __init__(self, module: str, kubeconfig: Path, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.started = time.monotonic()
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float = STEP_TIMEOUT_SECONDS) -> int:
        """The step's exit status; its run time in `seconds`."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the step still ran after {timeout} s:\n{self.output}") from None
        self.reader.join()
        self.seconds = time.monotonic() - self.started
        return code

    def says(self, text: str, timeout: float = POD_WAIT_SECONDS) -> None:
        """Waits until the step has said `text` (it keeps running)."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.process.poll() is not None:
                self.reader.join()  # all it said, read
                assert text in self.output, f"the step ended without saying {text!r}:\n{self.output}"
            assert time.monotonic() < deadline, f"the step never said {text!r}:\n{self.output}"
            time.sleep(0.2)


def submitted_step(
    rendered: render.Rendered, name: str, version: str, **replaced: str
) -> tuple[str, list[str]]:
    """The module a WorkflowTemplate step runs and its arguments, as a run submits them (Argo's
    placeholders substituted: the namespace, and the published `version`); `replaced` sets flags'
    values (e.g. version_file for --version-file)."""
    (template,) = [t for t in template_of(rendered)["spec"]["templates"] if t["name"] == name]
    command, args = template["container"]["command"], list(template["container"]["args"])
    args = [
        arg.replace("{{workflow.namespace}}", NAMESPACE).replace("{{inputs.parameters.version}}", version)
        for arg in args
    ]
    for flag, value in replaced.items():
        args[args.index("--" + flag.replace("_", "-")) + 1] = value
    return command[command.index("-m") + 1], args


def serve_step(kubeconfig: Path, rendered: render.Rendered, version: str, version_file: Path) -> Step:
    """The workflow's serve step of the published `version`, as a run submits it, as the workflow's
    account."""
    module, args = submitted_step(rendered, "serve", version, version_file=str(version_file),
                                  timeout_seconds=str(ROLLOUT_SECONDS))
    return Step(module, kubeconfig, *args)


def train_step(kubeconfig: Path, manifest: dict, timeout_seconds: int = STEP_TIMEOUT_SECONDS) -> Step:
    return Step(
        "cluster_steps.train",
        kubeconfig,
        "--namespace",
        NAMESPACE,
        "--manifest",
        json.dumps(manifest),
        "--timeout-seconds",
        str(timeout_seconds),
    )


def running_pods(api: Api, jobset: str, count: int, attempt: int = 0, step: Step | None = None) -> list[dict]:
    """The JobSet's `count` pods of restart attempt `attempt`, once KWOK runs them all; if `step` (the
    train step watching the job) ends first, its words are the failure."""

    def pods() -> list[dict]:
        return [
            pod
            for pod in api.list("v1", "Pod", NAMESPACE, label_selector=f"{JOBSET_NAME_LABEL}={jobset}")
            if pod["metadata"]["labels"].get(RESTART_ATTEMPT_LABEL) == str(attempt)
            and not pod["metadata"].get("deletionTimestamp")
        ]

    def ready() -> list[dict] | None:
        if step is not None and step.process.poll() is not None:
            step.reader.join()
            raise AssertionError(
                f"the train step ended (status {step.process.returncode}) before the pods ran:\n{step.output}"
            )
        running = [pod for pod in pods() if (pod.get("status") or {}).get("phase") == "Running"]
        return running if len(running) == count else None

    try:
        return api.wait(
            ready, f"{count} pods of JobSet {jobset} (attempt {attempt}) running", POD_WAIT_SECONDS
        )
    except TimeoutError as timeout:
        states = {pod["metadata"]["name"]: (pod.get("status") or {}).get("conditions") for pod in pods()}
        workloads = [
            (w["metadata"]["name"], (w.get("status") or {}).get("conditions"))
            for w in api.list("kueue.x-k8s.io/v1beta2", "Workload", NAMESPACE)
        ]
        raise AssertionError(f"{timeout}; pods: {states}; workloads: {workloads}") from None


def end(api: Api, pods: list[dict], code: int) -> None:
    """Each pod's containers exit with `code` (KWOK's stage for the tier, nodes/kwok.py)."""
    for pod in pods:
        api.patch(
            "v1",
            "Pod",
            pod["metadata"]["name"],
            {"metadata": {"annotations": {EXIT_CODE_ANNOTATION: str(code)}}},
            namespace=NAMESPACE,
        )


def by_index(pods: list[dict], replicated_job: str) -> dict[int, dict]:
    return {
        int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]): pod
        for pod in pods
        if pod["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == replicated_job
    }


def delete_all(api: Api, api_version: str, kind: str, gone_label: str) -> None:
    """Deletes every `kind` of the namespace, and waits until no pod labelled `gone_label` is left: a
    test leaves the node's capacity and Kueue's quota as it found them."""
    for found in api.list(api_version, kind, NAMESPACE):
        api.delete(api_version, kind, found["metadata"]["name"], NAMESPACE)
    api.wait(
        lambda: not api.list("v1", "Pod", NAMESPACE, label_selector=gone_label),
        f"every {kind}'s pods gone",
        POD_WAIT_SECONDS,
    )
