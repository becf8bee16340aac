"""`make e2e` (tools/e2e.py) against stand-ins: fake pulumi, kubectl, k3d, docker and git first (and
alone) on PATH, each logging its call and answering as the real tool does, and the model server a
small HTTP server on 127.0.0.1 that the real `python -m serving.client` calls. The script runs from a
copy in a scratch project, so that its Pulumi.local.yaml, not the repository's, is the one rewritten
and restored. Then the workflows under .github/workflows through actionlint."""

from __future__ import annotations

import base64
import http.server
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO_ROOT, in_ci
from PIL import Image

from pipeline import argo
from trainer.fashion_mnist import read_split

pytestmark = pytest.mark.slow  # runs the e2e script against stand-ins and a local server

E2E = REPO_ROOT / "tools" / "e2e.py"
WORKFLOWS = sorted((REPO_ROOT / ".github" / "workflows").glob("*.yml"))
SCRIPT_TIMEOUT_SECONDS = 60
WORKFLOW_NAME = "dist-ml-pipeline-x7k2p"
# What every fake does, by its own name. `scenario` (JSON in E2E_FAKE_SCENARIO) bends it: "fail" maps
# "<tool> <subcommand>" to an exit status; "phase" and "message" are the workflow's. The k3d cluster
# exists while the file `cluster` does in the fakes' directory: `pulumi up` makes it (also when it
# then fails, as when the platform fails after the cluster is up); destroy and k3d delete remove it.
FAKE = r'''#!@PYTHON@ -S
import json, os, sys
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
here = os.path.dirname(os.path.abspath(sys.argv[0]))
scenario = json.loads(os.environ["E2E_FAKE_SCENARIO"])
command = " ".join(args)
call = {"tool": tool, "args": args, "backend": os.environ.get("PULUMI_BACKEND_URL"),
        "passphrase": os.environ.get("PULUMI_CONFIG_PASSPHRASE"), "kubeconfig": os.environ.get("KUBECONFIG")}
if tool == "kubectl" and args[:1] == ["create"]:
    call["stdin"] = sys.stdin.read()
with open(os.environ["E2E_FAKE_LOG"], "a") as log:
    log.write(json.dumps(call) + "\n")
cluster = os.path.join(here, "cluster")
status = scenario.get("fail", {}).get(f"{tool} {args[0] if args else ''}")


def done(out="", code=0):
    if out:
        print(out)
    sys.exit(code)


if tool == "pulumi" and args[0] == "up":
    open(cluster, "w").close()
if status is not None:
    print(f"error: {tool} {args[0]} failed as the test wants", file=sys.stderr)
    sys.exit(status)
if tool == "git" and command == "--version":
    done("git version 2.39.5")
if tool == "docker" and args[0] in ("version", "info") and args[1] == "--format":
    done("27.3.1")
if tool == "k3d":
    if command == "version":
        done("k3d version v5.8.3\nk3s version v1.31.5-k3s1 (default)")
    if args[:2] == ["cluster", "get"]:
        if os.path.exists(cluster):
            done("NAME      SERVERS   AGENTS   LOADBALANCER\ndist-ml   1/1       0/0      true")
        print("FATA[0000] No nodes found for given cluster", file=sys.stderr)
        sys.exit(1)
    if args[:2] == ["cluster", "delete"]:
        os.remove(cluster)
        done()
if tool == "pulumi":
    if command == "version":
        done("v3.190.0")
    if args[:2] == ["stack", "init"]:  # the passphrase provider's salt, written into the stack's file
        with open("Pulumi.local.yaml", "a") as config:
            config.write("encryptionsalt: v1:fakesalt\n")
        done("Created stack 'local'")
    if args[:2] == ["config", "get"]:
        done("dist-ml")
    if args[0] == "up":
        done("Updating (local): ... Resources: 99 created")
    if args[:2] == ["stack", "output"]:
        done(json.dumps({"kubeconfig": "apiVersion: v1\nkind: Config\n", "inferenceService": "dist-ml/fmnist",
                         "inferenceRoute": "dist-ml/fmnist-split", "inferenceUrl": scenario["inferenceUrl"]}))
    if args[0] == "destroy":
        if os.path.exists(cluster):
            os.remove(cluster)
        done("Destroying (local): ... Resources: 99 deleted")
    if args[:2] == ["stack", "rm"]:
        if "--preserve-config" not in args:  # what the real one does without it
            os.remove("Pulumi.local.yaml")
        done("Stack 'local' has been removed!")
if tool == "kubectl":
    if command == "version --client -o json":
        done(json.dumps({"clientVersion": {"gitVersion": "v1.35.8"}}))
    if args[0] == "create":
        done("workflow.argoproj.io/" + scenario["workflow"])
    if args[:2] == ["get", "workflow"]:
        phase = scenario.get("phase", "Succeeded")
        done(json.dumps({"status": {"phase": phase, "message": scenario.get("message", ""),
                                    "progress": "9/9" if phase == "Succeeded" else "2/9"}}))
    if args[:2] == ["get", "httproute"]:
        done(json.dumps({"status": {"parents": [{"conditions": [
            {"type": "Accepted", "status": "True"}, {"type": "ResolvedRefs", "status": "True"}]}]}}))
print(f"fake {tool}: unexpected arguments {args}", file=sys.stderr)
sys.exit(64)
'''
TOOLS = ("pulumi", "kubectl", "k3d", "docker", "git")
PREFLIGHT_PROBES = {"--version", "version", "info"}
STEP_START = re.compile(r"^e2e: ==> \[(\d+/\d+ \w+)\] ")
PREDICTION = {"predictions": [{"class_name": "Ankle boot", "probabilities": [0.01] * 9 + [0.91]}]}


