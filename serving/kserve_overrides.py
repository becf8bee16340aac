"""Every place the model server replaces, restates or reaches into KServe's internals, beside the
KServe release they were read at (KSERVE_VERSION, the SDK pyproject.toml pins): a KServe upgrade means
re-reading this module, and tests/test_kserve_overrides.py names each upstream function that changed
(UPSTREAM_SOURCES: the SHA-256 of its source at that release, and what here depends on it).

Each override is kept for a measured reason (docs/results/serving-benchmark.md) or a behaviour KServe
gets wrong for this model:
- InferenceRoute answers the v1 `:predict` and v2 `/infer` routes without FastAPI's routing and
  dependency solving, the same calls of the data plane as KServe's endpoints;
- without_kserve_timing drops KServe's TimingMiddleware (two getrusage calls per request);
- HTTP_REFUSALS, GRPC_REFUSALS and OneLineRefusals log a refused request as one line where KServe logs
  an ERROR with a traceback (serving.refusals);
- StrictDataPlane reads the v2 binary tensor extension (KServe's reader decodes BYTES as UTF-8 text)
  and measures gRPC requests, which serving.server's HTTP middleware never sees;
- DirectPredict times `predict` without Model.__call__'s generic path;
- reporting_bound_ports learns the ports ModelServer bound, which KServe drops;
- with_uvloop runs the server on uvloop, which KServe's "auto" event loop does not with one worker.
"""

from __future__ import annotations

import asyncio
import email.message
import json
import re
import time
from typing import Any, Callable, Dict

import pydantic
import uvloop
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import ORJSONResponse
from grpc import ServicerContext, StatusCode
from grpc_interceptor.exceptions import GrpcException, ResourceExhausted
from kserve import Model, ModelServer
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER, PredictorProtocol
from kserve.errors import (
    InferenceError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    ServerNotLive,
    ServerNotReady,
    UnsupportedProtocol,
)
from kserve.metrics import PREDICT_HIST_TIME, get_labels
from kserve.model import InferenceVerb
from kserve.model_server import args as kserve_args
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import server as kserve_grpc_server
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.grpc.server import GRPCServer
from kserve.protocol.infer_type import InferRequest, InferResponse
from kserve.protocol.rest.v2_datamodels import InferenceRequest, InferenceResponse
from starlette.requests import Request
from starlette.responses import Response
from timing_asgi import TimingMiddleware

from serving.batching import QueueFull
from serving.inputs import binary_infer_request
from serving.metrics import ANSWERED_BY, ERRORS, IN_FLIGHT, VERSION_LABEL, error_kind, observe_request
from serving.port_file import Ports
from serving.refusals import grpc_model, log_refusal

