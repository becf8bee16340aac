"""The model server as a child process on 127.0.0.1: started, waited for until ready, stopped.

For the tests, the benchmarks and anything else that runs the server beside itself. A server binds
port 0 unless told a port, and its port comes from the file it writes once it listens
(serving.port_file): no port is chosen here and bound later, where another process could take it.
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

from serving.port_file import PORT_FILE_FLAG, Ports, read_port_file

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


def wait_for_ports(port_file: Path, process: subprocess.Popen, log: Path,
                   timeout: float = STARTUP_SECONDS) -> Ports:
    """The ports a server started with `--port-file port_file` bound, once it listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (ports := read_port_file(port_file)) is not None:
            return ports
        if process.poll() is not None:
            raise ServerFailed(f"server exited with status {process.returncode}: "
                               f"{log.read_text()[-LOG_TAIL_CHARS:]}")
        time.sleep(0.1)
    raise ServerFailed(f"server not listening in {timeout:.0f}s: {log.read_text()[-LOG_TAIL_CHARS:]}")


def port_file_beside(log: Path) -> Path:
    """Where `listening` asks the server whose output goes to `log` to write its ports."""
    return log.with_name(f"{log.name}.ports")


@contextlib.contextmanager
def listening(module: str, *args: object, log: Path) -> Iterator[tuple[Ports, subprocess.Popen]]:
    """`python -m module *args --port-file FILE` (a server whose port flags say 0, or a port), until
    the block ends; yields (the ports it bound, process) once it listens. FILE is beside `log`."""
    port_file = port_file_beside(log)
    port_file.unlink(missing_ok=True)
    process = start_module(module, *args, PORT_FILE_FLAG, port_file, log=log)
    try:
        yield wait_for_ports(port_file, process, log), process
    finally:
        stop(process)


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
    """`python -m serving.server *server_args` on `port` (default: any free one, bound by the
    server) without gRPC, until the block ends; yields (URL, process) once the model is ready."""
    with listening("serving.server", *server_args, "--http-port", port or 0, "--no-grpc",
                   log=log) as (ports, process):
        url = f"http://127.0.0.1:{ports['http']}"
        wait_until_ready(url, model_name, process, log)
        yield url, process


@contextlib.contextmanager
def model_server(repo: Path, model_name: str, log: Path,
                 *extra_args: object) -> Iterator[tuple[str, subprocess.Popen]]:
    """The server for `repo` on any free port; yields (URL, process)."""
    with running_server(["--model-repo", repo, "--model-name", model_name, *extra_args],
                        model_name, log) as running:
        yield running
