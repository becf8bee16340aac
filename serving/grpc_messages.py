"""The Open Inference Protocol's gRPC messages (KServe's generated `grpc_predict_v2_pb2`) for the
client and the load generator, without importing the `kserve` package: its __init__ imports
kserve.model_server, which parses sys.argv at import (`parser.parse_known_args()`, KServe 0.20) and
exits on our own `--protocol v2-binary|grpc`, since KServe declares a `--protocol` of its own.
The generated module needs only protobuf; loading it from its file registers the same descriptors
(and gives the same classes) as `kserve.protocol.grpc.grpc_predict_v2_pb2` does in a server.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import grpc

GENERATED_MODULE = Path("protocol", "grpc", "grpc_predict_v2_pb2.py")  # inside the kserve package
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"  # service and method of grpc_predict_v2.proto


def generated_messages() -> ModuleType:
    package = importlib.util.find_spec("kserve")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError("the kserve SDK is not installed: it provides the gRPC messages")
    spec = importlib.util.spec_from_file_location(
        "serving._grpc_predict_v2_pb2", Path(package.submodule_search_locations[0], GENERATED_MODULE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pb = generated_messages()


def model_infer(channel: grpc.Channel | grpc.aio.Channel) -> grpc.UnaryUnaryMultiCallable:
    """ModelInfer on `channel`, as the generated GRPCInferenceServiceStub calls it."""
    return channel.unary_unary(MODEL_INFER, request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)