KSERVE_VERSION = "0.20.0"
# "module:qualified name" of each upstream function -> (the SHA-256 of its source at KSERVE_VERSION,
# its first 16 hex digits; the names, here or elsewhere in serving/, that replace, restate or rely on it).
UPSTREAM_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "kserve.protocol.rest.v1_endpoints:V1Endpoints.predict":
        ("b1da6ffcb904c89d", ("InferenceRoute._predict_v1",)),
    "kserve.protocol.rest.v2_endpoints:V2Endpoints.infer":
        ("57fdb35815a30a11", ("InferenceRoute._infer_v2",)),
    "kserve.protocol.rest.v1_endpoints:register_v1_endpoints":
        ("8799382bb2fad904", ("INFERENCE_PATHS",)),
    "kserve.protocol.rest.v2_endpoints:register_v2_endpoints":
        ("b9550dd38af9f0e1", ("INFERENCE_PATHS", "v2_body")),
    "kserve.protocol.rest.server:RESTServer.__init__":
        ("dcfafd10a2f09c5c", ("reporting_bound_ports",)),
    "kserve.protocol.rest.server:RESTServer.create_application":
        ("f821f63b402457eb", ("at_build",)),
    "kserve.protocol.rest.server:RESTServer._add_middlewares":
        ("eb71860ac9500c56", ("without_kserve_timing",)),
    "kserve.protocol.rest.server:RESTServer._add_exception_handlers":
        ("ca0a28c1b356a6eb", ("HTTP_REFUSALS",)),
    "kserve.protocol.grpc.interceptors:ExceptionToStatusInterceptor.handle_exception":
        ("f9a4d0abc9843c24", ("GRPC_REFUSALS", "GRPC_ERROR_STATUSES", "OneLineRefusals")),
    "kserve.protocol.grpc.server:GRPCServer.__init__":
        ("d2f75891584958f5", ("reporting_bound_ports",)),
    "kserve.protocol.grpc.server:GRPCServer.start":
        ("f4ea7b4eb6f0d9f7", ("with_one_line_grpc_refusals", "PortKeepingGRPCServer")),
    "kserve.protocol.dataplane:DataPlane.decode_inference_request":
        ("d9b169889aa3e564", ("StrictDataPlane",)),
    "kserve.protocol.infer_type:InferRequest.from_bytes":
        ("5e8eda9b7377df70", ("StrictDataPlane", "serving.inputs.binary_infer_request")),
    "kserve.protocol.dataplane:DataPlane.infer":
        ("c2d45f0682235cdc", ("StrictDataPlane",)),
    "kserve.model_server:ModelServer.__init__":
        ("3adc575a6541be2c", ("with_strict_dataplane",)),
    "kserve.model_server:ModelServer.start":
        ("bc1b380a14013d6d", ("reporting_bound_ports", "with_uvloop")),
    "kserve.model_server:ModelServer.setup_event_loop":
        ("7f1f9b173b0b122b", ("with_uvloop",)),
    "kserve.model:Model.__call__":
        ("acf019685a2c07de", ("DirectPredict",)),
}


# --- The v1 and v2 inference routes ------------------------------------------------------------------

# KServe's inference routes, by their own path patterns ({model_name} matches [^/]+ in Starlette):
# measured by LimitAndMeasure; answered by InferenceRoute unless the path names a model version.
INFERENCE_PATHS = {"v1": re.compile(r"^/v1/models/(?P<model>[^/]+):predict$"),
                   "v2": re.compile(r"^/v2/models/(?P<model>[^/]+)(?P<version>/versions/[^/]+)?/infer$")}


def protocol_of(path: str) -> str | None:
    return next((name for name, pattern in INFERENCE_PATHS.items() if pattern.match(path)), None)


