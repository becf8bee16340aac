"""The model server: KServe's v1 and v2 protocols for the newest published version of a model.

    python -m serving.server (--model-repo REPO | --model-base-path DIR) --model-name fmnist
        [--http-port 8080] [--grpc-port 8081 | --no-grpc] [--port-file FILE] [--max-batch-size 32]
        [--max-batch-wait-ms 0] [--max-queued-images 1024] [--log-file FILE | --log-url URL]
        [--log-grpc-only] [--access-log]

Built on the kserve SDK, so it runs unchanged as the `kserve-container` of an InferenceService
(there with `--model-base-path /mnt/models`, where KServe's storage initializer puts a release).
The versions are the committed numbered directories under REPO/<model-name>/, or under DIR.
Concurrent requests are batched (a request that finds the model idle runs at once, those that arrive
while it is busy make up the next batch); a newer version is served once loaded; bodies over
--max-body-bytes get a 413; past --max-queued-images waiting images a request gets a 503 with
Retry-After; /metrics is Prometheus; SIGTERM lets in-flight requests finish. A refused request is one
log line (serving.refusals), a server fault an ERROR with its traceback; uvicorn's line per request
(the access log) only with --access-log. Port 0 binds any free port; the ports bound are printed
and, with --port-file, written to FILE once the server listens (serving.port_file).
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from pathlib import Path
from typing import Callable, Sequence

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kserve import ModelServer
from kserve.model_server import app
from starlette.requests import Request

from common import cli
from serving.batching import QueueFull
from serving.kserve_overrides import (
    HTTP_REFUSALS,
    InferenceRoute,
    at_build,
    http_refusal_status,
    is_json,
    protocol_of,
    reporting_bound_ports,
    with_one_line_grpc_refusals,
    with_strict_dataplane,
    with_uvloop,
    without_kserve_timing,
)
from serving.metrics import ANSWERED_BY, ERRORS, IN_FLIGHT, VERSION_LABEL, error_kind, observe_request
from serving.model import DEFAULT_MAX_QUEUED_IMAGES, VERSION_HEADER, FashionMnistModel
from serving.port_file import PORT_FILE_FLAG, PORT_FILE_HELP, announcing
from serving.refusals import log_refusal
from serving.request_log import GRPC_ONLY, RequestLogger, cloudevents_sink, file_sink

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# What a 503 for a full queue tells clients to wait: the queue drains in under a second.
RETRY_AFTER_SECONDS = 1
VERSION_HEADER_BYTES = VERSION_HEADER.encode()  # ASGI header names are lower-case bytes
# The protocol and model of a refused request's log line, from any of KServe's paths (/v1/models/m:predict,
# /v2/models/m/infer, /v2/models/m/ready, /v2/health/live, ...); "http" for a path of neither protocol.
NAMED_PATH = re.compile(r"^/(?P<protocol>v[12])/(?:models/(?P<model>[^/:]+))?")
OTHER_PATH_PROTOCOL = "http"
# Set in a request's ASGI scope when it was refused for a full queue: counted once, in
# dist_ml_queue_full_total, not also as a "not ready" error.
QUEUE_FULL_SCOPE_KEY = "dist_ml.queue_full"


class LimitAndMeasure:
    """The body size limit (413), the requests in flight, and request count, latency and errors by
    protocol, status and the version that answered (its response header; for a failure, the version
    the model noted; "" when no version was chosen).

    Plain ASGI: Starlette's BaseHTTPMiddleware costs a task group and a response stream per request,
    which was about a tenth of the server's CPU under load.
    """

    def __init__(self, app: Callable, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        protocol = protocol_of(scope["path"]) if scope["type"] == "http" else None
        if protocol is None:
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status, version, answered_by = 500, "", {}
        ANSWERED_BY.set(answered_by)
        IN_FLIGHT.inc()

        async def send_and_note_status(message: dict) -> None:
            nonlocal status, version
            if message["type"] == "http.response.start":
                status = message["status"]
                version = dict(message.get("headers", ())).get(VERSION_HEADER_BYTES, b"").decode()
            await send(message)

        try:
            body, size = await self._body_within_limit(scope, receive)
            if body is None:
                await too_large(scope, size, self.max_body_bytes)(scope, receive, send_and_note_status)
            else:
                await self.app(scope, body, send_and_note_status)
        finally:
            IN_FLIGHT.dec()
            version = version or answered_by.get(VERSION_LABEL, "")
            observe_request(protocol, status, version, time.perf_counter() - started)
            if (kind := error_kind(status)) and not scope.get(QUEUE_FULL_SCOPE_KEY):
                ERRORS.labels(kind, version).inc()

    async def _body_within_limit(self, scope: dict, receive: Callable) -> tuple[Callable | None, int]:
        """(`receive` as the app should see it, or None when the body is over the limit, then
        drained so that the client reads a 413 rather than a reset; the body's size)."""
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) <= self.max_body_bytes:
            return receive, int(declared)
        # Over the limit, or of unknown size (chunked): read it all, keeping it only if small enough.
        messages, size, more = [], 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False) and message["type"] == "http.request"
            if size <= self.max_body_bytes:
                messages.append(message)
        if size > self.max_body_bytes:
            return None, size
        replay = iter(messages)

        async def replayed() -> dict:
            return next(replay, None) or await receive()

        return replayed, size


