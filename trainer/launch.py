"""Run one training job as processes on 127.0.0.1, as TFJob runs it as pods.

    python -m trainer.launch --workers N [--parameter-servers P] --log-dir DIR -- --model NAME ...
        (trainer.train's flags after --)

Every process gets the environment a pod of our TrainJob gets (trainer.cluster.local_tasks: its JobSet's
name, replicated job and completion index, the node count), with each task's hostname on a free port
of 127.0.0.1, and builds its TF_CONFIG from it as the pods do.

Synchronous (no --parameter-servers): N workers, each `python -m trainer.train` with its own log file
(DIR/worker-<i>.log); the job succeeds when every worker has, and when one fails the others are
stopped and the error names it and shows the end of its log.

Parameter servers (--parameter-servers P): a chief (the coordinator, DIR/chief-0.log), N workers and
P parameter servers (DIR/ps-<i>.log), as the runtime's node 0, nodes 1..N and ps pods.
Workers and parameter servers never exit by themselves: the job succeeds when the chief does, and
then they are stopped (TFJob's cleanPodPolicy Running). A worker that dies is started again (TFJob's
restartPolicy OnFailure; meanwhile the coordinator runs its steps on the others) up to
WORKER_RESTARTS times; a chief or parameter server that dies fails the job.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Mapping, Sequence

from common import cli
from trainer.cluster import CHIEF, CLUSTER_ENV, PS, WORKER, LocalTask, local_tasks

POLL_SECONDS = 0.2
LOG_TAIL_LINES = 15
# Restarts of one lost worker under parameter servers before the job fails (a crash loop is a bug).
WORKER_RESTARTS = 3
# --slow-worker-percent: the last worker is paused (SIGSTOP) that share of every period.
THROTTLE_PERIOD_SECONDS = 0.1
# TF_CONFIG names every task's port before the tasks start, so another program may take one between
# its choice and its binding: TensorFlow then says this and exits. The job starts again on other ports.
PORT_TAKEN = "Could not start gRPC server"
PORT_RETRIES = 3


class WorkerFailed(RuntimeError):
    """A replica's exit failed the job; the message names it and quotes the end of its log."""


class PortTaken(WorkerFailed):
    """A replica could not bind the port its TF_CONFIG gave it: start the job again, on other ports."""


@dataclasses.dataclass
class Worker:
    """One replica's process: a worker, or under parameter servers also the chief or a ps task."""
    index: int
    process: subprocess.Popen
    log_path: Path
    task_type: str = WORKER
    command: tuple[list[str], dict[str, str]] | None = None  # argv and env, to start it again
    restarts: int = 0
    log_start: int = 0  # where this start's output begins in the log file (restarts append to it)

    @property
    def name(self) -> str:
        return f"{self.task_type} {self.index}"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_of_this_start(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self.log_start)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    @property
    def lost_its_port(self) -> bool:
        return PORT_TAKEN in self.log_of_this_start()

    def restart(self) -> None:
        """The same process again, logging on to the same file (a pod restarted in place)."""
        if self.command is None:
            raise ValueError(f"{self.name}: started without its command")
        argv, env = self.command
        self.restarts += 1
        self.process, self.log_start = _spawn(argv, env, self.log_path)


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen, int]:
    """The process, and where its output starts in the log."""
    with open(log_path, "ab") as log_file:
        start = log_file.tell()
        return subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT), start


def _environment(task_env: dict[str, str], step_env: Mapping[str, str] = {}) -> dict[str, str]:
    """This process's environment, the step's and the task's, without a cluster description of its own."""
    env = {key: value for key, value in os.environ.items() if key not in CLUSTER_ENV}
    return {**env, **step_env, **task_env, "PYTHONUNBUFFERED": "1"}