class InferenceRoute:
    """KServe's v1 `:predict` and v2 `/infer` routes without FastAPI's routing and dependency
    solving (a large share of the server's Python per request: docs/results/serving-benchmark.md):
    the same calls of KServe's data plane as its V1Endpoints.predict and V2Endpoints.infer, and every
    error answered by the application's own exception handlers (KServe's and ours), so statuses and
    bodies are unchanged. A v2 body is parsed as FastAPI parses the route's `Union[InferenceRequest, bytes]`:
    JSON content types into an InferenceRequest, any other into bytes for the data plane (the binary
    tensor extension). Anything else (other paths and methods, model versions in the path, v2 bodies
    without a content type) goes on to the application. Sits inside LimitAndMeasure (body limit,
    metrics).
    """

    def __init__(self, app: Callable, dataplane: DataPlane, handlers: FastAPI):
        self.app, self.dataplane, self.handlers = app, dataplane, handlers

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        route = lean_route(scope)
        if route is None:
            return await self.app(scope, receive, send)
        protocol, model_name = route
        body = await read_body(receive)
        if body is None:  # the client went away before sending its body: no one to answer
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        try:
            infer = self._predict_v1 if protocol == "v1" else self._infer_v2
            response = await infer(model_name, body, headers)
        except Exception as error:
            response = await self._error_response(scope, error)
        await response(scope, receive, send)

    async def _ready_model(self, model_name: str) -> None:
        if not await self.dataplane.model_ready(model_name, True):  # as KServe's routes: no
            raise ModelNotReady(model_name)                         # predictor health check

    async def _predict_v1(self, model_name: str, body: bytes, headers: dict[str, str]) -> Response:
        """kserve.protocol.rest.v1_endpoints.V1Endpoints.predict, for one model's response."""
        await self._ready_model(model_name)
        request, attributes = self.dataplane.decode(body=body, headers=headers)
        response, response_headers = await self.dataplane.infer(model_name=model_name, request=request,
                                                               headers=headers)
        response, encoded_headers = self.dataplane.encode(model_name=model_name, response=response,
                                                          headers=headers, req_attributes=attributes)
        response_headers.update(encoded_headers)
        response_headers.pop("content-length", None)
        if isinstance(response, (bytes, str)):
            return Response(content=response, headers=response_headers)
        return ORJSONResponse(content=response, headers=response_headers)

    async def _infer_v2(self, model_name: str, body: bytes, headers: dict[str, str]) -> Response:
        """kserve.protocol.rest.v2_endpoints.V2Endpoints.infer with FastAPI's parsing of its body."""
        await self._ready_model(model_name)
        request, _ = self.dataplane.decode(v2_body(body, headers["content-type"]), headers,
                                           protocol_version=PredictorProtocol.REST_V2.value,
                                           model_name=model_name)
        response, response_headers = await self.dataplane.infer(model_name=model_name, request=request,
                                                               headers=headers)
        response, encoded_headers = self.dataplane.encode(model_name=model_name, response=response,
                                                          headers=headers, req_attributes={})
        response_headers.update(encoded_headers)
        for name in ("content-length", "content-type"):
            response_headers.pop(name, None)
        if isinstance(response, bytes):  # binary outputs, as KServe's route sends them
            return Response(content=response, headers=response_headers)
        return Response(InferenceResponse.model_validate(response).model_dump_json(),
                        media_type="application/json", headers=response_headers)

    async def _error_response(self, scope: dict, error: Exception) -> Response:
        """The response of the application's handler for `error`'s class or its nearest base."""
        handler = next(self.handlers.exception_handlers[cls] for cls in type(error).__mro__
                       if cls in self.handlers.exception_handlers)
        return await handler(Request(scope), error)


def lean_route(scope: dict) -> tuple[str, str] | None:
    """(protocol, model name) of a request InferenceRoute answers, else None."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    for protocol, pattern in INFERENCE_PATHS.items():
        if match := pattern.match(scope["path"]):
            if match.groupdict().get("version"):
                return None  # KServe's own route for a model version (501: not supported)
            if protocol == "v2" and b"content-type" not in dict(scope["headers"]):
                return None  # FastAPI's reading of such a body depends on its strictness setting
            return protocol, match["model"]
    return None


def is_json(content_type: str) -> bool:
    """FastAPI's own test of a JSON body: application/json or application/*+json."""
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json"
                                                                or subtype.endswith("+json"))


async def read_body(receive: Callable) -> bytes | None:
    """The whole request body; None if the client disconnected first."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def v2_body(body: bytes, content_type: str) -> InferenceRequest | bytes:
    """FastAPI's parsing of a body into the v2 route's `Union[InferenceRequest, bytes]`, and its
    errors (a RequestValidationError, a 422): a JSON body into an InferenceRequest, any other as is."""
    if not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required",
                                       "input": None}])
    if not is_json(content_type):
        return body
    try:
        return InferenceRequest.model_validate(json.loads(body))
    except json.JSONDecodeError as error:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", error.pos),
                                       "msg": "JSON decode error", "input": {},
                                       "ctx": {"error": error.msg}}]) from None
    except pydantic.ValidationError as error:
        raise RequestValidationError([{**problem, "loc": ("body", *problem["loc"])}
                                      for problem in error.errors()]) from None



# --- Middleware --------------------------------------------------------------------------------------

def at_build(app: FastAPI, step: Callable[[FastAPI], None]) -> None:
    """Runs `step(app)` when Starlette builds `app`'s middleware stack, on its first call: after
    ModelServer.start has added KServe's middleware and exception handlers, which `step` may change."""
    build = app.build_middleware_stack

    def build_after_step():
        step(app)
        return build()

    app.build_middleware_stack = build_after_step