def load_e2e():
    spec = importlib.util.spec_from_file_location("e2e", E2E)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class ModelServer(http.server.ThreadingHTTPServer):
    """The Gateway's stand-in on 127.0.0.1: answers a v1 predict as the model server does, or with
    `error_status`; keeps each request's path and JSON body."""

    def __init__(self, error_status: int | None = None):
        self.error_status, self.requests = error_status, []
        super().__init__(("127.0.0.1", 0), PredictHandler)


class PredictHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server: ModelServer = self.server
        server.requests.append((self.path, json.loads(self.rfile.read(int(self.headers["content-length"])))))
        answer = {"error": "model fmnist is not ready"} if server.error_status else PREDICTION
        body = json.dumps(answer).encode()
        self.send_response(server.error_status or 200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def model_server(request):
    server = ModelServer(getattr(request, "param", None))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


class Harness:
    """A scratch project holding a copy of tools/e2e.py and Pulumi.local.yaml, the fakes, and the
    log of their calls."""

    def __init__(self, root: Path, server: ModelServer):
        self.project, self.bin, self.log = root / "project", root / "bin", root / "calls.jsonl"
        (self.project / "tools").mkdir(parents=True)
        shutil.copy(E2E, self.project / "tools" / "e2e.py")
        shutil.copy(REPO_ROOT / "Pulumi.local.yaml", self.project)
        (self.project / "datasets").symlink_to(REPO_ROOT / "datasets")
        self.config = self.project / "Pulumi.local.yaml"
        self.original_config = self.config.read_bytes()
        self.bin.mkdir()
        for tool in TOOLS:
            (self.bin / tool).write_text(FAKE.replace("@PYTHON@", sys.executable))
            (self.bin / tool).chmod(0o755)
        self.url = f"http://127.0.0.1:{server.server_address[1]}/v1/models/fmnist:predict"

    def env(self, scenario: dict) -> dict[str, str]:
        # The repository on PYTHONPATH: the script's preflight and client run from the scratch project.
        env = {name: value for name, value in os.environ.items() if not name.startswith("PULUMI_")}
        scenario = {"inferenceUrl": self.url, "workflow": WORKFLOW_NAME, **scenario}
        return {**env, "PATH": str(self.bin), "PYTHONPATH": str(REPO_ROOT), "E2E_FAKE_LOG": str(self.log),
                "E2E_FAKE_SCENARIO": json.dumps(scenario)}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, str(self.project / "tools" / "e2e.py"), *args]

    def run(self, *args: str, **scenario) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), env=self.env(scenario), capture_output=True, text=True,
                              timeout=SCRIPT_TIMEOUT_SECONDS)

    def calls(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def commands(self) -> list[str]:
        """Each call as the tool and its (sub)command, the words before the first flag, up to two;
        the preflight's version probes left out."""
        named = []
        for call in self.calls():
            if call["args"][0] in PREFLIGHT_PROBES:
                continue
            words = call["args"][:2]
            words = words[:next((i for i, word in enumerate(words) if word.startswith("-")), len(words))]
            named.append(" ".join([call["tool"], *words]))
        return named

    def run_directories(self) -> list[Path]:
        return sorted((self.project / ".cache" / "e2e").glob("run-*"))


@pytest.fixture
def harness(tmp_path, model_server) -> Harness:
    return Harness(tmp_path, model_server)


def e2e_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("e2e: ")]


def failure_line(result: subprocess.CompletedProcess) -> str:
    failed = [line for line in e2e_lines(result) if line.startswith("e2e: FAILED: ")]
    assert len(failed) == 1, result.stdout + result.stderr
    return failed[0]


