"""The local engine end to end on the sample: a variant under parameter servers beside a synchronous
one, publish and serve, memoize, a new version's canary and its forced rollback, retry a lost worker
and resume, stop every child on Ctrl-C or SIGTERM, however the process was started."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Collection

import psutil
import pytest
from conftest import REPO_ROOT, epochs_logged, last_line, run_module
from mlflow import MlflowClient

from common.tracking_names import CHAMPION, PIPELINE_RUN_TAG, VERSION_TAG, embedded_uri
from pipeline import local
from pipeline.config import parse_config
from pipeline.definition import StepKind, build_steps
from trainer.fashion_mnist import CLASS_NAMES

pytestmark = pytest.mark.slow  # runs the whole local pipeline

FAST = ["--workers", "2", "--steps-per-epoch", "2", "--batch-size-per-replica", "8"]
EPOCH_LOGGED = re.compile(r"train\[worker:0\]: epoch 1/")
RUN_SLICE_SECONDS = 0.05  # how long held_once_logged lets the trainers run between its looks


def run_args(sample_dir: Path, root: Path, *flags: str) -> list[str]:
    return ["run", "--data-source", str(sample_dir), "--storage-root", str(root), *FAST, *flags]


def signals_at(disposition: signal.Handlers, *signums: signal.Signals) -> Callable[[], None]:
    """A preexec_fn: the child starts with these signals at `disposition`, not at whatever this
    test process inherited (a suite started as a background job has SIGINT ignored)."""
    def set_dispositions() -> None:
        for signum in signums:
            signal.signal(signum, disposition)
    return set_dispositions


def start_pipeline(args: list[str], output: Path,
                   preexec_fn: Callable[[], None] = signals_at(signal.SIG_DFL, signal.SIGINT)
                   ) -> subprocess.Popen:
    """`python -m pipeline ARGS`, by default with SIGINT at its default as in a terminal."""
    with open(output, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=REPO_ROOT,
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)


def first_worker_logs(root: Path, step: str, earlier: Collection[Path]) -> list[Path]:
    """The logs of `step`'s first worker in the runs under `root` but the `earlier` ones (log directories)."""
    return [log for log in root.glob(f"logs/*/{step}/worker-0.log") if log.parents[1] not in earlier]


def held_once_logged(root: Path, step: str, pattern: re.Pattern, process: subprocess.Popen, count: int,
                     earlier: Collection[Path] = (), timeout: float = 240) -> list[psutil.Process]:
    """The pipeline's `count` trainers, each stopped (SIGSTOP), once the first worker of `step` has
    logged `pattern` in this run's log directory (not in the `earlier` runs' of the same root).

    After epoch 1 a few-step epoch takes a tenth of a second: less than a loaded machine may take to
    list processes. So the trainers are listed once, before they train, and each check of the log is
    made while they are stopped, so none can finish between the line and what the caller does next."""
    deadline = time.monotonic() + timeout
    while len(held := trainers(process)) < count:
        assert process.poll() is None and time.monotonic() < deadline, f"{count} trainers never ran"
        time.sleep(RUN_SLICE_SECONDS)
    while time.monotonic() < deadline:
        assert process.poll() is None, "the pipeline ended before training got going"
        try:
            for trainer in held:
                trainer.suspend()
            logged = any(pattern.search(log.read_text(errors="replace"))
                         for log in first_worker_logs(root, step, earlier))
        except BaseException:
            resume(held)  # none left stopped behind a failed test
            raise
        if logged:
            return held
        resume(held)
        time.sleep(RUN_SLICE_SECONDS)
    raise AssertionError(f"{step} did not log {pattern.pattern} in {timeout}s")


def resume(processes: Collection[psutil.Process]) -> None:
    for held in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            held.resume()


