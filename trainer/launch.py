"""Run one training job as N worker processes on 127.0.0.1, as TFJob runs it as N pods.

    python -m trainer.launch --workers N --log-dir DIR -- --model NAME ... (trainer.train's flags)

Each worker is `python -m trainer.train` with its own TF_CONFIG on free ports and its own log file
(DIR/worker-<i>.log). When a worker fails, the others are stopped and the error names the worker
and shows the end of its log.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from common import cli
from trainer.cluster import TF_CONFIG, local_tf_configs

POLL_SECONDS = 0.2
LOG_TAIL_LINES = 15


class WorkerFailed(RuntimeError):
    """A worker exited non-zero; the message names it and quotes the end of its log."""


@dataclasses.dataclass
class Worker:
    index: int
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_replicas(argv: Sequence[str], replicas: int, log_dir: Path, distributed: bool) -> list[Worker]:
    """`replicas` copies of `argv`, logging to DIR/worker-<i>.log (appended to, across restarts).

    Distributed replicas get a TF_CONFIG naming all of them on free ports; the others get none.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    tf_configs = local_tf_configs(replicas) if distributed else [None] * replicas
    workers = []
    for index, tf_config in enumerate(tf_configs):
        env = {key: value for key, value in os.environ.items() if key != TF_CONFIG}
        if tf_config is not None:
            env[TF_CONFIG] = tf_config
        log_path = log_dir / f"worker-{index}.log"
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(list(argv), env={**env, "PYTHONUNBUFFERED": "1"},
                                       stdout=log_file, stderr=subprocess.STDOUT)
        workers.append(Worker(index, process, log_path))
    return workers


def start_workers(train_args: Sequence[str], num_workers: int, log_dir: Path) -> list[Worker]:
    return start_replicas([sys.executable, "-m", "trainer.train", *train_args], num_workers, log_dir,
                          distributed=True)


def stop_workers(workers: Sequence[Worker]) -> None:
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()


def first_failure(workers: Sequence[Worker]) -> Worker | None:
    return next((w for w in workers if w.process.poll() not in (None, 0)), None)


def all_succeeded(workers: Sequence[Worker]) -> bool:
    return all(worker.process.poll() == 0 for worker in workers)


def describe_failure(worker: Worker) -> str:
    return (f"worker {worker.index} exited with status {worker.process.returncode}; "
            f"the end of {worker.log_path}:\n{worker.log_tail()}")


def wait_for_workers(workers: Sequence[Worker]) -> None:
    """Returns when every worker has succeeded; raises WorkerFailed at the first failure."""
    try:
        while not all_succeeded(workers):
            failed = first_failure(workers)
            if failed is not None:
                raise WorkerFailed(describe_failure(failed))
            time.sleep(POLL_SECONDS)
    finally:
        stop_workers(workers)


def run_workers(train_args: Sequence[str], num_workers: int, log_dir: Path) -> None:
    wait_for_workers(start_workers(train_args, num_workers, log_dir))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=cli.positive_int, default=2)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("train_args", nargs=argparse.REMAINDER,
                        help="after --: the flags of trainer.train")
    args = parser.parse_args(argv)
    if args.train_args[:1] == ["--"]:
        args.train_args = args.train_args[1:]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"launch: {args.workers} workers, logs in {args.log_dir}", flush=True)
    started = time.monotonic()
    run_workers(args.train_args, args.workers, args.log_dir)
    print(f"launch: all {args.workers} workers finished in {time.monotonic() - started:.0f}s", flush=True)


if __name__ == "__main__":
    cli.run("launch", main, expected=(WorkerFailed,))