def test_the_happy_path_runs_every_step_in_order_then_tears_down(harness, model_server):
    result = harness.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert harness.commands() == [
        "pulumi stack init", "pulumi config get", "k3d cluster get", "pulumi up", "pulumi stack output",
        "kubectl create", "kubectl get workflow", "kubectl get httproute",
        "pulumi destroy", "k3d cluster get", "pulumi stack rm",
    ]
    calls = harness.calls()
    pulumi_calls = [call for call in calls if call["tool"] == "pulumi" and call["args"][0] != "version"]
    backends = {call["backend"] for call in pulumi_calls}
    assert len(backends) == 1 and backends.pop().startswith((harness.project / ".cache" / "e2e").as_uri())
    assert {call["passphrase"] for call in pulumi_calls} == {"dist-ml-e2e-throwaway"}
    by_command = {" ".join([call["tool"], *call["args"]]): call for call in calls}
    assert "pulumi up --yes --stack local --skip-preview" in by_command
    assert "pulumi stack rm --yes --preserve-config --stack local" in by_command
    created = next(call for call in calls if call["args"][0] == "create")
    assert created["args"] == ["create", "--namespace", "dist-ml", "--filename", "-", "--output", "name"]
    assert json.loads(created["stdin"]) == argo.workflow()
    assert created["kubeconfig"].endswith("/kubeconfig")
    polled = next(call for call in calls if call["args"][:2] == ["get", "workflow"])
    assert polled["args"] == ["get", "workflow", WORKFLOW_NAME, "--namespace", "dist-ml", "--output", "json",
                              "--request-timeout=30s"]
    assert polled["kubeconfig"] == created["kubeconfig"]

    # The client's one request reached the Gateway's stand-in, after the route check, before destroy.
    [(path, body)] = model_server.requests
    assert path == "/v1/models/fmnist:predict"
    image = Image.open(io.BytesIO(base64.b64decode(body["instances"][0]["image_bytes"]["b64"])))
    assert (image.mode, image.size) == ("L", (28, 28))
    predicted = re.search(r"/0000-\d\.png: Ankle boot \(91\.0%\)$", result.stdout, re.MULTILINE)
    assert predicted and predicted.start() < result.stdout.index("e2e: ==> [teardown] pulumi destroy")

    lines = e2e_lines(result)
    starts = [match[1] for match in map(STEP_START.match, lines) if match]
    assert starts == ["1/6 preflight", "2/6 stack", "3/6 up", "4/6 submit", "5/6 workflow", "6/6 predict"]
    assert sum(line.startswith("e2e: <== [") and " ok in " in line for line in lines) == 6 + 2
    assert lines[-1].startswith("e2e: passed in ")
    # Torn down: Pulumi.local.yaml as it was (stack init had appended the salt), no run directory.
    assert harness.config.read_bytes() == harness.original_config
    assert harness.run_directories() == []


def test_a_failing_pulumi_up_names_the_step_and_still_tears_down(harness, model_server):
    result = harness.run(fail={"pulumi up": 1})
    assert result.returncode == 1
    assert failure_line(result).startswith(
        "e2e: FAILED: step 3/6 up failed after ")
    assert failure_line(result).endswith(
        ": `pulumi up --yes --stack local --skip-preview` exited 1: "
        "error: pulumi up failed as the test wants")
    assert harness.commands() == [
        "pulumi stack init", "pulumi config get", "k3d cluster get", "pulumi up",
        "pulumi destroy", "k3d cluster get", "pulumi stack rm",
    ]
    assert model_server.requests == []
    assert harness.config.read_bytes() == harness.original_config
    assert e2e_lines(result)[-1].startswith("e2e: failed in ")


def test_a_failed_workflow_reports_its_phase_and_message_and_tears_down(harness, model_server):
    result = harness.run(phase="Failed", message="child 'pipeline-train-cnn' failed")
    assert result.returncode == 1
    assert ("step 5/6 workflow failed after" in failure_line(result)
            and f": workflow dist-ml/{WORKFLOW_NAME} ended Failed: child 'pipeline-train-cnn' failed "
                "(--keep leaves it up" in failure_line(result))
    assert harness.commands()[-4:] == ["kubectl get workflow", "pulumi destroy", "k3d cluster get",
                                       "pulumi stack rm"]
    assert model_server.requests == []