def request_names(scope: dict) -> tuple[str, str]:
    """(protocol, model) of an HTTP request for its log line: v1, v2, v2-binary (a v2 body that is not
    JSON: the binary tensor extension), or OTHER_PATH_PROTOCOL; the model its path names, or ""."""
    match = NAMED_PATH.match(scope["path"])
    if match is None:
        return OTHER_PATH_PROTOCOL, ""
    content_type = dict(scope["headers"]).get(b"content-type")
    if match["protocol"] == "v2" and content_type is not None and not is_json(content_type.decode("latin-1")):
        return "v2-binary", match["model"] or ""
    return match["protocol"], match["model"] or ""


def refused(scope: dict, status: int, reason: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The answer `{"error": reason}` to a refused request, logged as one line (no traceback)."""
    protocol, model = request_names(scope)
    log_refusal(protocol, status, model, reason)
    return JSONResponse({"error": reason}, status_code=status, headers=headers)


def too_large(scope: dict, size: int, max_body_bytes: int) -> JSONResponse:
    return refused(scope, 413, f"request body of {size} bytes is over the limit of {max_body_bytes} bytes")


async def queue_full_handler(request: Request, error: QueueFull) -> JSONResponse:
    request.scope[QUEUE_FULL_SCOPE_KEY] = True
    return refused(request.scope, 503, str(error), headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


async def invalid_request_handler(request: Request, error: RequestValidationError) -> JSONResponse:
    """FastAPI's own 422 echoes the offending input, and fails to serialise it (a 500) when it holds
    NaN or infinity: the problems are named without the input."""
    problems = "; ".join(f"{'.'.join(map(str, problem.get('loc', ())))}: {problem.get('msg', '')}"
                         for problem in error.errors())
    return refused(request.scope, 422, f"invalid request: {problems}")


async def refusal_handler(request: Request, error: Exception) -> JSONResponse:
    """KServe's answer to one of its errors that is a refusal (serving.kserve_overrides.HTTP_REFUSALS),
    logged as one line where KServe's handler logs an ERROR with the traceback."""
    return refused(request.scope, http_refusal_status(error), str(error))


def install_error_handlers(app: FastAPI) -> None:
    for error_class, _ in HTTP_REFUSALS:
        app.add_exception_handler(error_class, refusal_handler)
    app.add_exception_handler(QueueFull, queue_full_handler)
    app.add_exception_handler(RequestValidationError, invalid_request_handler)


def add_error_handlers(app: FastAPI) -> None:
    """Errors that KServe's handlers do not know (a 500) or answer badly, and KServe's refusals logged
    as one line each; KServe's handlers for faults (500) are kept: ERROR with the traceback. Installed
    at the build, since KServe's, added later, would replace ours for the same classes."""
    at_build(app, install_error_handlers)


def without_access_log() -> None:
    """No uvicorn access line per request: uvicorn's own `access_log=False`, which KServe does not
    expose (its protocols check for handlers per connection). The line was a large share of the
    server's CPU under load (docs/results/serving-benchmark.md); dist_ml_requests counts the same."""
    access = logging.getLogger("uvicorn.access")
    access.handlers, access.propagate = [], False


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="serving.server", description=__doc__.split("\n\n")[0])
    bases = parser.add_mutually_exclusive_group(required=True)
    bases.add_argument("--model-repo", type=Path,
                       help="a model repository: the versions are under REPO/<model-name>/")
    bases.add_argument("--model-base-path", type=Path,
                       help="TF Serving's base path: the versions are DIR's numbered children")
    parser.add_argument("--model-name", default="fmnist")
    parser.add_argument("--http-port", type=int, default=8080, help="0: any free port")
    grpc = parser.add_mutually_exclusive_group()
    grpc.add_argument("--grpc-port", type=int, default=8081, help="0: any free port")
    grpc.add_argument("--no-grpc", action="store_true", help="serve HTTP only")
    parser.add_argument(PORT_FILE_FLAG, type=Path, help=PORT_FILE_HELP)
    parser.add_argument("--max-batch-size", type=cli.positive_int, default=32)
    parser.add_argument("--max-batch-wait-ms", type=cli.non_negative_float, default=0.0,
                        help="how long a batch may wait for more requests before it runs (default 0: "
                             "a request that finds the model idle runs at once; those that arrive "
                             "while it is busy make up the next batch)")
    parser.add_argument("--poll-seconds", type=cli.positive_float, default=2.0,
                        help="how often to look for a newer version")
    parser.add_argument("--max-body-bytes", type=cli.positive_int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--max-queued-images", type=cli.positive_int, default=DEFAULT_MAX_QUEUED_IMAGES,
                        help="images waiting or in the model before requests get a 503 "
                             "(default: under a second of work)")
    sinks = parser.add_mutually_exclusive_group()
    sinks.add_argument("--log-file", type=Path, help="append each request and response as a JSON line")
    sinks.add_argument("--log-url", help="post each request and response as CloudEvents")
    parser.add_argument("--log-payloads", action="store_true", help="also log the raw inputs")
    parser.add_argument("--log-grpc-only", action="store_true",
                        help="log only gRPC requests: on a cluster, KServe's logger logs the HTTP ones")
    parser.add_argument("--access-log", action="store_true",
                        help="write uvicorn's access line for each HTTP request (off by default: the "
                             "request metrics count the same requests at a fraction of the cost)")
    return parser.parse_args(argv)


