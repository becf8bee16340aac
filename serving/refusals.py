"""Refused requests logged as one line each; server faults keep their ERROR and traceback.

KServe logs every error it answers at ERROR with its traceback, a client's bad request as much as a
bug: its HTTP exception handlers (kserve.errors: invalid_input_handler, model_not_found_handler, ...)
and its gRPC interceptor (kserve.protocol.grpc.interceptors.ExceptionToStatusInterceptor). A client
sending garbage then floods the log and pages whoever alerts on ERROR. A refusal is any answer the
server means to give: the client's mistake (HTTP 4xx; gRPC INVALID_ARGUMENT, NOT_FOUND), a full queue
or a model not ready (503; RESOURCE_EXHAUSTED, UNAVAILABLE), what it does not support (501;
UNIMPLEMENTED). It is logged here as one line, as KServe answers it; anything else is a fault (HTTP
500, gRPC INTERNAL) and KServe's own handlers still log it with its traceback. serving.server answers
the HTTP refusals (KServe's, and its own 413, 422 and full-queue 503); OneLineRefusals takes the place
of KServe's gRPC interceptor.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from grpc import ServicerContext, StatusCode
from grpc_interceptor.exceptions import GrpcException
from kserve.errors import (
    InferenceError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    ServerNotLive,
    ServerNotReady,
    UnsupportedProtocol,
)
from kserve.logging import logger
from kserve.protocol.grpc import server as kserve_grpc_server
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor

# INFO, not WARNING: answering a bad request is the server doing its job, nothing for an operator to
# act on line by line (the rates are in /metrics: dist_ml_errors_total, dist_ml_queue_full_total),
# and the access line of the same request is INFO too; a log kept at WARNING then holds faults only.
REFUSAL_LEVEL = logging.INFO
# The reason is the error's message, never the request's body; cut short all the same, as is the
# model name, which comes from the client (the URL path or the gRPC message).
MAX_REASON_CHARS = 300
MAX_MODEL_CHARS = 100
# KServe's HTTP handlers (kserve.protocol.rest.server.RESTServer._add_exception_handlers) whose status is
# not 500, by the class they handle: these answers are refusals. Each answers {"error": str(error)}.
HTTP_REFUSALS = ((InvalidInput, 400), (ModelNotFound, 404), (ModelNotReady, 503), (ServerNotReady, 503),
                 (ServerNotLive, 503), (UnsupportedProtocol, 501), (NotImplementedError, 501))
# The statuses KServe's gRPC interceptor gives its errors other than INTERNAL.
GRPC_REFUSALS = ((InferenceError, StatusCode.INVALID_ARGUMENT), (InvalidInput, StatusCode.INVALID_ARGUMENT),
                 (UnsupportedProtocol, StatusCode.INVALID_ARGUMENT), (ServerNotReady, StatusCode.UNAVAILABLE),
                 (ServerNotLive, StatusCode.UNAVAILABLE), (NotImplementedError, StatusCode.UNIMPLEMENTED),
                 (ModelNotFound, StatusCode.NOT_FOUND), (ModelNotReady, StatusCode.UNAVAILABLE))


def quoted(text: str, max_chars: int) -> str:
    """`text` as a JSON string, cut to `max_chars` first: a newline or quote in it stays inside the line."""
    return json.dumps(text if len(text) <= max_chars else text[:max_chars] + "...")


def log_refusal(protocol: str, status: int | str, model: str, reason: str) -> None:
    """`refused request: protocol=v1 status=400 model="fmnist" reason="..."` at REFUSAL_LEVEL, on KServe's
    logger: it goes wherever KServe's logging configuration sends the lines it replaces."""
    logger.log(REFUSAL_LEVEL, "refused request: protocol=%s status=%s model=%s reason=%s", protocol, status,
               quoted(model, MAX_MODEL_CHARS), quoted(reason, MAX_REASON_CHARS))


def http_refusal_status(error: Exception) -> int:
    """The status KServe answers `error` with over HTTP, for an instance of a class of HTTP_REFUSALS."""
    return next(status for kind, status in HTTP_REFUSALS if isinstance(error, kind))


def grpc_refusal(error: Exception) -> tuple[StatusCode, str] | None:
    """(status, details) of `error` over gRPC if that is a refusal, else None: a GrpcException is
    raised on purpose (serving.dataplane's RESOURCE_EXHAUSTED), a refusal unless it is INTERNAL."""
    if isinstance(error, GrpcException):
        return None if error.status_code == StatusCode.INTERNAL else (error.status_code, error.details)
    code = next((code for kind, code in GRPC_REFUSALS if isinstance(error, kind)), None)
    return None if code is None else (code, str(error))


def grpc_model(request: Any) -> str:
    """The model a gRPC request names: ModelInfer's `model_name`, ModelReady's and ModelMetadata's `name`."""
    return str(getattr(request, "model_name", "") or getattr(request, "name", ""))


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
