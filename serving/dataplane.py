"""KServe's data plane with our reading of the v2 binary tensor data extension, and gRPC's answer
to a full queue.

KServe's v2 HTTP route hands a body that is not JSON to DataPlane.decode_inference_request, which
reads it with InferRequest.from_bytes: that decodes BYTES elements as UTF-8 text, so encoded images
fail (a 500), and a malformed header is a 500 too. serving.inputs.binary_infer_request reads the
same format with every problem a 400. gRPC requests reach the model through DataPlane.infer
(kserve.protocol.grpc.servicer), whose error interceptor makes anything but KServe's own errors
INTERNAL: a full queue becomes RESOURCE_EXHAUSTED, gRPC's 503.
"""

from __future__ import annotations

from typing import Dict

from grpc_interceptor.exceptions import ResourceExhausted
from kserve import ModelServer
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.infer_type import InferRequest

from serving.batching import QueueFull
from serving.inputs import binary_infer_request


class StrictDataPlane(DataPlane):
    def decode_inference_request(self, body: bytes | object, headers: Dict, model_name: str) -> InferRequest:
        if isinstance(body, bytes):
            return binary_infer_request(body, headers.get(INFERENCE_CONTENT_LENGTH_HEADER), model_name)
        return super().decode_inference_request(body, headers, model_name)

    async def infer(self, model_name: str, request: Dict | InferRequest,
                    headers: Dict[str, str] | None = None) -> tuple:
        try:
            return await super().infer(model_name, request, headers)
        except QueueFull as error:
            if isinstance(request, InferRequest) and request.from_grpc:
                raise ResourceExhausted(str(error)) from None
            raise  # HTTP: serving.server's handler answers 503 with Retry-After


def with_strict_dataplane(server: ModelServer) -> ModelServer:
    """`server` with a StrictDataPlane: ModelServer builds its data plane in __init__ and hands it
    to the HTTP and gRPC servers only in start()."""
    server.dataplane = StrictDataPlane(model_registry=server.registered_models)
    return server