def drop_kserve_timing(app: FastAPI) -> None:
    app.user_middleware = [m for m in app.user_middleware if m.cls is not TimingMiddleware]


def without_kserve_timing(app: FastAPI) -> None:
    """Leaves KServe's TimingMiddleware out of `app` when Starlette builds its middleware stack.

    KServe installs it whatever `enable_latency_logging` says; its two getrusage calls per request
    cost a share of the server's CPU under load (docs/results/serving-benchmark.md), and
    dist_ml_request_seconds measures the same latency.
    KServe adds it inside ModelServer.start, so it is filtered out at the build, on the first call.
    """
    at_build(app, drop_kserve_timing)


# --- Errors: refusals as one line, gRPC's statuses ---------------------------------------------------

# KServe's HTTP handlers (kserve.protocol.rest.server.RESTServer._add_exception_handlers) whose status is
# not 500, by the class they handle: these answers are refusals. Each answers {"error": str(error)}.
HTTP_REFUSALS = ((InvalidInput, 400), (ModelNotFound, 404), (ModelNotReady, 503), (ServerNotReady, 503),
                 (ServerNotLive, 503), (UnsupportedProtocol, 501), (NotImplementedError, 501))
# The statuses KServe's gRPC interceptor gives its errors other than INTERNAL.
GRPC_REFUSALS = ((InferenceError, StatusCode.INVALID_ARGUMENT), (InvalidInput, StatusCode.INVALID_ARGUMENT),
                 (UnsupportedProtocol, StatusCode.INVALID_ARGUMENT), (ServerNotReady, StatusCode.UNAVAILABLE),
                 (ServerNotLive, StatusCode.UNAVAILABLE), (NotImplementedError, StatusCode.UNIMPLEMENTED),
                 (ModelNotFound, StatusCode.NOT_FOUND), (ModelNotReady, StatusCode.UNAVAILABLE))


def http_refusal_status(error: Exception) -> int:
    """The status KServe answers `error` with over HTTP, for an instance of a class of HTTP_REFUSALS."""
    return next(status for kind, status in HTTP_REFUSALS if isinstance(error, kind))


def grpc_refusal(error: Exception) -> tuple[StatusCode, str] | None:
    """(status, details) of `error` over gRPC if that is a refusal, else None: a GrpcException is
    raised on purpose (StrictDataPlane's RESOURCE_EXHAUSTED), a refusal unless it is INTERNAL."""
    if isinstance(error, GrpcException):
        return None if error.status_code == StatusCode.INTERNAL else (error.status_code, error.details)
    code = next((code for kind, code in GRPC_REFUSALS if isinstance(error, kind)), None)
    return None if code is None else (code, str(error))


class OneLineRefusals(ExceptionToStatusInterceptor):
    """KServe's gRPC error interceptor, with a refusal answered as KServe answers it but logged as one
    line; a fault still goes to KServe's, which logs it at ERROR with its traceback (INTERNAL)."""

    async def handle_exception(self, ex: Exception, request_or_iterator: Any, context: ServicerContext,
                               method_name: str) -> None:
        refusal = grpc_refusal(ex)
        if refusal is None:
            return await super().handle_exception(ex, request_or_iterator, context, method_name)
        code, details = refusal
        log_refusal("grpc", code.name, grpc_model(request_or_iterator), details)
        await context.abort(code, details)


def with_one_line_grpc_refusals() -> None:
    """OneLineRefusals in KServe's gRPC server: GRPCServer.start builds its interceptors from its
    module's names, so that module's ExceptionToStatusInterceptor is ours (a subclass) from now on."""
    kserve_grpc_server.ExceptionToStatusInterceptor = OneLineRefusals