def base_path(args: argparse.Namespace) -> Path:
    """The directory whose committed numbered children are the versions."""
    return args.model_base_path or args.model_repo / args.model_name


def request_logger(args: argparse.Namespace) -> RequestLogger | None:
    protocols = GRPC_ONLY if args.log_grpc_only else None
    if args.log_file:
        return RequestLogger(file_sink(args.log_file), protocols=protocols)
    if args.log_url:
        return RequestLogger(cloudevents_sink(args.log_url), protocols=protocols)
    return None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    model = FashionMnistModel(args.model_name, base_path(args), args.max_batch_size,
                              args.max_batch_wait_ms / 1000, args.poll_seconds,
                              request_logger(args), args.log_payloads, args.max_queued_images)
    model.load()
    # KServe's per-request latency log lines are off: dist_ml_request_seconds measures the same.
    server = with_strict_dataplane(ModelServer(http_port=args.http_port, grpc_port=args.grpc_port,
                                               enable_grpc=not args.no_grpc, workers=1,
                                               enable_latency_logging=False))
    reporting_bound_ports(server, announcing("serving.server", args.port_file))
    app.add_middleware(InferenceRoute, dataplane=server.dataplane, handlers=app)
    app.add_middleware(LimitAndMeasure, max_body_bytes=args.max_body_bytes)  # outside InferenceRoute
    add_error_handlers(app)
    without_kserve_timing(app)
    with_one_line_grpc_refusals()
    if not args.access_log:
        without_access_log()
    with_uvloop()
    server.start([model])


if __name__ == "__main__":
    cli.run("serving.server", main, expected=(FileNotFoundError,))
