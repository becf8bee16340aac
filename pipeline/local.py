"""The local engine: every step as processes on this machine, as Argo and a TrainJob run them as pods.

- A step's replicas are processes; training replicas get the environment a TrainJob's pods get, each
  task's hostname on a free port, and build their TF_CONFIG from it (trainer.launch, trainer.cluster);
  one that could not bind its port starts the attempt again on other ports (launch.PortTaken).
  Under parameter servers a chief and the ps tasks join the workers (trainer.launch): the step
  ends when the chief does, a lost worker is started again, a lost chief or ps fails the attempt.
- Steps start when their dependencies have finished, at most `parallelism` at once.
- A failed step is restarted whole (as JobSet's failurePolicy restarts a TrainJob's pods; training
  resumes from BackupAndRestore) up to `retries` times, then the run fails naming the step and
  quoting its log.
- Memoization, as Argo's: a step whose key is unchanged and whose outputs are intact is skipped.
  Ingest's key is the data source plus the dataset's checksums (valid for `memoizeMaxAge`);
  training's and selection's keys are their commands, replicas, the trainer's code and the
  digests of what their inputs came from.
- Logs: STORAGE_ROOT/logs/<time>-<pid>/<step>/worker-<i>.log; the steps' own WARNING lines are
  repeated on the console. Ctrl-C (SIGINT) or SIGTERM stops every child: `install_stop_handlers`.

How each kind of step runs is its handler in HANDLERS: what its memo key is, what its committed
outputs hold, that it is the one step served after the others, or that it runs against the served
step (the canary's rollout, pipeline.local_canary); a kind without one is an error naming the step
before anything starts.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from PIL import Image

from pipeline import local_canary, local_tracking
from pipeline.config import PipelineConfig
from pipeline.definition import (
    Layout,
    PipelineError,
    Step,
    StepKind,
    build_steps,
    ingest_memo_key,
    require_handlers,
)
from serving import client
from serving.process import running_server
from trainer import atomic, launch, model_repository, tracking
from trainer.dataset_files import FILE_NAMES
from trainer.fashion_mnist import CLASS_NAMES, DatasetError, load_split, md5_of, read_manifest
from trainer.model_repository import LAST_SELECTION_FILE

POLL_SECONDS = 0.2
LOGS_DIR = "logs"
MEMO_DIR = "memo"
CHECKPOINT_KEY_FILE = "pipeline-key.txt"
METRICS_FILE = "metrics.json"  # written by trainer.train inside its export
EXAMPLE_TEST_IMAGE = 0
TRAINER_SOURCES = Path(__file__).resolve().parents[1] / "trainer"

Printer = Callable[[str], None]


class StepFailed(RuntimeError):
    """A step failed after its retries; the message names it and quotes the end of its log."""


@dataclasses.dataclass
class Outcome:
    step: str
    seconds: float
    memoized: bool


@dataclasses.dataclass
class Attempt:
    step: Step
    workers: list[launch.Worker]
    number: int  # 1 for the first try
    started: float
    port_retries: int = 0  # starts of this try again because a port was taken (launch.PortTaken)


@dataclasses.dataclass(frozen=True)
class RunResult:
    outcomes: dict[str, Outcome]
    selection: dict
    version_dir: Path
    example: str  # the served model's answer to one test image
    log_dir: Path
    rollout: dict | None  # the canary's decision (serving.canary.Decision.as_record), None: no canary


def stop_on_signal(_signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt  # SIGTERM gets the same clean-up as Ctrl-C


def install_stop_handlers() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, which stops every child; call from the main thread.

    Python installs its own SIGINT handler only when the process starts with SIGINT at its default:
    started with it ignored (a background job of a non-interactive shell, some CI runners), Ctrl-C
    and `kill -INT` were ignored and the run went on. So both are set here, whatever they were.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, stop_on_signal)


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def trainer_code_digest() -> str:
    return digest({path.name: path.read_text() for path in sorted(TRAINER_SOURCES.glob("*.py"))})


class Memo:
    """The memo of each step, STORAGE_ROOT/memo/<step>.json: its key, duration and output digest."""

    def __init__(self, directory: Path):
        self.directory = directory

    def path(self, step: str) -> Path:
        return self.directory / f"{step}.json"

    def lookup(self, step: str, key: str, max_age_seconds: float | None) -> dict | None:
        try:
            entry = json.loads(self.path(step).read_text())
        except (OSError, ValueError):
            return None
        if entry.get("key") != key:
            return None
        if max_age_seconds is not None and time.time() - entry.get("finished", 0) > max_age_seconds:
            return None
        return entry

    def record(self, step: str, key: str, seconds: float, output_digest: str | None) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        entry = {"key": key, "seconds": seconds, "finished": time.time(), "outputs": output_digest}
        self.path(step).write_text(json.dumps(entry, indent=2) + "\n")


class LocalRun:
    """One run of the pipeline's steps up to select; `serve` is separate because it may not end."""

    def __init__(self, config: PipelineConfig, print_line: Printer = print,
                 forced_rollout: local_canary.Forced | None = None):
        self.config = config
        self.root = Path(config.storage_root)
        self.layout = Layout(str(self.root))
        steps = build_steps(config, str(self.root))
        require_handlers(steps, HANDLERS, "local")
        # The run loop's steps, each with its handler; the one served step runs after them, and the
        # steps against the server once it is up.
        self.handlers: dict[str, ToCompletion] = {}
        served, self.against_server = [], []
        for step in steps:
            found = HANDLERS[step.kind]
            if isinstance(found, ToCompletion):
                self.handlers[step.name] = found
            elif isinstance(found, AgainstServer):
                self.against_server.append(step)
            else:
                served.append(step)
        if len(served) != 1:
            raise PipelineError(f"the local engine serves exactly one step, got {len(served)}")
        self.steps = [step for step in steps if step.name in self.handlers]
        self.serve_step = served[0]
        self.log_dir = self.root / LOGS_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.memo = Memo(self.root / MEMO_DIR)
        self.print = print_line
        self.keys: dict[str, str] = {}
        self.output_digests: dict[str, str | None] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.running: dict[str, Attempt] = {}
        self.started = time.monotonic()
        self.code_digest = trainer_code_digest()  # once: every step's key includes it
        self.forced_rollout = forced_rollout
        self.rollout: dict | None = None  # the canary's decision, once made
        # The steps track into one store, their runs tagged with this run's name (its logs' directory).
        self.tracking_env = local_tracking.environment(config, self.log_dir.name)
        self.tracking = tracking.OFF

    # Keys and output digests ------------------------------------------------------------------

    def key_of(self, step: Step) -> str:
        return self.handlers[step.name].memo_key(self, step)

    def outputs_digest(self, step: Step) -> str | None:
        """What the step's outputs hold now, or None when they are missing or damaged."""
        try:
            return self.handlers[step.name].outputs_digest(self, step)
        except (OSError, KeyError, ValueError, DatasetError):
            return None

    def version_dir(self, version: int) -> Path:
        return Path(self.layout.models) / self.config.model_name / str(version)

    # Scheduling --------------------------------------------------------------------------------

    def elapsed(self) -> str:
        return f"[{time.monotonic() - self.started:6.1f}s]"

    def ready(self) -> list[Step]:
        return [step for step in self.steps
                if step.name not in self.outcomes and step.name not in self.running
                and all(name in self.outcomes for name in step.depends)]

    def try_memo(self, step: Step, key: str) -> bool:
        max_age = self.config.memoize_max_age_seconds if self.handlers[step.name].expires else None
        entry = self.memo.lookup(step.name, key, max_age)
        if entry is None or entry.get("outputs") is None or entry["outputs"] != self.outputs_digest(step):
            return False
        self.output_digests[step.name] = entry["outputs"]
        self.outcomes[step.name] = Outcome(step.name, entry.get("seconds", 0.0), memoized=True)
        self.print(f"{self.elapsed()} {step.name}: memoized, skipped (key {key[:24]}, "
                   f"first run took {entry.get('seconds', 0):.1f}s)")
        return True

    def start(self, step: Step, number: int = 1, port_retries: int = 0) -> None:
        prepare = self.handlers[step.name].prepare
        first = number == 1 and not port_retries
        if first and prepare is not None:
            prepare(self, step)
        argv = [sys.executable, "-m", step.module, *step.args]
        workers = launch.start_replicas(argv, step.replicas, self.log_dir / step.name, step.distributed,
                                        step.parameter_servers, self.tracking_env)
        self.running[step.name] = Attempt(step, workers, number, time.monotonic(), port_retries)
        replicas = f" ({step.replicas} workers)" if step.distributed else ""
        if step.parameter_servers:
            replicas = f" ({step.replicas} workers, a chief, {step.parameter_servers} parameter server(s))"
        if first:
            self.print(f"{self.elapsed()} {step.name}: started{replicas}")

    def check(self, attempt: Attempt) -> None:
        step = attempt.step
        if launch.job_succeeded(attempt.workers):
            launch.stop_workers(attempt.workers)  # parameter servers and their workers never exit
            seconds = time.monotonic() - attempt.started
            del self.running[step.name]
            self.output_digests[step.name] = self.outputs_digest(step)
            self.memo.record(step.name, self.keys[step.name], seconds, self.output_digests[step.name])
            self.outcomes[step.name] = Outcome(step.name, seconds, memoized=False)
            for warning in warnings_in(attempt.workers):
                self.print(f"{self.elapsed()} {step.name}: {warning}")
            self.print(f"{self.elapsed()} {step.name}: finished in {seconds:.1f}s")
            return
        for restarted in launch.restart_lost_workers(attempt.workers):
            self.print(f"{self.elapsed()} {step.name}: {restarted.name} was lost; restarted it "
                       f"({restarted.restarts}/{launch.WORKER_RESTARTS})")
        failed = launch.first_failure(attempt.workers)
        if failed is None:
            return
        launch.stop_workers(attempt.workers)
        del self.running[step.name]
        if failed.lost_its_port and attempt.port_retries < launch.PORT_RETRIES:
            self.print(f"{self.elapsed()} {step.name}: a port was taken before {failed.name} bound it; "
                       "starting it again on other ports")
            self.start(step, attempt.number, attempt.port_retries + 1)
            return
        if attempt.number > step.retries:
            raise StepFailed(f"step {step.name} failed after {attempt.number} attempt(s): "
                             f"{launch.describe_failure(failed)}")
        self.print(f"{self.elapsed()} {step.name}: {failed.name} exited with status "
                   f"{failed.process.returncode}; restarting all {len(attempt.workers)} (retry "
                   f"{attempt.number}/{step.retries})")
        self.start(step, attempt.number + 1)

    def run(self) -> None:
        steps = len(self.steps) + 1 + len(self.against_server)  # and the served step
        self.print(f"pipeline: {steps} steps, logs in {self.log_dir}")
        parallelism = self.config.parallelism or len(self.steps)
        self.tracking = local_tracking.prepare(self.tracking_env)
        try:
            while len(self.outcomes) < len(self.steps):
                for step in self.ready():
                    if len(self.running) >= parallelism:
                        break
                    self.keys[step.name] = key = self.key_of(step)
                    if not self.try_memo(step, key):
                        self.start(step)
                for attempt in list(self.running.values()):
                    self.check(attempt)
                time.sleep(POLL_SECONDS)
        finally:
            for attempt in self.running.values():
                launch.stop_workers(attempt.workers)

    # Results -----------------------------------------------------------------------------------

    def selection(self) -> tuple[dict, Path]:
        """This run's selection (published or kept back by the promotion gate), and its version: the
        one published, else the one served (rollout.json's stable one, else the latest published)."""
        model_dir = Path(self.layout.models) / self.config.model_name
        selection = json.loads((model_dir / LAST_SELECTION_FILE).read_text())
        version = selection["version"] or model_repository.served_version(Path(self.layout.models),
                                                                           self.config.model_name)
        return selection, self.version_dir(version)

    def published_now(self, selection: dict) -> int | None:
        """The version this run's selection published; None when it was kept back or memoized (a
        memoized selection's version was rolled out by the run that published it)."""
        memoized = any(self.outcomes[step.name].memoized for step in self.steps
                       if step.kind is StepKind.SELECT)
        return None if memoized else selection["version"]


