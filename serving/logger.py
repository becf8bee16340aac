"""The request-log sink: receives the CloudEvents of KServe's logger and appends them as JSON lines.

    python -m serving.logger --port P --out FILE [--host 127.0.0.1]

Point an InferenceService's `spec.predictor.logger.url` (or the server's --log-url) at it. Each
event (binary or structured mode) becomes one line: id, type, source, time, the other attributes,
and the data. A body that is not a CloudEvent gets a 400 and is not written.
"""

from __future__ import annotations

import argparse
import http.server
import json
import threading
from pathlib import Path
from typing import Sequence

from cloudevents.exceptions import GenericException
from cloudevents.http import from_http

from trainer import cli


def event_record(headers: dict[str, str], body: bytes) -> dict:
    event = from_http(headers, body)
    data = event.data
    if isinstance(data, (bytes, bytearray)):
        try:
            data = json.loads(data)
        except ValueError:
            data = data.decode(errors="replace")
    return {**event.get_attributes(), "data": data}


class EventAppender:
    def __init__(self, out: Path):
        out.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(out, "a", buffering=1)
        self.lock = threading.Lock()

    def append(self, record: dict) -> None:
        with self.lock:
            self.file.write(json.dumps(record, default=str) + "\n")


def make_server(host: str, port: int, appender: EventAppender) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            try:
                record = event_record(dict(self.headers.items()), body)
            except (GenericException, ValueError) as error:
                self.send_error_json(400, f"not a CloudEvent: {error}")
                return
            appender.append(record)
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

    return http.server.ThreadingHTTPServer((host, port), Handler)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="serving.logger", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--host", default="0.0.0.0", help="0.0.0.0 in a pod; 127.0.0.1 on a laptop")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    server = make_server(args.host, args.port, EventAppender(args.out))
    print(f"serving.logger: appending CloudEvents received on {args.host}:{args.port} to {args.out}",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    cli.run("serving.logger", main)
