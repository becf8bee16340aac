"""The whole system on a real k3d cluster, then everything torn down: `make e2e`.

    python tools/e2e.py [--keep] [--timeout-minutes N]

Steps, each announced with its duration: preflight (python -m infra.preflight), a throwaway Pulumi
stack `local` in a file backend under .cache/e2e/, `pulumi up` (which creates the k3d cluster itself),
one Workflow run of the WorkflowTemplate the stack installs, then one holdout image classified
through the Gateway (python -m serving.client at the stack's inferenceUrl). A failing step is one
line: the step, the command, its exit status and the tail of its stderr. Whatever happens (a failure,
Ctrl-C), the teardown follows: `pulumi destroy`, `pulumi stack rm`, the k3d cluster if it outlived
the destroy, and Pulumi.local.yaml as it was (`pulumi stack init` rewrites it with the stack's
encryption salt, so do not edit it during a run). --keep tears nothing down and says how to later.
It runs in the dev virtualenv (`make e2e`) and drives pulumi, k3d and kubectl as a user would.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from PIL import Image

from common.cluster_names import WORKFLOW_TEMPLATE_NAME
from pipeline import argo
from trainer.fashion_mnist import read_split

PROJECT = Path(__file__).resolve().parent.parent
STACK = "local"
STACK_CONFIG = PROJECT / f"Pulumi.{STACK}.yaml"
WORK_ROOT = PROJECT / ".cache" / "e2e"  # a run-* directory per run: its Pulumi state, kubeconfig, image
# The throwaway stack's passphrase, unless you set your own (PULUMI_CONFIG_PASSPHRASE[_FILE]): the
# state lives and dies with the run, so there is nothing a real secret would protect.
PASSPHRASE = "dist-ml-e2e-throwaway"
PASSPHRASE_VARIABLES = ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE")
CLUSTER_NAME_KEY = "dist-ml:cluster.name"
# The phases that end an Argo Workflow (Workflow.status.phase).
WORKFLOW_SUCCEEDED = "Succeeded"
WORKFLOW_FAILED = ("Failed", "Error")
DEFAULT_TIMEOUT_MINUTES = 120.0  # the run trains every variant on the full dataset
WORKFLOW_POLL_SECONDS = 15.0
# The serve step writes the route; the Gateway must take it up before a request can pass.
ROUTE_CONDITIONS = ("Accepted", "ResolvedRefs")
ROUTE_WAIT_SECONDS = 120.0
ROUTE_POLL_SECONDS = 5.0
KUBECTL_REQUEST_TIMEOUT = "--request-timeout=30s"
INFERENCE_URL = re.compile(r"^(?P<base>https?://[^/]+)/v1/models/(?P<model>[^/:]+):predict$")
# One image that training never read, sent as the PNG a client would send.
HOLDOUT = PROJECT / "datasets" / "fashion-mnist-holdout"
INTERRUPT_GRACE_SECONDS = 120.0  # how long a Ctrl-C'd pulumi may take to stop its operation cleanly
TAIL_LINES = 4
TAIL_CHARS = 400
EXIT_FAILED, EXIT_INTERRUPTED = 1, 130


class StepFailed(Exception):
    """What went wrong, in one line."""


@dataclasses.dataclass
class Run:
    """This run's settings and what it has made so far, so that teardown undoes exactly that."""
    directory: Path
    env: dict[str, str]
    config_text: bytes  # Pulumi.local.yaml before the run
    timeout_seconds: float
    step: str = ""  # the step under way, for an interruption's message
    stack_created: bool = False
    up_started: bool = False
    cluster: str = ""  # the k3d cluster `pulumi up` creates, once known not to exist before
    namespace: str = ""
    route: str = ""
    base_url: str = ""
    model: str = ""
    workflow: str = ""

    @property
    def backend(self) -> str:
        return self.env["PULUMI_BACKEND_URL"]

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    what: str
    action: Callable[[Run], None]


# ---- commands ------------------------------------------------------------------------------------

def say(line: str) -> None:
    print(f"e2e: {line}", flush=True)


