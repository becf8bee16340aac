"""Refused requests logged as one line each; server faults keep their ERROR and traceback.

KServe logs every error it answers at ERROR with its traceback, a client's bad request as much as a
bug: its HTTP exception handlers (kserve.errors: invalid_input_handler, model_not_found_handler, ...)
and its gRPC interceptor (kserve.protocol.grpc.interceptors.ExceptionToStatusInterceptor). A client
sending garbage then floods the log and pages whoever alerts on ERROR. A refusal is any answer the
server means to give: the client's mistake (HTTP 4xx; gRPC INVALID_ARGUMENT, NOT_FOUND), a full queue
or a model not ready (503; RESOURCE_EXHAUSTED, UNAVAILABLE), what it does not support (501;
UNIMPLEMENTED). It is logged here as one line, as KServe answers it; anything else is a fault (HTTP
500, gRPC INTERNAL) and KServe's own handlers still log it with its traceback. serving.server answers
the HTTP refusals (KServe's, and its own 413, 422 and full-queue 503); serving.kserve_overrides'
OneLineRefusals takes the place of KServe's gRPC interceptor.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kserve.logging import logger

# INFO, not WARNING: answering a bad request is the server doing its job, nothing for an operator to
# act on line by line (the rates are in /metrics: dist_ml_errors_total, dist_ml_queue_full_total),
# and the access line of the same request is INFO too; a log kept at WARNING then holds faults only.
REFUSAL_LEVEL = logging.INFO
# The reason is the error's message, never the request's body; cut short all the same, as is the
# model name, which comes from the client (the URL path or the gRPC message).
MAX_REASON_CHARS = 300
MAX_MODEL_CHARS = 100


def quoted(text: str, max_chars: int) -> str:
    """`text` as a JSON string, cut to `max_chars` first: a newline or quote in it stays inside the line."""
    return json.dumps(text if len(text) <= max_chars else text[:max_chars] + "...")


def log_refusal(protocol: str, status: int | str, model: str, reason: str) -> None:
    """`refused request: protocol=v1 status=400 model="fmnist" reason="..."` at REFUSAL_LEVEL, on KServe's
    logger: it goes wherever KServe's logging configuration sends the lines it replaces."""
    logger.log(REFUSAL_LEVEL, "refused request: protocol=%s status=%s model=%s reason=%s", protocol, status,
               quoted(model, MAX_MODEL_CHARS), quoted(reason, MAX_REASON_CHARS))


def grpc_model(request: Any) -> str:
    """The model a gRPC request names: ModelInfer's `model_name`, ModelReady's and ModelMetadata's `name`."""
    return str(getattr(request, "model_name", "") or getattr(request, "name", ""))