# --- The data plane: binary tensors, gRPC measured ----------------------------------------------------

# The HTTP status of each outcome of a gRPC request, as KServe's interceptor maps it to a gRPC code:
# INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE; RESOURCE_EXHAUSTED for a full queue; INTERNAL otherwise.
GRPC_ERROR_STATUSES = ((InvalidInput, 400), (InferenceError, 400), (ModelNotFound, 404),
                       (ModelNotReady, 503), (QueueFull, 503))
INTERNAL_ERROR_STATUS = 500


def status_of(error: Exception) -> int:
    return next((status for kind, status in GRPC_ERROR_STATUSES if isinstance(error, kind)),
                INTERNAL_ERROR_STATUS)


def observe_grpc(status: int, seconds: float, version: str, queue_full: bool = False) -> None:
    """`version`: the served version that answered, as for HTTP requests ("" if none was chosen). A
    full queue is counted once, in dist_ml_queue_full_total, not also as a "not ready" error."""
    observe_request("grpc", status, version, seconds)
    if (kind := error_kind(status)) and not queue_full:
        ERRORS.labels(kind, version).inc()


class StrictDataPlane(DataPlane):
    """KServe's data plane with our reading of the v2 binary tensor data extension, and gRPC requests
    measured and their full queue answered as gRPC does.

    KServe's v2 HTTP route hands a body that is not JSON to decode_inference_request, which reads it
    with InferRequest.from_bytes: that decodes BYTES elements as UTF-8 text, so encoded images fail
    (a 500), and a malformed header is a 500 too. serving.inputs.binary_infer_request reads the same
    format with every problem a 400. gRPC requests reach the model through `infer`
    (kserve.protocol.grpc.servicer), past serving.server's HTTP middleware that counts requests: they
    are counted here (and held in flight while they run), under protocol "grpc" with the HTTP status
    of the same outcome, so that error rates, latencies and the requests in flight cover every
    protocol. KServe's gRPC error interceptor makes anything but KServe's own errors INTERNAL: a full
    queue becomes RESOURCE_EXHAUSTED, gRPC's 503.
    """

    def decode_inference_request(self, body: bytes | object, headers: Dict, model_name: str) -> InferRequest:
        if isinstance(body, bytes):
            return binary_infer_request(body, headers.get(INFERENCE_CONTENT_LENGTH_HEADER), model_name)
        return super().decode_inference_request(body, headers, model_name)

    async def infer(self, model_name: str, request: Dict | InferRequest,
                    headers: Dict[str, str] | None = None) -> tuple:
        if not (isinstance(request, InferRequest) and request.from_grpc):
            return await super().infer(model_name, request, headers)
        started, status, answered_by, queue_full = time.perf_counter(), INTERNAL_ERROR_STATUS, {}, False
        ANSWERED_BY.set(answered_by)  # the model notes which version failed a request
        IN_FLIGHT.inc()
        try:
            result = await super().infer(model_name, request, headers)
            status = 200
            answered_by[VERSION_LABEL] = str(result[0].model_version or "")
            return result
        except Exception as error:
            status, queue_full = status_of(error), isinstance(error, QueueFull)
            if queue_full:
                raise ResourceExhausted(str(error)) from None
            raise
        finally:
            IN_FLIGHT.dec()
            version = answered_by.get(VERSION_LABEL, "")
            observe_grpc(status, time.perf_counter() - started, version, queue_full)


def with_strict_dataplane(server: ModelServer) -> ModelServer:
    """`server` with a StrictDataPlane: ModelServer builds its data plane in __init__ and hands it
    to the HTTP and gRPC servers only in start()."""
    server.dataplane = StrictDataPlane(model_registry=server.registered_models)
    return server


# --- The model's predict call ------------------------------------------------------------------------