def kill_tree(process: subprocess.Popen) -> None:
    if process.poll() is None:
        for child in psutil.Process(process.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        process.kill()
        process.wait()


def children_running(pipeline: subprocess.Popen, module: str) -> list[psutil.Process]:
    """The pipeline's descendants started as `python -m <module>`."""
    return [child for child in psutil.Process(pipeline.pid).children(recursive=True)
            if module in command_line(child)]


def trainers(pipeline: subprocess.Popen) -> list[psutil.Process]:
    return children_running(pipeline, "trainer.train")


def test_two_variants_one_under_parameter_servers_publish_version_1_serve_it_then_a_rerun_memoizes(
        sample_dir, tmp_path):
    """`make demo` in small, with `cnn` under parameter servers beside a synchronous variant (the
    strategy is per variant), then the same run memoized, then a changed run's canary."""
    root = tmp_path / "root"
    config = tmp_path / "pipeline.yaml"
    config.write_text("pipeline:\n  strategy: {cnn: parameter-server}\n")
    # Nothing listens on port 9: the mirror is unreachable and ingest falls back to the sample.
    unreachable = ["--data-source", "http://127.0.0.1:9/", "--fallback-source", str(sample_dir)]
    args = [*run_args(sample_dir, root, "--variants", "cnn", "cnn_dropout", "--config", str(config)),
            *unreachable, "--epochs", "2"]
    first = run_module("pipeline", *args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert re.search(r"\] ingest: WARNING: http://127\.0\.0\.1:9/\S+: unreachable .*; using the fallback ",
                     first.stdout)
    for step in ("ingest", "train-cnn", "train-cnn-dropout", "select"):
        assert re.search(rf"\] {step}: finished in [0-9.]+s", first.stdout), step
    assert "train-cnn: started (2 workers, a chief, 1 parameter server(s))" in first.stdout
    assert "train-cnn-dropout: started (2 workers)" in first.stdout
    (logs,) = root.glob("logs/*")
    assert sorted(p.name for p in (logs / "train-cnn").iterdir()) == [
        "chief-0.log", "ps-0.log", "worker-0.log", "worker-1.log"]
    assert sorted(p.name for p in (logs / "train-cnn-dropout").iterdir()) == ["worker-0.log", "worker-1.log"]
    assert "train[chief:0]: exported" in (logs / "train-cnn" / "chief-0.log").read_text()
    metrics = json.loads((root / "exports" / "cnn" / "metrics.json").read_text())
    assert (metrics["workers"], metrics["global_batch_size"]) == (2, 16)  # 8 per replica x 2
    # validation and test accuracy, then the train time
    assert re.search(r"^cnn_dropout +[01]\.\d{4} +[01]\.\d{4} +[0-9.]+s", first.stdout, re.MULTILINE)
    assert "published: fmnist version 1" in first.stdout
    # A class name may hold a slash ("T-shirt/top"): any of them, on whatever the small model predicts.
    label = "|".join(map(re.escape, CLASS_NAMES))
    assert re.search(rf"serve: ready in [0-9.]+s at http://127\.0\.0\.1:\d+; test image 0 \(a ({label})\) "
                     rf"-> ({label}) \(\d+\.\d%\)", first.stdout)
    assert (root / "models" / "fmnist" / "1" / "saved_model.pb").is_file()
    assert re.search(r"\] rollout: no canary$", first.stdout, re.MULTILINE)  # the first version
    # MLflow's own API on the embedded store: a run per variant, selection's, version 1 the champion.
    tracked = MlflowClient(tracking_uri=embedded_uri(str(root)))
    runs = {run.info.run_name: run for run in tracked.search_runs(
        [tracked.get_experiment_by_name("fmnist").experiment_id])}
    assert set(runs) == {"cnn", "cnn_dropout", "select"}
    assert runs["cnn"].data.params["strategy"] == "parameter-server"
    assert runs["cnn_dropout"].data.params["strategy"] == "sync"
    assert len({run.data.tags[PIPELINE_RUN_TAG] for run in runs.values()}) == 1  # one pipeline run
    assert [m.step for m in tracked.get_metric_history(runs["cnn_dropout"].info.run_id, "loss")] == [1, 2]
    compared = set(runs["select"].data.metrics)
    assert {f"{name}.validation_accuracy" for name in ("cnn", "cnn_dropout", "ensemble")} <= compared
    assert registered_aliases(tracked) == {CHAMPION: "1"}

    second = run_module("pipeline", *args)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    for step in ("ingest", "train-cnn", "train-cnn-dropout", "select"):
        assert re.search(rf"\] {step}: memoized, skipped", second.stdout), step
    assert "published: fmnist version 1" in second.stdout  # nothing changed, nothing re-published
    assert "serve: ready" in second.stdout

    # A small canary, so that its decision comes after a few dozen requests; forced to roll back.
    # One variant, synchronous, on one worker for one epoch: a change of what is trained, and less to train.
    canary_config = tmp_path / "canary.yaml"
    canary_config.write_text("pipeline:\n  rollout: {canaryPercent: 50, minRequests: 20, maxWait: 60s}\n")
    changed = run_module("pipeline", *run_args(sample_dir, root, "--variants", "cnn"), *unreachable,
                         "--epochs", "1", "--workers", "1", "--config", str(canary_config),
                         "--rollout", "rollback")
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert "ingest: memoized" in changed.stdout and "train-cnn: started (1 workers)\n" in changed.stdout
    assert "train-cnn: finished" in changed.stdout
    # Retrained and selected again; the promotion gate decides on validation data whether the new
    # winner replaces version 1 (trainer.select's tests pin the rule): either way one line says so.
    decision = re.search(r"^(published: fmnist version 2|not promoted: .*; serving fmnist version 1) ",
                         changed.stdout, re.MULTILINE)
    assert decision, changed.stdout[-3000:]
    assert "serve: ready" in changed.stdout
    if decision.group(1).startswith("published"):  # version 2 went through its canary
        assert "canary: version 2 takes 50% of requests, version 1 the rest" in changed.stdout
        assert re.search(r"\] rollout: rolled back version 2, version 1 stays: forced rollback .*"
                         r"\[canary (2\d|[3-9]\d|\d{3,}) requests, 0 errors, mean [0-9.]+ ms; stable \d+ "
                         r"requests", changed.stdout), changed.stdout[-3000:]
        history = json.loads((root / "models" / "fmnist" / "rollout-history.json").read_text())
        assert history[-1]["decision"] == "rollback" and history[-1]["canary"]["requests"] >= 20
    else:
        assert re.search(r"\] rollout: no canary$", changed.stdout, re.MULTILINE)
    # Either way version 1 is served and version 2, if published, stays on disk.
    rollout = json.loads((root / "models" / "fmnist" / "rollout.json").read_text())
    assert rollout == {"stable": 1, "canary": None, "canaryPercent": 0}
    # And MLflow says so: version 1 the champion, no challenger left (version 2 registered if published).
    assert registered_aliases(tracked) == {CHAMPION: "1"}
    versions = {v.tags[VERSION_TAG] for v in tracked.search_model_versions("name = 'fmnist'")}
    assert versions == ({"1", "2"} if decision.group(1).startswith("published") else {"1"})


def registered_aliases(tracked: MlflowClient) -> dict[str, str]:
    """The registered model's aliases, each with our version number."""
    model = tracked.get_registered_model("fmnist")
    return {alias: tracked.get_model_version("fmnist", number).tags[VERSION_TAG]
            for alias, number in model.aliases.items()}


def test_after_the_retries_the_run_fails_naming_the_step_and_its_log(sample_dir, tmp_path):
    root = tmp_path / "root"
    pipeline = start_pipeline(run_args(sample_dir, root, "--variants", "cnn", "--epochs", "20",
                                       "--retries", "0"), tmp_path / "out.txt")
    try:
        held = held_once_logged(root, "train-cnn", EPOCH_LOGGED, pipeline, count=2)
        held[0].kill()
        resume(held)
        assert pipeline.wait(timeout=120) == 1
    finally:
        pipeline.kill()
    output = (tmp_path / "out.txt").read_text()
    assert re.search(r"pipeline: error: step train-cnn failed after 1 attempt\(s\): worker \d exited "
                     r"with status -9; the end of .*worker-\d\.log:", output)
    assert "select: started" not in output


def test_ctrl_c_stops_every_child_and_the_next_run_survives_a_killed_worker(sample_dir, tmp_path):
    """Ctrl-C stops both variants' trainers. The next run in that root (ingest memoized, the interrupted
    training's backup left aside: another training) loses a worker mid-training: the step restarts,
    resumes right after the last epoch logged, trains each remaining epoch once and publishes (one
    story: the run after the interrupt is the one that loses a worker, a whole pipeline run fewer)."""
    root = tmp_path / "root"
    args = run_args(sample_dir, root, "--variants", "cnn", "cnn_batchnorm", "--epochs", "20")
    pipeline = start_pipeline(args, tmp_path / "out.txt")
    try:
        held = held_once_logged(root, "train-cnn", EPOCH_LOGGED, pipeline, count=4)
        children = psutil.Process(pipeline.pid).children(recursive=True)
        pipeline.send_signal(signal.SIGINT)
        resume(held)  # the pipeline's SIGTERM, if sent already, is delivered on resuming
        assert len(held) == 4  # two variants in parallel, two workers each
        assert pipeline.wait(timeout=60) == 130
    finally:
        pipeline.kill()
    assert "interrupted; every child process is stopped" in last_line((tmp_path / "out.txt").read_text())
    _, alive = psutil.wait_procs(children, timeout=5)
    assert alive == []

    # One of the interrupted variants (the other's leftovers stay beside it), for less to train.
    interrupted = set(root.glob("logs/*"))
    rerun = start_pipeline(run_args(sample_dir, root, "--variants", "cnn", "--epochs", "6"),
                           tmp_path / "rerun.txt")
    try:
        held = held_once_logged(root, "train-cnn", EPOCH_LOGGED, rerun, count=2,
                                earlier=interrupted)
        held[-1].kill()
        resume(held)
        assert rerun.wait(timeout=300) == 0, (tmp_path / "rerun.txt").read_text()[-3000:]
    finally:
        rerun.kill()
    output = (tmp_path / "rerun.txt").read_text()
    assert "ingest: memoized" in output
    assert re.search(r"train-cnn: worker \d exited with status -9; restarting all 2 \(retry 1/2\)", output)
    assert "published: fmnist version 1" in output
    # Both attempts log to the same file: the second resumes right after the last epoch logged (an
    # epoch's line comes after its backup is written) and trains each remaining epoch once.
    (chief_log,) = first_worker_logs(root, "train-cnn", interrupted)
    first_attempt, resumed, second_attempt = chief_log.read_text().partition("resuming from backup at ")
    assert resumed, chief_log.read_text()[-3000:]
    completed = max(epochs_logged(first_attempt))
    assert second_attempt.startswith(f"epoch {completed + 1}/6\n")
    assert epochs_logged(second_attempt) == list(range(completed + 1, 7))


@pytest.mark.parametrize("flags", [["--parallelism", "0"], ["--retries", "-1"]])
def test_bad_engine_flags_are_config_errors(tmp_path, flags):
    result = run_module("pipeline", "run", "--storage-root", tmp_path / "root", *flags)
    assert result.returncode == 2 and "pipeline: error: config: pipeline." in last_line(result.stderr)
    assert not (tmp_path / "root").exists()


def command_line(process: psutil.Process) -> list[str]:
    """`process`'s arguments; none for one that ended since it was listed (a zombie, or gone)."""
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_engine_stops_on_a_signal_its_parent_had_ignored(sample_dir, tmp_path, signum):
    """Started with SIGINT and SIGTERM ignored (a background job of a script, some CI runners), the
    engine still stops every child on either. Ingest is kept busy by a mirror that never answers."""
    root, output = tmp_path / "root", tmp_path / "out.txt"
    with socket.create_server(("127.0.0.1", 0)) as silent_mirror:  # listens, never replies
        mirror = f"http://127.0.0.1:{silent_mirror.getsockname()[1]}/"
        pipeline = start_pipeline(["run", "--data-source", mirror, "--fallback-source", str(sample_dir),
                                   "--storage-root", str(root), "--variants", "cnn"], output,
                                  preexec_fn=signals_at(signal.SIG_IGN, signal.SIGINT, signal.SIGTERM))
        try:
            deadline = time.monotonic() + 60
            while not children_running(pipeline, "trainer.ingest"):
                assert pipeline.poll() is None and time.monotonic() < deadline, output.read_text()
                time.sleep(0.1)
            children = psutil.Process(pipeline.pid).children(recursive=True)
            pipeline.send_signal(signum)
            assert pipeline.wait(timeout=20) == 130, output.read_text()
        finally:
            kill_tree(pipeline)  # without the engine's handlers it would run on, and its children
    assert "interrupted; every child process is stopped" in last_line(output.read_text())
    _, alive = psutil.wait_procs(children, timeout=5)
    assert alive == []


def test_the_run_table_shows_validation_and_test_with_their_sizes_and_marks_an_ensemble_winner():
    config = parse_config({"pipeline": {"variants": ["cnn", "cnn_dropout"]}})
    steps = build_steps(config, "runs/x")
    outcomes = {step.name: local.Outcome(step.name, 12.5, step.name.endswith("dropout"))
                for step in steps if step.kind is StepKind.TRAIN}
    selection = {"version": 3, "winner": "ensemble", "validation_examples": 50, "test_examples": 100,
                 "candidates": [{"name": "cnn", "validation_accuracy": 0.8, "test_accuracy": 0.81},
                                {"name": "cnn_dropout", "validation_accuracy": 0.78, "test_accuracy": 0.83},
                                {"name": "ensemble", "validation_accuracy": 0.86, "test_accuracy": 0.84}]}
    header, cnn, dropout, ensemble = local.format_table(outcomes, selection, steps).splitlines()
    assert "validation (50)" in header and "test (100)" in header
    assert cnn.split()[:3] == ["cnn", "0.8000", "0.8100"] and "published" not in cnn
    assert "(memoized)" in dropout
    assert ensemble.split()[:3] == ["ensemble", "0.8600", "0.8400"] and ensemble.endswith("<- published")
