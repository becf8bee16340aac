"""Servers bind the ports they are given, 0 meaning any free one, and say which ports they got.

A port found free by one process and bound later by another can be taken in between (by a test
running in parallel, say); a server that binds port 0 itself cannot lose it. So whoever runs a
server beside itself (serving.process, the tests, the benchmarks) passes port 0 and `--port-file
FILE`, then reads the ports from FILE: the server writes it once it listens on every one of them,
whole (written beside it, then renamed into place), so a reader never sees half of it. The server
also prints them, for people. Standard library only: the request logger and serving.process use it
without KServe (whose import parses sys.argv).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

PORT_FILE_FLAG = "--port-file"
PORT_FILE_HELP = "once listening, write the ports bound as JSON to this file (with port 0: any free port)"

Ports = dict[str, int]  # protocol ("http", "grpc") -> the port bound


def write_port_file(path: Path, ports: Ports) -> None:
    """`ports` as JSON at `path`, appearing whole."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(ports))
    os.replace(partial, path)


def read_port_file(path: Path) -> Ports | None:
    """The ports a server wrote to `path`, or None while it has written nothing."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def announcing(program: str, port_file: Path | None) -> Callable[[Ports], None]:
    """What a server does once it listens: print its ports and, when asked, write them to `port_file`."""

    def announce(ports: Ports) -> None:
        if port_file is not None:
            write_port_file(port_file, ports)
        print(f"{program}: listening on " + ", ".join(f"{name} port {port}" for name, port in ports.items()),
              flush=True)

    return announce