class DirectPredict(Model):
    """A KServe Model without preprocess or postprocess steps, whose `predict` is called directly."""

    def __init__(self, name: str, **kwargs: Any):
        super().__init__(name, **kwargs)
        self._predict_seconds = PREDICT_HIST_TIME.labels(**get_labels(name))

    async def __call__(self, body: dict | InferRequest, headers: dict[str, str] | None = None,
                       verb: InferenceVerb = InferenceVerb.PREDICT) -> tuple[dict | InferResponse, dict]:
        """KServe's Model.__call__ for a model without preprocess or postprocess steps: `predict`,
        timed in KServe's request_predict_seconds as there, without the generic path's three
        histograms' label lookups, coroutine checks and clock reads per request, a share of the
        server's CPU under load (docs/results/serving-benchmark.md). Other verbs go the generic way."""
        if verb != InferenceVerb.PREDICT:
            return await super().__call__(body, headers, verb)
        response_headers: dict[str, str] = {}
        started = time.perf_counter()
        try:
            response = await self.predict(body, headers, response_headers)
        finally:  # failures too, as KServe's timer
            self._predict_seconds.observe(time.perf_counter() - started)
        return response, response_headers


# --- The ports bound, the event loop ------------------------------------------------------------------
# ModelServer builds its HTTP (uvicorn) and gRPC servers inside start(), and its gRPC server drops the
# port `add_insecure_port` answers, the only way gRPC tells which port it bound. `reporting_bound_ports`
# runs a gRPC server that keeps it, and reads the HTTP port off uvicorn's socket once uvicorn has
# started (tests/test_serving_server.py binds port 0 through both). benchmarks/stock_kserve.py uses it
# too, on an otherwise stock KServe server.

BIND_POLL_SECONDS = 0.01


class PortKeepingGRPCServer(GRPCServer):
    """KServe's gRPC server, keeping the port its start() binds (`bound_port`, None until then)."""

    bound_port: int | None = None

    @property
    def _server(self) -> Any:  # the grpc.aio.Server that KServe's start() makes
        return self._aio_server

    @_server.setter
    def _server(self, server: Any) -> None:
        self._aio_server = server
        if server is not None:
            bind = server.add_insecure_port

            def add_insecure_port(address: str) -> int:
                self.bound_port = bind(address)
                return self.bound_port

            server.add_insecure_port = add_insecure_port


async def _report_once_bound(server: ModelServer, grpc: PortKeepingGRPCServer | None,
                             report: Callable[[Ports], None]) -> None:
    rest = server._rest_server._server  # the uvicorn.Server that ModelServer.start() made
    while not rest.started or (grpc is not None and grpc.bound_port is None):
        await asyncio.sleep(BIND_POLL_SECONDS)
    ports = {"http": rest.servers[0].sockets[0].getsockname()[1]}
    if grpc is not None:
        ports["grpc"] = grpc.bound_port
    report(ports)


def reporting_bound_ports(server: ModelServer, report: Callable[[Ports], None]) -> ModelServer:
    """`server`, which calls `report` with the ports it bound once it listens on all of them. Call
    it once the server's data plane is final: the gRPC server is made here, with that data plane."""
    grpc = None
    if server.enable_grpc:
        # ModelServer.start() makes its gRPC server only when enable_grpc; this one, with the
        # arguments KServe gives its own, takes its place, and stop() stops it (it is _grpc_server).
        grpc = PortKeepingGRPCServer(server.grpc_port, server.dataplane, server.model_repository_extension,
                                     kwargs=vars(kserve_args), grace_period=server.grace_period)
        server.enable_grpc, server._grpc_server = False, grpc
        server.servers.append(grpc.start(server.max_threads))
    server.servers.append(_report_once_bound(server, grpc, report))
    return server


def with_uvloop() -> None:
    """uvloop for ModelServer.start: KServe's --event_loop "auto" means uvloop, but with one worker
    ModelServer.start runs asyncio.run on the default policy's loop. A current loop is set too, for
    ModelServer.setup_event_loop's get_event_loop (which uvloop's policy, unlike asyncio's, does not
    create)."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.set_event_loop(asyncio.new_event_loop())