def elapsed(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m {rest:02d}s" if minutes else f"{seconds:.1f}s"


def describe_exit(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"


def tee(stream: Iterable[str], tail: collections.deque) -> None:
    """Copies a child's stderr to ours as it comes, keeping its last lines for a failure message."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        if line.strip():
            tail.append(line.strip())


def stop(process: subprocess.Popen) -> None:
    """Ctrl-C for the child's process group (pulumi cancels its operation cleanly), then a kill."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(INTERRUPT_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def call(argv: Sequence[str], env: Mapping[str, str], *, capture: bool = False,
         stdin: str | None = None) -> str:
    """Runs `argv` from the project's root; returns its stdout when captured, else "". Uncaptured
    stdout and all of stderr pass through to ours; a non-zero exit status raises StepFailed. Each
    child has a session of its own: a Ctrl-C reaches this script, which passes it on to the child
    and then tears down."""
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    try:
        process = subprocess.Popen(
            list(argv), cwd=PROJECT, env=dict(env), text=True, errors="replace", start_new_session=True,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE)
    except OSError as error:
        raise StepFailed(f"`{shlex.join(argv)}` could not run: {error.strerror or error}") from None
    reader = threading.Thread(target=tee, args=(process.stderr, tail), daemon=True)
    reader.start()
    try:
        if stdin is not None:
            process.stdin.write(stdin)
            process.stdin.close()
        stdout = process.stdout.read() if capture else ""
        code = process.wait()
    except KeyboardInterrupt:
        stop(process)
        raise
    reader.join()
    if code != 0:
        said = " | ".join(tail)
        said = said if len(said) <= TAIL_CHARS else "..." + said[-TAIL_CHARS:]
        raise StepFailed(f"`{shlex.join(argv)}` {describe_exit(code)}" + (f": {said}" if said else ""))
    return stdout


def pulumi(run: Run, *args: str, capture: bool = False) -> str:
    return call(["pulumi", *args], run.env, capture=capture)


def kubectl_json(run: Run, *args: str) -> dict:
    argv = ["kubectl", *args, "--namespace", run.namespace, "--output", "json", KUBECTL_REQUEST_TIMEOUT]
    stdout = call(argv, run.env, capture=True)
    try:
        return json.loads(stdout)
    except ValueError:
        raise StepFailed(f"`{shlex.join(argv)}` printed no JSON: {stdout[:200]!r}") from None


def cluster_exists(run: Run, name: str) -> bool:
    """Whether k3d knows the cluster (its "No nodes found" on stderr is the answer no, not shown)."""
    return subprocess.run(["k3d", "cluster", "get", name], cwd=PROJECT, env=run.env, capture_output=True,
                          stdin=subprocess.DEVNULL).returncode == 0


# ---- the steps -----------------------------------------------------------------------------------

def preflight(run: Run) -> None:
    call([sys.executable, "-m", "infra.preflight", "--stack", STACK], run.env)


def create_stack(run: Run) -> None:
    """The stack, in this run's own backend; then the name of the cluster `pulumi up` will create,
    which must not exist yet: the stack creates its cluster and deletes it on destroy."""
    pulumi(run, "stack", "init", STACK, "--no-select")
    run.stack_created = True
    name = pulumi(run, "config", "get", "--path", CLUSTER_NAME_KEY, "--stack", STACK, capture=True).strip()
    if cluster_exists(run, name):
        raise StepFailed(f"a k3d cluster named {name} already exists, and the stack creates its own: "
                         f"`k3d cluster delete {name}`, or set {CLUSTER_NAME_KEY} in {STACK_CONFIG.name}")
    run.cluster = name


def read_outputs(run: Run, outputs: dict) -> None:
    """The kubeconfig (written 0600, for kubectl), the route's namespace and name, and the
    Gateway's address and the model's name from inferenceUrl."""
    try:
        namespace, _, route = outputs["inferenceRoute"].partition("/")
        url = INFERENCE_URL.match(outputs["inferenceUrl"])
        kubeconfig = outputs["kubeconfig"]
    except (KeyError, AttributeError, TypeError) as error:
        raise StepFailed(f"the stack outputs lack {error}: {sorted(outputs)}") from None
    if not (namespace and route and url):
        raise StepFailed(f"unexpected stack outputs inferenceRoute={outputs['inferenceRoute']!r}, "
                         f"inferenceUrl={outputs['inferenceUrl']!r}")
    run.kubeconfig.touch(mode=0o600)
    run.kubeconfig.write_text(kubeconfig)
    run.env["KUBECONFIG"] = str(run.kubeconfig)
    run.namespace, run.route = namespace, route
    run.base_url, run.model = url["base"], url["model"]


def deploy(run: Run) -> None:
    run.up_started = True  # from here on a failure may leave resources behind: destroy them
    pulumi(run, "up", "--yes", "--stack", STACK, "--skip-preview")
    outputs = pulumi(run, "stack", "output", "--json", "--show-secrets", "--stack", STACK, capture=True)
    read_outputs(run, json.loads(outputs))


def submit(run: Run) -> None:
    argv = ["kubectl", "create", "--namespace", run.namespace, "--filename", "-", "--output", "name"]
    created = call(argv, run.env, capture=True, stdin=json.dumps(argo.workflow())).strip()
    run.workflow = created.rpartition("/")[2]
    if not run.workflow:
        raise StepFailed(f"`{shlex.join(argv)}` named no workflow (it printed {created!r})")
    say(f"submitted workflow {run.namespace}/{run.workflow}")


def wait_for_workflow(run: Run) -> None:
    """Polls the workflow's phase until it ends or the timeout passes; prints each change."""
    deadline, seen, name = time.monotonic() + run.timeout_seconds, None, f"{run.namespace}/{run.workflow}"
    while True:
        status = kubectl_json(run, "get", "workflow", run.workflow).get("status", {})
        phase, progress = status.get("phase", ""), status.get("progress", "")
        state = (phase or "not started") + (f", {progress} steps" if progress else "")
        if (phase, progress) != seen:
            seen = (phase, progress)
            say(f"workflow {name}: {state}")
        if phase == WORKFLOW_SUCCEEDED:
            return
        if phase in WORKFLOW_FAILED:
            raise StepFailed(f"workflow {name} ended {phase}: {status.get('message') or 'no message'} "
                             "(--keep leaves it up for `argo get` or `kubectl describe`)")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StepFailed(f"workflow {name} did not finish within {run.timeout_seconds / 60:g} min "
                             f"({state}); see --timeout-minutes")
        time.sleep(min(WORKFLOW_POLL_SECONDS, remaining))


def route_conditions(route: dict) -> list[dict[str, str]]:
    """For each Gateway (parent) that took up the route, its conditions: type -> status."""
    return [{condition.get("type", ""): condition.get("status", "")
             for condition in parent.get("conditions", [])}
            for parent in route.get("status", {}).get("parents", [])]


def wait_for_route(run: Run) -> None:
    deadline = time.monotonic() + ROUTE_WAIT_SECONDS
    while True:
        parents = route_conditions(kubectl_json(run, "get", "httproute", run.route))
        if any(all(parent.get(kind) == "True" for kind in ROUTE_CONDITIONS) for parent in parents):
            return
        if time.monotonic() >= deadline:
            raise StepFailed(f"route {run.namespace}/{run.route} is not {' and '.join(ROUTE_CONDITIONS)} "
                             f"after {ROUTE_WAIT_SECONDS:.0f}s: {parents or 'no Gateway took it up'}")
        time.sleep(ROUTE_POLL_SECONDS)


def holdout_pngs(directory: Path, count: int) -> list[Path]:
    """The holdout's first `count` images as `<directory>/<index>-<class id>.png`, the names and
    encoding benchmarks.holdout_accuracy gives them (without its TensorFlow import)."""
    holdout = read_split(HOLDOUT, "test")
    paths = [directory / f"{index:04d}-{label}.png" for index, label in enumerate(holdout.labels[:count])]
    for path, image in zip(paths, holdout.images, strict=False):
        Image.fromarray(image[..., 0], mode="L").save(path, format="PNG")
    return paths


def holdout_png(directory: Path) -> Path:
    """The holdout's first image as `<directory>/0000-<class id>.png`."""
    return holdout_pngs(directory, 1)[0]


def predict(run: Run) -> None:
    """One holdout image through the Gateway and the route, as a user's request goes."""
    wait_for_route(run)
    image = holdout_png(run.directory)
    call([sys.executable, "-m", "serving.client", "predict", str(image), "--url", run.base_url,
          "--model-name", run.model], run.env)


STEPS = (
    Step("preflight", "the tools, new enough (python -m infra.preflight)", preflight),
    Step("stack", f"a throwaway stack `{STACK}` in this run's file backend", create_stack),
    Step("up", "pulumi up: the k3d cluster, images, platform, pipeline, serving, Gateway", deploy),
    Step("submit", f"a Workflow of workflowtemplate/{WORKFLOW_TEMPLATE_NAME}", submit),
    Step("workflow", "wait for the run to end", wait_for_workflow),
    Step("predict", "a holdout image through the Gateway (python -m serving.client)", predict),
)


def run_steps(run: Run) -> None:
    for index, step in enumerate(STEPS, 1):
        run.step = f"{index}/{len(STEPS)} {step.name}"
        say(f"==> [{run.step}] {step.what}")
        started = time.monotonic()
        try:
            step.action(run)
        except StepFailed as error:
            raise StepFailed(f"step {run.step} failed after {elapsed(time.monotonic() - started)}: "
                             f"{error}") from None
        say(f"<== [{run.step}] ok in {elapsed(time.monotonic() - started)}")


# ---- teardown ------------------------------------------------------------------------------------

def attempt(what: str, argv: Sequence[str], run: Run, problems: list[str]) -> bool:
    """One teardown command, announced and timed; a failure is noted and teardown goes on."""
    say(f"==> [teardown] {what}")
    started = time.monotonic()
    try:
        call(argv, run.env)
    except StepFailed as error:
        problems.append(f"teardown {what} failed: {error}")
        say(problems[-1])
        return False
    say(f"<== [teardown] {what}: ok in {elapsed(time.monotonic() - started)}")
    return True


def restore_config(run: Run) -> None:
    if not STACK_CONFIG.exists() or STACK_CONFIG.read_bytes() != run.config_text:
        STACK_CONFIG.write_bytes(run.config_text)
        say(f"restored {STACK_CONFIG.name} (`pulumi stack init` had rewritten it with the stack's salt)")


def teardown(run: Run) -> list[str]:
    """Undoes what the run made, each part whatever became of the others; returns the failures.
    The stack is removed only once destroyed (a failed destroy leaves the run's directory, its
    state, for a look); a cluster that outlived the destroy is deleted with k3d."""
    problems: list[str] = []
    destroy = ["pulumi", "destroy", "--yes", "--stack", STACK, "--skip-preview"]
    destroyed = not run.up_started or attempt("pulumi destroy", destroy, run, problems)
    if run.cluster and cluster_exists(run, run.cluster):
        attempt(f"k3d cluster delete {run.cluster}", ["k3d", "cluster", "delete", run.cluster], run, problems)
    if run.stack_created and destroyed:
        remove = ["pulumi", "stack", "rm", "--yes", "--preserve-config", "--stack", STACK]
        attempt("pulumi stack rm", remove, run, problems)
    restore_config(run)
    if problems:
        say(f"left {run.directory} (the Pulumi state: PULUMI_BACKEND_URL={run.backend}) for a look")
    else:
        shutil.rmtree(run.directory)
    return problems


def keep_message(run: Run) -> None:
    """How to reach what --keep left up, and how to tear it down by hand later."""
    original = run.directory / f"{STACK_CONFIG.name}.orig"
    original.write_bytes(run.config_text)
    ours = run.env.get("PULUMI_CONFIG_PASSPHRASE") == PASSPHRASE
    passphrase = f"PULUMI_CONFIG_PASSPHRASE={PASSPHRASE}" if ours else "(and your PULUMI_CONFIG_PASSPHRASE)"
    reach = f"; kubectl: export KUBECONFIG={run.kubeconfig}" if run.kubeconfig.exists() else ""
    say(f"--keep: nothing torn down{reach}")
    say(f"tear down later, from {PROJECT}:\n"
        f"  export PULUMI_BACKEND_URL={run.backend} {passphrase}\n"
        f"  pulumi destroy --yes --stack {STACK} && pulumi stack rm --yes --preserve-config --stack {STACK}\n"
        f"  cp {original} {STACK_CONFIG.name} && rm -rf {run.directory}")


# ---- main ----------------------------------------------------------------------------------------

def start(timeout_minutes: float) -> Run:
    """A fresh run directory (the Pulumi backend, the kubeconfig, the image) and the environment
    every command gets: this run's backend, a passphrase, no update check."""
    WORK_ROOT.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="run-", dir=WORK_ROOT))
    (directory / "state").mkdir()
    env = {**os.environ, "PULUMI_BACKEND_URL": (directory / "state").as_uri(),
           "PULUMI_SKIP_UPDATE_CHECK": "true"}
    if not any(env.get(name) for name in PASSPHRASE_VARIABLES):
        env["PULUMI_CONFIG_PASSPHRASE"] = PASSPHRASE
    return Run(directory, env, STACK_CONFIG.read_bytes(), timeout_minutes * 60)