# How the local engine runs each kind of step ----------------------------------------------------

StepHook = Callable[[LocalRun, Step], None]


def command_key(run: LocalRun, step: Step) -> str:
    """The step's command, replicas, the trainer's code and the digests of what its inputs came from."""
    return digest({"command": step.command, "replicas": step.replicas,
                   "parameter_servers": step.parameter_servers, "code": run.code_digest,
                   "inputs": {name: run.output_digests[name] for name in step.depends}})


def ingest_key(run: LocalRun, step: Step) -> str:
    """The data source(s) and the dataset's checksums, as Argo's memoize key."""
    return ingest_memo_key(run.config)


def dataset_digest(run: LocalRun, step: Step) -> str | None:
    """The committed dataset's checksums, None when a file no longer matches its manifest."""
    data = Path(run.layout.data)
    if not atomic.is_committed(data):
        return None
    manifest = read_manifest(data)
    if any(md5_of(data / name) != manifest["files"][name]["md5"] for name in FILE_NAMES):
        return None
    return digest(manifest["files"])


def export_digest(run: LocalRun, step: Step) -> str | None:
    """The committed export's metrics (its last output), None after a crash while it was written."""
    export_dir = Path(step.outputs[-1])
    if not atomic.is_committed(export_dir):
        return None
    return digest((export_dir / METRICS_FILE).read_text())


