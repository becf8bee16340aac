"""KServe's data plane with our reading of the v2 binary tensor data extension, and gRPC requests
measured and their full queue answered as gRPC does.

KServe's v2 HTTP route hands a body that is not JSON to DataPlane.decode_inference_request, which
reads it with InferRequest.from_bytes: that decodes BYTES elements as UTF-8 text, so encoded images
fail (a 500), and a malformed header is a 500 too. serving.inputs.binary_infer_request reads the
same format with every problem a 400. gRPC requests reach the model through DataPlane.infer
(kserve.protocol.grpc.servicer), past serving.server's HTTP middleware that counts requests: they
are counted here (and held in flight while they run), under protocol "grpc" with the HTTP status
of the same outcome, so that error rates, latencies and the requests in flight cover every
protocol. KServe's gRPC error interceptor makes anything but KServe's own errors INTERNAL: a full
queue becomes RESOURCE_EXHAUSTED, gRPC's 503.
"""

from __future__ import annotations

import time
from typing import Dict

from grpc_interceptor.exceptions import ResourceExhausted
from kserve import ModelServer
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER
from kserve.errors import InferenceError, InvalidInput, ModelNotFound, ModelNotReady
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.infer_type import InferRequest

from serving.batching import QueueFull
from serving.inputs import binary_infer_request
from serving.metrics import ANSWERED_BY, ERRORS, IN_FLIGHT, VERSION_LABEL, error_kind, observe_request

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
