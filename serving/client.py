"""A client for the model server (and any KServe or TF Serving endpoint of the same model).

    python -m serving.client predict IMAGE... [--protocol v1|v2|v2-binary|grpc]
        [--url http://127.0.0.1:8080] [--grpc-address 127.0.0.1:8081] [--model-name fmnist]

v1 and v2 send JSON with base64 images; v2-binary sends the images as raw bytes with the Open
Inference Protocol's binary tensor data extension and asks for binary outputs; grpc calls ModelInfer
on --grpc-address with the images in raw_input_contents. Prints the class and confidence of each
image; on failure, exits non-zero with the server's error.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import struct
from pathlib import Path
from typing import Sequence

import grpc
import numpy as np
import requests

from common import cli
from serving.grpc_messages import model_infer, pb

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_GRPC_ADDRESS = "127.0.0.1:8081"
PROTOCOLS = ("v1", "v2", "v2-binary", "grpc")
TIMEOUT_SECONDS = 30
JSON_HEADERS = {"content-type": "application/json"}
# The binary tensor data extension: the length of the JSON part of a body that is JSON then bytes.
INFERENCE_HEADER_LENGTH = "inference-header-content-length"
IMAGES_INPUT = "image_bytes"
# Output datatype -> numpy dtype, for binary outputs (BYTES: length-prefixed elements).
BINARY_DTYPES = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "FP64": np.float64}


class ServerError(RuntimeError):
    """The server answered with an error, or not at all."""


def grpc_address(text: str) -> str:
    if not re.fullmatch(r"[^/:\s]+:[0-9]{1,5}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a HOST:PORT address")
    return text


def inference_request(images: Sequence[bytes], protocol: str, model_name: str) -> tuple[str, dict]:
    """The path and JSON body that classify encoded `images` with `protocol` (v1 or v2)."""
    encoded = [base64.b64encode(image).decode() for image in images]
    if protocol == "v1":
        return (f"/v1/models/{model_name}:predict",
                {"instances": [{"image_bytes": {"b64": text}} for text in encoded]})
    return (f"/v2/models/{model_name}/infer",
            {"inputs": [{"name": "image_bytes", "shape": [len(encoded)], "datatype": "BYTES",
                         "data": encoded}]})


def bytes_tensor(elements: Sequence[bytes]) -> bytes:
    """A BYTES tensor's binary form: each element a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(element)) + element for element in elements)


def bytes_elements(data: bytes) -> list[bytes]:
    elements, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        elements.append(data[offset + 4:offset + 4 + length])
        offset += 4 + length
    return elements