def selection_digest(run: LocalRun, step: Step) -> str | None:
    """The latest selection's record, if the version it names (published or kept) is still there."""
    record = Path(run.layout.models) / run.config.model_name / LAST_SELECTION_FILE
    selection = json.loads(record.read_text())
    served = selection["version"] or selection["promotion"]["served_version"]
    versions = model_repository.versions(Path(run.layout.models), run.config.model_name)
    return digest(record.read_text()) if served in versions else None


def reset_stale_checkpoints(run: LocalRun, step: Step) -> None:
    """A backup left by an interrupted run resumes only the same training, never another."""
    checkpoint_dir = Path(step.outputs[0])
    key_file = checkpoint_dir / CHECKPOINT_KEY_FILE
    key = run.keys[step.name]
    if checkpoint_dir.exists() and (not key_file.exists() or key_file.read_text() != key):
        shutil.rmtree(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    key_file.write_text(key)


@dataclasses.dataclass(frozen=True)
class ToCompletion:
    """A step run as processes until they exit, skipped when its memo matches its committed outputs."""
    outputs_digest: Callable[[LocalRun, Step], str | None]  # may raise OSError, KeyError, ValueError
    memo_key: Callable[[LocalRun, Step], str] = command_key
    expires: bool = False  # the memo holds for memoizeMaxAge only, as Argo's memoize.maxAge
    prepare: StepHook | None = None  # before its first attempt


@dataclasses.dataclass(frozen=True)
class Served:
    """The step served after every other has finished, for one prediction or until Ctrl-C."""


@dataclasses.dataclass(frozen=True)
class AgainstServer:
    """A step run in this process once the served step is ready, given its URL (the canary's test
    and decision); returns the line to print."""
    run: Callable[[LocalRun, Step, str], str]


def canary_rollout(run: LocalRun, step: Step, url: str) -> str:
    """Tests the canary the server started with, if any, and promotes it or rolls it back."""
    outcome = local_canary.run_canary(run.config, url, Path(run.layout.data), run.forced_rollout,
                                      run.tracking)
    if outcome is None:
        return "no canary"
    decision, _ = outcome
    run.rollout = decision.as_record()
    return local_canary.summary(*outcome)


# Step kind -> how the local engine runs it.
HANDLERS: dict[StepKind, ToCompletion | Served] = {
    StepKind.INGEST: ToCompletion(dataset_digest, memo_key=ingest_key, expires=True),
    StepKind.TRAIN: ToCompletion(export_digest, prepare=reset_stale_checkpoints),
    StepKind.SELECT: ToCompletion(selection_digest),
    StepKind.SERVE: Served(),
    StepKind.ROLLOUT: AgainstServer(canary_rollout),
}


def warnings_in(workers: Sequence[launch.Worker]) -> list[str]:
    """Our steps' own WARNING lines (a fallback data source, say), which belong on the console."""
    found = []
    for worker in workers:
        for line in worker.log_path.read_text(errors="replace").splitlines():
            _, marker, message = line.partition(": WARNING: ")
            if marker and f"WARNING: {message}" not in found:
                found.append(f"WARNING: {message}")
    return found


def example_image(data_dir: Path) -> tuple[bytes, str]:
    """Test image EXAMPLE_TEST_IMAGE as PNG bytes, and its true class name."""
    test = load_split(data_dir, "test")
    buffer = io.BytesIO()
    Image.fromarray(test.images[EXAMPLE_TEST_IMAGE].squeeze()).save(buffer, format="PNG")
    return buffer.getvalue(), CLASS_NAMES[int(test.labels[EXAMPLE_TEST_IMAGE])]


def example_prediction(url: str, image: bytes, true_class: str, model_name: str) -> str:
    (predicted, confidence), = client.predict([image], url=url, model_name=model_name)
    return f"test image {EXAMPLE_TEST_IMAGE} (a {true_class}) -> {predicted} ({confidence:.1%})"


def curl_example(url: str, model_name: str, image: bytes) -> str:
    body = json.dumps({"instances": [{"image_bytes": {"b64": base64.b64encode(image).decode()}}]})
    return f"curl -s {url}/v1/models/{model_name}:predict -d '{body}'"


def format_table(outcomes: dict[str, Outcome], selection: dict, steps: Sequence[Step]) -> str:
    """One row per candidate: validation (what ranks) and test (reported only) accuracy, each headed
    with its sample size, train time, and which one selection chose; a candidate no step trained
    (select's ensemble) gets its row after the variants."""
    candidates = {c["name"]: c for c in selection["candidates"]}
    validation = f"validation ({selection.get('validation_examples', '?')})"
    test = f"test ({selection.get('test_examples', '?')})"
    lines = [f"{'variant':<16} {validation:>16} {test:>10} {'train time':>22}  chosen"]

    def row(name: str, took: str) -> str:
        scores = candidates.get(name, {})
        chosen = ("<- published" if selection["version"] else "<- best, not promoted") \
            if name == selection["winner"] else ""
        return (f"{name:<16} {scores.get('validation_accuracy', float('nan')):>16.4f} "
                f"{scores.get('test_accuracy', float('nan')):>10.4f} {took:>22}  {chosen}")

    trained = set()
    for step in steps:
        if step.kind is not StepKind.TRAIN:
            continue
        variant = step.args[step.args.index("--model") + 1]
        trained.add(variant)
        outcome = outcomes[step.name]
        lines.append(row(variant, f"{outcome.seconds:.1f}s" + (" (memoized)" if outcome.memoized else "")))
    lines += [row(name, "(built by select)") for name in candidates if name not in trained]
    return "\n".join(lines)


def run_pipeline(config: PipelineConfig, serve_forever: bool = False, print_line: Printer = print,
                 forced_rollout: local_canary.Forced | None = None) -> RunResult:
    """Runs every step; serves the published model (as a canary beside the version served before)
    for one example prediction and the canary's decision, then until Ctrl-C if asked."""
    run = LocalRun(config, print_line, forced_rollout)
    run.run()
    selection, version_dir = run.selection()
    print_line(format_table(run.outcomes, selection, run.steps))
    if selection["version"]:
        print_line(f"published: {config.model_name} version {selection['version']} ({version_dir})")
    else:
        print_line(f"not promoted: {selection['promotion']['reason']}; serving {config.model_name} "
                   f"version {version_dir.name} ({version_dir})")

    base = local_canary.model_base(config)
    state = local_canary.starting_state(base, run.published_now(selection), config.rollout.canary_percent)
    local_canary.serve_state(base, state, run.tracking)
    if state.canary is not None:
        print_line(f"canary: version {state.canary} takes {state.canary_percent}% of requests, "
                   f"version {state.stable} the rest")
    serve = run.serve_step.name
    serve_log = run.log_dir / serve / "server.log"
    serve_log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print_line(f"{run.elapsed()} {serve}: started")
    port = config.serving.http_port if serve_forever else None
    image, true_class = example_image(Path(run.layout.data))
    with running_server(run.serve_step.args, config.model_name, serve_log, port=port) as (url, process):
        ready = time.monotonic() - started
        example = example_prediction(url, image, true_class, config.model_name)
        run.outcomes[serve] = Outcome(serve, ready, memoized=False)
        print_line(f"{run.elapsed()} {serve}: ready in {ready:.1f}s at {url}; {example}")
        for step in run.against_server:
            started = time.monotonic()
            line = HANDLERS[step.kind].run(run, step, url)
            run.outcomes[step.name] = Outcome(step.name, time.monotonic() - started, memoized=False)
            print_line(f"{run.elapsed()} {step.name}: {line}")
        if serve_forever:
            print_line(f"serving {url} until Ctrl-C; try:\n{curl_example(url, config.model_name, image)}")
            process.wait()
    return RunResult(run.outcomes, selection, version_dir, example, run.log_dir, run.rollout)