def positive_minutes(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of minutes, got {text}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true",
                        help="tear nothing down, whatever the outcome: the cluster and the stack stay up")
    parser.add_argument("--timeout-minutes", type=positive_minutes, default=DEFAULT_TIMEOUT_MINUTES,
                        help=f"how long to wait for the workflow (default {DEFAULT_TIMEOUT_MINUTES:g})")
    return parser.parse_args(argv)


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (a cancelled CI job) ends the run as Ctrl-C does: torn down


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)
    started = time.monotonic()
    run = start(args.timeout_minutes)
    say(f"run directory {run.directory}; Pulumi backend {run.backend}")
    failure, status = "", 0
    try:
        run_steps(run)
    except StepFailed as error:
        failure, status = str(error), EXIT_FAILED
    except KeyboardInterrupt:
        failure, status = f"interrupted during step {run.step}", EXIT_INTERRUPTED
    if failure:
        say(f"FAILED: {failure}")
    if args.keep:
        keep_message(run)
    else:
        for name in ("SIGINT", "SIGTERM"):  # a teardown cut short would leave the cluster behind
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        say("tearing down (Ctrl-C is ignored until it is done)")
        problems = teardown(run)
        status = status or (EXIT_FAILED if problems else 0)
    say(f"{'passed' if status == 0 else 'failed'} in {elapsed(time.monotonic() - started)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