def binary_request(images: Sequence[bytes], model_name: str) -> tuple[str, bytes, dict]:
    """The path, body and headers of a v2 request whose BYTES input holds the encoded `images` as
    binary data, asking for binary outputs."""
    data = bytes_tensor(images)
    header = json.dumps({"inputs": [{"name": IMAGES_INPUT, "shape": [len(images)], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(data)}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return (f"/v2/models/{model_name}/infer", header + data,
            {INFERENCE_HEADER_LENGTH: str(len(header)), "content-type": "application/octet-stream"})


def http_request(images: Sequence[bytes], protocol: str, model_name: str) -> tuple[str, bytes, dict]:
    """The path, body and headers that classify `images` with an HTTP `protocol`."""
    if protocol == "v2-binary":
        return binary_request(images, model_name)
    path, body = inference_request(images, protocol, model_name)
    return path, json.dumps(body).encode(), JSON_HEADERS


def grpc_request(images: Sequence[bytes], model_name: str) -> pb.ModelInferRequest:
    """ModelInfer's request with the encoded `images` in raw_input_contents."""
    tensor = pb.ModelInferRequest.InferInputTensor(name=IMAGES_INPUT, datatype="BYTES", shape=[len(images)])
    return pb.ModelInferRequest(model_name=model_name, inputs=[tensor],
                                raw_input_contents=[bytes_tensor(images)])


def output_values(datatype: str, data: bytes) -> list:
    if datatype == "BYTES":
        return [element.decode() for element in bytes_elements(data)]
    return np.frombuffer(data, dtype=BINARY_DTYPES[datatype]).tolist()


def named_predictions(outputs: dict[str, list]) -> list[tuple[str, float]]:
    """(class name, confidence) per instance from the flat v2 outputs by name."""
    names = [name.decode() if isinstance(name, bytes) else name for name in outputs["class_name"]]
    probabilities = np.asarray(outputs["probabilities"], dtype=np.float64).reshape(len(names), -1)
    return [(name, float(row.max())) for name, row in zip(names, probabilities, strict=True)]


def binary_predictions(body: bytes, json_length: int) -> list[tuple[str, float]]:
    """From a v2 response in the binary extension: JSON, then each binary output's bytes in order."""
    header, offset, outputs = json.loads(body[:json_length]), json_length, {}
    for output in header["outputs"]:
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is None:
            outputs[output["name"]] = output["data"]
        else:
            outputs[output["name"]] = output_values(output["datatype"], body[offset:offset + size])
            offset += size
    return named_predictions(outputs)


def grpc_predictions(response: pb.ModelInferResponse) -> list[tuple[str, float]]:
    if response.raw_output_contents:
        return named_predictions({output.name: output_values(output.datatype, data) for output, data
                                  in zip(response.outputs, response.raw_output_contents, strict=True)})
    contents = {output.name: output.contents for output in response.outputs}
    return named_predictions({"class_name": list(contents["class_name"].bytes_contents),
                              "probabilities": list(contents["probabilities"].fp32_contents)})


def predictions(body: dict, protocol: str) -> list[tuple[str, float]]:
    """(class name, confidence) per instance of a v1 or v2 JSON response body."""
    if protocol == "v1":
        return [(p["class_name"], max(p["probabilities"])) for p in body["predictions"]]
    return named_predictions({output["name"]: output["data"] for output in body["outputs"]})


def http_error(response: requests.Response, url: str) -> ServerError:
    try:
        message = response.json().get("error", response.text)
    except ValueError:
        message = response.text
    return ServerError(f"{response.status_code} from {url}: {message}")


def predict(images: Sequence[bytes], url: str = DEFAULT_URL, protocol: str = "v1",
            model_name: str = "fmnist", session: requests.Session | None = None,
            grpc_target: str = DEFAULT_GRPC_ADDRESS) -> list[tuple[str, float]]:
    if protocol == "grpc":
        return predict_grpc(images, grpc_target, model_name)
    path, body, headers = http_request(images, protocol, model_name)
    try:
        response = (session or requests).post(url.rstrip("/") + path, data=body, headers=headers,
                                              timeout=TIMEOUT_SECONDS)
    except requests.RequestException as error:
        raise ServerError(f"{url}: {error}") from None
    if response.status_code != 200:
        raise http_error(response, url)
    if INFERENCE_HEADER_LENGTH in response.headers:
        return binary_predictions(response.content, int(response.headers[INFERENCE_HEADER_LENGTH]))
    return predictions(response.json(), protocol)


def predict_grpc(images: Sequence[bytes], address: str, model_name: str) -> list[tuple[str, float]]:
    with grpc.insecure_channel(address) as channel:
        try:
            response = model_infer(channel)(grpc_request(images, model_name), timeout=TIMEOUT_SECONDS)
        except grpc.RpcError as error:
            raise ServerError(f"{error.code().name} from {address}: {error.details()}") from None
    return grpc_predictions(response)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="serving.client", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    predict_command = commands.add_parser("predict", help="classify image files")
    predict_command.add_argument("images", type=Path, nargs="+")
    predict_command.add_argument("--url", type=cli.http_url, default=DEFAULT_URL,
                                 help="the server's HTTP base URL (v1, v2, v2-binary)")
    predict_command.add_argument("--grpc-address", type=grpc_address, default=DEFAULT_GRPC_ADDRESS,
                                 help="the server's gRPC HOST:PORT (grpc)")
    predict_command.add_argument("--protocol", choices=PROTOCOLS, default="v1")
    predict_command.add_argument("--model-name", default="fmnist")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        images = [path.read_bytes() for path in args.images]
    except OSError as error:
        raise cli.UsageError(f"{error.filename}: {error.strerror}") from None
    for path, (class_name, confidence) in zip(args.images, predict(images, args.url, args.protocol,
                                                                   args.model_name,
                                                                   grpc_target=args.grpc_address)):
        print(f"{path}: {class_name} ({confidence:.1%})")


if __name__ == "__main__":
    cli.run("serving.client", main, expected=(ServerError,))