def start_replicas(argv: Sequence[str], replicas: int, log_dir: Path, distributed: bool,
                   parameter_servers: int = 0, step_env: Mapping[str, str] = {}) -> list[Worker]:
    """`replicas` copies of `argv`, logging to DIR/worker-<i>.log (appended to, across restarts), each
    with `step_env` in its environment (the engine's, such as where to track).

    Distributed replicas get a TrainJob pod's environment naming all of them (local_tasks); the others
    get none. With `parameter_servers`, the replicas are the workers beside a chief and that many ps
    tasks (DIR/chief-0.log, DIR/ps-<i>.log), the chief first.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    if distributed:
        tasks = local_tasks(replicas, parameter_servers)
    else:
        tasks = [LocalTask(WORKER, index, {}) for index in range(replicas)]
    workers = []
    for task in tasks:
        env = _environment(task.env, step_env)
        log_path = log_dir / f"{task.task_type}-{task.index}.log"
        process, log_start = _spawn(list(argv), env, log_path)
        workers.append(Worker(task.index, process, log_path, task.task_type, (list(argv), env),
                              log_start=log_start))
    return workers


def start_workers(train_args: Sequence[str], num_workers: int, log_dir: Path,
                  parameter_servers: int = 0) -> list[Worker]:
    return start_replicas([sys.executable, "-m", "trainer.train", *train_args], num_workers, log_dir,
                          distributed=True, parameter_servers=parameter_servers)


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


def uses_parameter_servers(workers: Sequence[Worker]) -> bool:
    return any(worker.task_type == PS for worker in workers)


def restart_lost_workers(workers: Sequence[Worker]) -> list[Worker]:
    """Under parameter servers, starts again each worker that has exited, as TFJob's restartPolicy
    OnFailure does, up to WORKER_RESTARTS times each (then first_failure reports it); the restarted."""
    if not uses_parameter_servers(workers):
        return []
    lost = [worker for worker in workers if worker.task_type == WORKER
            and worker.process.poll() is not None and worker.restarts < WORKER_RESTARTS]
    for worker in lost:
        worker.restart()
    return lost


def first_failure(workers: Sequence[Worker]) -> Worker | None:
    """A replica whose exit fails the job: any failed worker under synchronous training; under
    parameter servers the chief failing, a parameter server exiting, or a worker past its restarts."""
    if not uses_parameter_servers(workers):
        return next((w for w in workers if w.process.poll() not in (None, 0)), None)
    for worker in workers:
        status = worker.process.poll()
        if status is None or (worker.task_type == CHIEF and status == 0):
            continue
        if worker.task_type != WORKER or worker.restarts >= WORKER_RESTARTS:
            return worker
    return None


def job_succeeded(workers: Sequence[Worker]) -> bool:
    """Every replica succeeded; under parameter servers, the chief did (the others never exit)."""
    if uses_parameter_servers(workers):
        return all(w.process.poll() == 0 for w in workers if w.task_type == CHIEF)
    return all(worker.process.poll() == 0 for worker in workers)


def describe_failure(worker: Worker) -> str:
    return (f"{worker.name} exited with status {worker.process.returncode}; "
            f"the end of {worker.log_path}:\n{worker.log_tail()}")


def wait_for_workers(workers: Sequence[Worker]) -> None:
    """Returns when the job has succeeded; raises WorkerFailed at the first failure that ends it.
    Either way every replica is stopped."""
    try:
        while not job_succeeded(workers):
            for worker in restart_lost_workers(workers):
                print(f"launch: {worker.name} was lost; restarted it ({worker.restarts}/"
                      f"{WORKER_RESTARTS})", flush=True)
            failed = first_failure(workers)
            if failed is not None:
                raise (PortTaken if failed.lost_its_port else WorkerFailed)(describe_failure(failed))
            time.sleep(POLL_SECONDS)
    finally:
        stop_workers(workers)


class Throttle:
    """Pauses one process `percent` of the time (SIGSTOP, then SIGCONT): a slow machine, whatever
    the strategy, for the benchmarks."""

    def __init__(self, process: subprocess.Popen, percent: int):
        self.process, self.paused_share = process, percent / 100
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stopped.is_set() and self.process.poll() is None:
                self.process.send_signal(signal.SIGSTOP)
                self.stopped.wait(THROTTLE_PERIOD_SECONDS * self.paused_share)
                self.process.send_signal(signal.SIGCONT)
                self.stopped.wait(THROTTLE_PERIOD_SECONDS * (1 - self.paused_share))
        except ProcessLookupError:
            return  # it ended between the poll and the signal

    def __enter__(self) -> Throttle:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopped.set()
        self.thread.join()


def run_workers(train_args: Sequence[str], num_workers: int, log_dir: Path,
                parameter_servers: int = 0, slow_worker_percent: int = 0) -> None:
    """Runs the job to its end, started again on other ports when one was taken (PORT_RETRIES times);
    with `slow_worker_percent`, the last worker runs that much slower."""
    for attempt in range(PORT_RETRIES + 1):
        workers = start_workers(train_args, num_workers, log_dir, parameter_servers)
        slowed = [worker for worker in workers if worker.task_type == WORKER][-1]
        try:
            with Throttle(slowed.process, slow_worker_percent) if slow_worker_percent else nullcontext():
                wait_for_workers(workers)
            return
        except PortTaken:
            if attempt == PORT_RETRIES:
                raise
            print("launch: a port of the job was taken before its task bound it; starting the job again "
                  "on other ports", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=cli.positive_int, default=2)
    parser.add_argument("--parameter-servers", type=cli.positive_int,
                        help="train asynchronously: a chief, the workers and this many parameter servers")
    parser.add_argument("--slow-worker-percent", type=int, default=0, choices=range(100), metavar="0-99",
                        help="(benchmarks) pause the last worker this share of the time")
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("train_args", nargs=argparse.REMAINDER,
                        help="after --: the flags of trainer.train")
    args = parser.parse_args(argv)
    if args.train_args[:1] == ["--"]:
        args.train_args = args.train_args[1:]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    servers = f", a chief and {args.parameter_servers} parameter server(s)" if args.parameter_servers else ""
    print(f"launch: {args.workers} workers{servers}, logs in {args.log_dir}", flush=True)
    started = time.monotonic()
    run_workers(args.train_args, args.workers, args.log_dir, args.parameter_servers or 0,
                args.slow_worker_percent)
    print(f"launch: the job finished in {time.monotonic() - started:.0f}s", flush=True)


if __name__ == "__main__":
    cli.run("launch", main, expected=(WorkerFailed,))
