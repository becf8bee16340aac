"""The model server as a child process on 127.0.0.1: started, waited for until ready, stopped.

For the tests, the benchmarks and anything else that runs the server beside itself.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

import requests

from common.ports import free_ports

REPO_ROOT = Path(__file__).resolve().parents[1]
STARTUP_SECONDS = 120
STOP_SECONDS = 30
LOG_TAIL_CHARS = 3000


class ServerFailed(RuntimeError):
    """The server exited or was not ready in time; the message ends with its log."""


def start_module(module: str, *args: object, log: Path) -> subprocess.Popen:
    """`python -m module args` from the repository root, its output in `log`."""
    with open(log, "w") as log_file:
        return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=REPO_ROOT,
                                stdout=log_file, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, as Kubernetes stops a pod; SIGKILL if it has not exited in STOP_SECONDS."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until_ready(url: str, model_name: str, process: subprocess.Popen, log: Path,
                     timeout: float = STARTUP_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerFailed(f"server exited with status {process.returncode}: "
                               f"{log.read_text()[-LOG_TAIL_CHARS:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/v1/models/{model_name}", timeout=1).status_code == 200:
                return
        time.sleep(0.3)
    raise ServerFailed(f"server not ready in {timeout:.0f}s: {log.read_text()[-LOG_TAIL_CHARS:]}")


@contextlib.contextmanager
def running_server(server_args: Sequence[object], model_name: str, log: Path,
                   port: int | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m serving.server *server_args` on `port` (default: a free one) without gRPC, until
    the block ends; yields (URL, process) once the model is ready."""
    port = port or free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    process = start_module("serving.server", *server_args, "--http-port", port, "--grpc-port", 0, log=log)
    try:
        wait_until_ready(url, model_name, process, log)
        yield url, process
    finally:
        stop(process)


@contextlib.contextmanager
def model_server(repo: Path, model_name: str, log: Path,
                 *extra_args: object) -> Iterator[tuple[str, subprocess.Popen]]:
    """The server for `repo` on a free port; yields (URL, process)."""
    with running_server(["--model-repo", repo, "--model-name", model_name, *extra_args],
                        model_name, log) as running:
        yield running
