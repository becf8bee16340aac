"""The request-log sink: receives the CloudEvents of KServe's logger and writes them as JSON lines
into a directory of files, each closed after a while.

    python -m serving.logger --port P --out-dir DIR [--rotate-seconds 60]
        [--rotate-bytes 16777216] [--host 127.0.0.1] [--port-file FILE]

Point an InferenceService's `spec.predictor.logger.url` (or the server's --log-url) at it. Each
event (binary or structured mode) becomes one line: id, type, source, time, the other attributes,
and the data. A body that is not a CloudEvent gets a 400 and is not written. Port 0 binds any free
port, which --port-file FILE receives once the logger listens (serving.port_file).

The lines go to DIR/events-<UTC time>-<sequence>.jsonl (names sort by time). A file is opened at
the first event after the previous one was closed, and closed once it has been open
--rotate-seconds or would grow past --rotate-bytes, and on SIGTERM or SIGINT. That is for object
storage mounted with GCS FUSE, where a file becomes an object only once closed: each closed file is
one object, readable while the logger runs. On a local disk the newest file may still be open.
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import json
import signal
import threading
import time
from pathlib import Path
from typing import IO, Callable, Sequence

from cloudevents.exceptions import GenericException
from cloudevents.http import from_http

from common import cli
from serving.port_file import PORT_FILE_FLAG, PORT_FILE_HELP, announcing

DEFAULT_ROTATE_SECONDS = 60.0
DEFAULT_ROTATE_BYTES = 16 * 1024 * 1024
FILE_PREFIX = "events-"
FILE_SUFFIX = ".jsonl"
# How often the age of the open file is checked, at most: a quiet logger still closes it in time.
MAX_CHECK_INTERVAL_SECONDS = 1.0


def event_record(headers: dict[str, str], body: bytes) -> dict:
    event = from_http(headers, body)
    data = event.data
    if isinstance(data, (bytes, bytearray)):
        try:
            data = json.loads(data)
        except ValueError:
            data = data.decode(errors="replace")
    return {**event.get_attributes(), "data": data}


def file_name(opened: datetime.datetime, sequence: int) -> str:
    """`events-20250102T030405.678901Z-000001.jsonl`: sorts by opening time, then sequence."""
    return f"{FILE_PREFIX}{opened:%Y%m%dT%H%M%S.%f}Z-{sequence:06d}{FILE_SUFFIX}"


class RotatingEventFiles:
    """JSON lines appended to the open file of `directory`, rotated by age and size.

    Thread-safe. `close` closes the open file for good: a later event is an error (RuntimeError).
    """

    def __init__(self, directory: Path, rotate_seconds: float = DEFAULT_ROTATE_SECONDS,
                 rotate_bytes: int = DEFAULT_ROTATE_BYTES, clock: Callable[[], float] = time.monotonic):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.rotate_seconds, self.rotate_bytes = directory, rotate_seconds, rotate_bytes
        self.clock = clock
        self.lock = threading.Lock()
        self.file: IO[bytes] | None = None
        self.opened_at = 0.0
        self.size = 0
        self.sequence = 0
        self.closed = False

    def append(self, record: dict) -> None:
        line = (json.dumps(record, default=str) + "\n").encode()
        with self.lock:
            if self.closed:
                raise RuntimeError("the event files are closed")
            if self.file is not None and self.size + len(line) > self.rotate_bytes:
                self._close_file()
            if self.file is None:
                self._open_file()
            self.file.write(line)
            self.size += len(line)

    def rotate_if_due(self) -> None:
        """Closes the open file once it is --rotate-seconds old (called by a timer, not by events,
        so that the last file before a quiet spell is closed too)."""
        with self.lock:
            if self.file is not None and self.clock() - self.opened_at >= self.rotate_seconds:
                self._close_file()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self._close_file()

    def _open_file(self) -> None:
        while True:
            self.sequence += 1
            path = self.directory / file_name(datetime.datetime.now(datetime.timezone.utc), self.sequence)
            try:  # "x": never append to a file of an earlier run that had the same name
                # Unbuffered: each line is one write, so that a local reader sees whole lines;
                # on GCS FUSE the object is uploaded at close whatever the buffering.
                self.file = open(path, "xb", buffering=0)
                break
            except FileExistsError:
                continue
        self.opened_at, self.size = self.clock(), 0

    def _close_file(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def rotate_periodically(files: RotatingEventFiles, stop: threading.Event) -> threading.Thread:
    interval = min(MAX_CHECK_INTERVAL_SECONDS, files.rotate_seconds / 4)

    def run() -> None:
        while not stop.wait(interval):
            files.rotate_if_due()

    thread = threading.Thread(target=run, name="rotate-event-files", daemon=True)
    thread.start()
    return thread


def make_server(host: str, port: int, files: RotatingEventFiles) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            try:
                record = event_record(dict(self.headers.items()), body)
            except (GenericException, ValueError) as error:
                self.send_error_json(400, f"not a CloudEvent: {error}")
                return
            try:
                files.append(record)
            except (OSError, RuntimeError) as error:
                self.send_error_json(503, f"event not written: {error}")
                return
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def send_error_json(self, status: int, message: str) -> None:
            payload = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args) -> None:  # one line per event is the file's job
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = False  # server_close waits for requests in flight, before the files close
    return server


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="serving.logger", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="0: any free port")
    parser.add_argument(PORT_FILE_FLAG, type=Path, help=PORT_FILE_HELP)
    parser.add_argument("--out-dir", type=Path, required=True,
                        help="directory of the event files (events-<UTC time>-<sequence>.jsonl)")
    parser.add_argument("--rotate-seconds", type=cli.positive_float, default=DEFAULT_ROTATE_SECONDS,
                        help="close a file once it has been open this long")
    parser.add_argument("--rotate-bytes", type=cli.positive_int, default=DEFAULT_ROTATE_BYTES,
                        help="close a file before it grows past this size")
    parser.add_argument("--host", default="0.0.0.0", help="0.0.0.0 in a pod; 127.0.0.1 on a laptop")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    files = RotatingEventFiles(args.out_dir, args.rotate_seconds, args.rotate_bytes)
    server = make_server(args.host, args.port, files)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):  # Kubernetes stops a pod with SIGTERM
        signal.signal(signum, lambda *_: stopping.set())
    rotate_periodically(files, stopping)
    serving = threading.Thread(target=server.serve_forever, name="serve", daemon=True)
    serving.start()
    port = server.server_address[1]  # bound when the server was made: with --port 0, the one it got
    print(f"serving.logger: writing CloudEvents received on {args.host}:{port} to "
          f"{args.out_dir}/{FILE_PREFIX}*{FILE_SUFFIX}", flush=True)
    announcing("serving.logger", args.port_file)({"http": port})
    try:
        while not stopping.wait(MAX_CHECK_INTERVAL_SECONDS):
            pass
    finally:
        server.shutdown()
        server.server_close()
        files.close()
    print("serving.logger: stopped; every event file is closed", flush=True)


if __name__ == "__main__":
    cli.run("serving.logger", main)
