"""The tier's programs as processes: each started with its output in a log file of its own, waited for
until it answers, and stopped (SIGTERM, then SIGKILL) when the tier stops. A program that exits while
the tier waits for it is an error quoting the end of its log."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Mapping, Sequence

import psutil

STOP_SECONDS = 3.0  # a test tier keeps nothing: what has not stopped by then is killed
POLL_SECONDS = 0.2
LOG_TAIL_LINES = 15
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_the_starter() -> None:
    """In the child before it runs the program: the kernel kills it when the process that started it
    dies, SIGKILL included. A tier stopped without its teardown (its pytest killed) leaves nothing
    running that would hold its ports and directory."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class StartError(RuntimeError):
    """A program did not start or answer; the message ends with its last log lines."""


@dataclasses.dataclass
class Program:
    name: str
    command: Sequence[str]
    log: Path
    env: Mapping[str, str] | None = None
    process: subprocess.Popen | None = None

    def start(self) -> Program:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                list(self.command),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                start_new_session=True,
                preexec_fn=die_with_the_starter,
            )
        return self

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        """Polls `ready` until it holds; fails if the program exits first or after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                raise StartError(
                    f"{self.name} exited (status {self.process.returncode}) before {what}:\n{self.tail()}"
                )
            if ready():
                return
            if time.monotonic() >= deadline:
                raise StartError(f"{self.name}: not {what} after {timeout:g} s; its log ends:\n{self.tail()}")
            time.sleep(POLL_SECONDS)

    def terminate(self) -> None:
        if self.running():
            os.killpg(self.process.pid, signal.SIGTERM)

    def stop(self, deadline: float | None = None) -> None:
        """SIGTERM (unless sent already), then SIGKILL at `deadline` (default: STOP_SECONDS from now)."""
        if self.process is None:
            return
        self.terminate()
        deadline = deadline or time.monotonic() + STOP_SECONDS
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def cpu_seconds(programs: list[Program]) -> dict[str, float]:
    """Each running program's CPU time so far, its reaped children's included: where a tier's share of
    the machine goes (printed when it stops)."""
    used = {}
    for program in programs:
        if program.running():
            try:
                times = psutil.Process(program.process.pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            used[program.name] = times.user + times.system + times.children_user + times.children_system
    return used


def stop_all(programs: list[Program]) -> None:
    """Every program told to stop at once; any still running STOP_SECONDS later is killed."""
    for program in programs:
        program.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for program in programs:
        program.stop(deadline)


def answers(url: str, context: ssl.SSLContext | None = None, expect: int = 200) -> Callable[[], bool]:
    """A readiness check: GET `url` answers `expect` (any error status, or none, is not ready)."""

    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                return response.status == expect
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            return False

    return check