@pytest.mark.parametrize("model_server", [503], indirect=True)
def test_a_failing_client_still_tears_down(harness, model_server):
    result = harness.run()
    assert result.returncode == 1
    line = failure_line(result)
    assert "step 6/6 predict failed after" in line
    assert "-m serving.client predict" in line and " exited 1: " in line
    assert "serving.client: error: 503 from http://127.0.0.1:" in line and "model fmnist is not ready" in line
    assert len(model_server.requests) == 1
    assert harness.commands()[-3:] == ["pulumi destroy", "k3d cluster get", "pulumi stack rm"]
    assert harness.config.read_bytes() == harness.original_config


def test_keep_tears_nothing_down_and_says_how(harness):
    result = harness.run("--keep")
    assert result.returncode == 0, result.stdout + result.stderr
    commands = harness.commands()
    assert commands[-1] == "kubectl get httproute"
    assert not any(command.startswith(("pulumi destroy", "pulumi stack rm", "k3d cluster delete"))
                   for command in commands)
    [directory] = harness.run_directories()
    assert (directory / "kubeconfig").stat().st_mode & 0o777 == 0o600
    assert (directory / "Pulumi.local.yaml.orig").read_bytes() == harness.original_config
    assert harness.config.read_bytes().endswith(b"encryptionsalt: v1:fakesalt\n")  # the kept stack's
    assert f"export PULUMI_BACKEND_URL={(directory / 'state').as_uri()} " in result.stdout
    assert "pulumi destroy --yes --stack local && pulumi stack rm --yes --preserve-config" in result.stdout


def test_ctrl_c_while_waiting_for_the_workflow_tears_down(harness, model_server):
    process = subprocess.Popen(harness.argv(), env=harness.env({"phase": "Running"}), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:
            if line.startswith(f"e2e: workflow dist-ml/{WORKFLOW_NAME}: Running"):
                process.send_signal(signal.SIGINT)
                break
        stdout, _ = process.communicate(timeout=SCRIPT_TIMEOUT_SECONDS)
    finally:
        process.kill()
    assert process.returncode == 130
    assert "e2e: FAILED: interrupted during step 5/6 workflow" in stdout
    assert harness.commands()[-3:] == ["pulumi destroy", "k3d cluster get", "pulumi stack rm"]
    assert harness.config.read_bytes() == harness.original_config
    assert model_server.requests == []


def test_a_workflow_still_running_at_the_timeout_fails_the_step(harness):
    result = harness.run("--timeout-minutes", "0.005", phase="Running")
    assert result.returncode == 1
    assert (f": workflow dist-ml/{WORKFLOW_NAME} did not finish within 0.005 min (Running, 2/9 steps); "
            "see --timeout-minutes") in failure_line(result)
    assert harness.commands()[-3:] == ["pulumi destroy", "k3d cluster get", "pulumi stack rm"]


def test_an_existing_cluster_is_left_alone(harness):
    (harness.bin / "cluster").touch()  # someone's own k3d cluster of the same name
    result = harness.run()
    assert result.returncode == 1
    assert "step 2/6 stack failed after" in failure_line(result)
    assert "a k3d cluster named dist-ml already exists" in failure_line(result)
    # Neither up nor destroy; the stack is removed; the cluster is not deleted.
    assert harness.commands() == ["pulumi stack init", "pulumi config get", "k3d cluster get",
                                  "pulumi stack rm"]
    assert (harness.bin / "cluster").exists()


def test_a_failed_destroy_deletes_the_cluster_and_keeps_the_state(harness):
    result = harness.run(fail={"pulumi destroy": 1})
    assert result.returncode == 1
    assert "e2e: teardown pulumi destroy failed: `pulumi destroy --yes --stack local --skip-preview` " \
           "exited 1" in result.stdout
    assert harness.commands()[-3:] == ["pulumi destroy", "k3d cluster get", "k3d cluster delete"]
    [directory] = harness.run_directories()
    assert f"e2e: left {directory} (the Pulumi state" in result.stdout
    assert harness.config.read_bytes() == harness.original_config


def test_the_holdout_png_is_the_first_holdout_image(tmp_path):
    path = load_e2e().holdout_png(tmp_path)
    holdout = read_split(REPO_ROOT / "datasets" / "fashion-mnist-holdout", "test")
    assert path.name == f"0000-{holdout.labels[0]}.png"
    with Image.open(path) as image:
        assert image.mode == "L"
        assert image.tobytes() == holdout.images[0].tobytes()


def actionlint() -> str:
    found = shutil.which("actionlint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if found is None:
        if in_ci():
            pytest.fail("actionlint is not installed (CI=true, so not skipped): `make` installs the dev lock")
        pytest.skip("actionlint is not installed: `make` installs the dev lock")
    return found


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=[path.name for path in WORKFLOWS])
def test_the_workflow_passes_actionlint(workflow):
    result = subprocess.run([actionlint(), "-no-color", str(workflow.relative_to(REPO_ROOT))], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
