"""Property-based: whatever body an outside client sends, the server answers it with a status under
500 on a connection that stays whole, and serves valid requests afterwards; whatever ModelInfer
request a gRPC client sends, the answer is OK or INVALID_ARGUMENT, never INTERNAL."""

from __future__ import annotations

import base64
import collections
import io
import json
import struct
import zlib
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from test_serving_protocols import grpc_model_server

from serving.client import bytes_tensor
from serving.grpc_messages import model_infer, pb

pytestmark = pytest.mark.slow  # starts a model server

MODEL = "fmnist"
EXAMPLES = 100  # each is one HTTP request: ~100 keeps the test within a minute on two cores
IMAGE_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "I;16", "I", "F", "CMYK", "YCbCr")
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP")
DATATYPES = ("BYTES", "UINT8", "FP32", "INT32", "FP64", "BOOL", "bogus", "")


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares width x height."""
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + png_chunk(b"IEND", b""))


@st.composite
def encoded_images(draw) -> bytes:
    kind = draw(st.sampled_from(("image", "image", "image", "truncated", "bomb", "junk")))
    if kind == "junk":
        return draw(st.binary(max_size=64))
    if kind == "bomb":
        return png_declaring(draw(st.integers(1, 2**31 - 1)), draw(st.integers(1, 2**31 - 1)))
    mode, image_format = draw(st.sampled_from(IMAGE_MODES)), draw(st.sampled_from(IMAGE_FORMATS))
    size = (draw(st.integers(1, 64)), draw(st.integers(1, 64)))
    image = Image.new(mode, size)
    buffer = io.BytesIO()
    try:
        image.save(buffer, format=image_format)
    except (OSError, ValueError, KeyError):  # a mode the format cannot store: send its PNG
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG")
    data = buffer.getvalue()
    if kind == "truncated":
        data = data[:draw(st.integers(0, max(0, len(data) - 1)))]
    return data


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
PIXEL_VALUES = st.one_of(st.integers(-300, 600), st.floats(allow_nan=True, allow_infinity=True),
                         st.sampled_from([0, 255, 128.5, "7", True, None]))


@st.composite
def pixel_arrays(draw) -> list:
    shape = draw(st.sampled_from([(28, 28), (28, 28, 1), (27, 28), (28, 28, 3), (0,), (28,)]))
    return np.full(shape, draw(PIXEL_VALUES), dtype=object).tolist()


@st.composite
def v1_bodies(draw) -> object:
    instance = st.one_of(
        valid_images().map(lambda data: {"b64": b64(data)}),
        encoded_images().map(lambda data: {"b64": b64(data)}),
        encoded_images().map(lambda data: {"image_bytes": {"b64": b64(data)}}),
        pixel_arrays(),
        st.sampled_from([{"b64": "!!!"}, {"b64": 5}, {"other": 1}, "text", 3]),
    )
    valid = valid_images().map(lambda data: {"b64": b64(data)})
    odd = encoded_images().map(lambda data: {"b64": b64(data)})
    one_kind = st.one_of(st.lists(valid, min_size=1, max_size=3), st.lists(odd, min_size=1, max_size=2),
                         st.lists(pixel_arrays(), min_size=1, max_size=3))
    return draw(st.one_of(
        st.fixed_dictionaries({"instances": one_kind}),
        st.fixed_dictionaries({"instances": st.lists(instance, max_size=4)}),
        st.fixed_dictionaries({"instances": JSON_VALUES}),
        JSON_VALUES,
    ))


@st.composite
def valid_images(draw) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (draw(st.integers(1, 64)), draw(st.integers(1, 64))), draw(st.integers(0, 255))).save(
        buffer, format=draw(st.sampled_from(("PNG", "JPEG"))))
    return buffer.getvalue()


@st.composite
def valid_v2_tensors(draw) -> dict:
    count = draw(st.integers(1, 3))
    if draw(st.booleans()):
        return {"name": "image_bytes", "shape": [count], "datatype": "BYTES",
                "data": [b64(draw(valid_images())) for _ in range(count)]}
    datatype = draw(st.sampled_from(["UINT8", "FP32"]))
    return {"name": "pixels", "shape": [count, 28, 28, 1], "datatype": datatype,
            "data": [draw(st.integers(0, 255))] * (784 * count)}


@st.composite
def v2_tensors(draw) -> dict:
    """A valid tensor, then up to two things about it broken."""
    tensor = draw(valid_v2_tensors())
    for mutation in draw(st.lists(st.sampled_from(
            ("datatype", "shape", "length", "value", "nest", "images", "drop")), max_size=2)):
        if mutation == "datatype":
            tensor["datatype"] = draw(st.sampled_from(DATATYPES))
        elif mutation == "shape":
            tensor["shape"] = draw(st.one_of(st.lists(st.integers(-3, 40), max_size=5),
                                             st.lists(JSON_SCALARS, max_size=3), JSON_SCALARS))
        elif mutation == "length" and isinstance(tensor.get("data"), list):
            tensor["data"] = tensor["data"][:draw(st.integers(0, max(0, len(tensor["data"]) - 1)))]
        elif mutation == "value" and isinstance(tensor.get("data"), list) and tensor["data"]:
            tensor["data"][draw(st.integers(0, len(tensor["data"]) - 1))] = draw(PIXEL_VALUES)
        elif mutation == "nest" and isinstance(tensor.get("data"), list) and len(tensor["data"]) % 28 == 0:
            tensor["data"] = np.reshape(np.array(tensor["data"], dtype=object), (-1, 28)).tolist()
        elif mutation == "images":
            tensor["data"] = draw(st.lists(st.one_of(encoded_images().map(b64), JSON_SCALARS), max_size=3))
        elif mutation == "drop" and tensor:
            tensor.pop(draw(st.sampled_from(sorted(tensor))))
    return tensor


@st.composite
def v2_bodies(draw) -> object:
    return draw(st.one_of(
        st.fixed_dictionaries({"inputs": st.lists(v2_tensors(), min_size=1, max_size=2)}),
        st.fixed_dictionaries({"inputs": JSON_VALUES}),
        JSON_VALUES,
    ))


# --- the binary tensor data extension: a JSON header, then each binary input's bytes --------------

@st.composite
def valid_binary_tensors(draw) -> tuple[dict, bytes]:
    count = draw(st.integers(1, 3))
    if draw(st.booleans()):
        data = bytes_tensor([draw(valid_images()) for _ in range(count)])
        tensor = {"name": "image_bytes", "shape": [count], "datatype": "BYTES"}
    else:
        datatype = draw(st.sampled_from(["UINT8", "FP32"]))
        pixels = np.full((count, 28, 28, 1), draw(st.integers(0, 255)))
        data = pixels.astype(np.uint8 if datatype == "UINT8" else np.float32).tobytes()
        tensor = {"name": "pixels", "shape": [count, 28, 28, 1], "datatype": datatype}
    return {**tensor, "parameters": {"binary_data_size": len(data)}}, data


INPUT_FIELDS = ["name", "shape", "datatype", "parameters", "data"]
BAD_LENGTHS = ["", "x", "-1", "1e3", "\u00b2", "99999999999999999999"]  # "²" passes str.isdigit


@st.composite
def binary_requests(draw) -> tuple[bytes, str]:
    """(body, Inference-Header-Content-Length): a valid request, then up to three things broken."""
    tensor, data = draw(valid_binary_tensors())
    header: object = {"inputs": [tensor]}
    if draw(st.booleans()):
        header["parameters"] = {"binary_data_output": draw(st.one_of(st.booleans(), JSON_SCALARS))}
    if draw(st.booleans()):
        header["outputs"] = draw(st.lists(st.fixed_dictionaries(
            {"name": st.sampled_from(["probabilities", "class_id", "class_name", "nope"])},
            optional={"parameters": st.fixed_dictionaries({"binary_data": st.booleans()})}), max_size=3))
    length_shift = 0
    for mutation in draw(st.lists(st.sampled_from(
            ("datatype", "shape", "size", "data", "elements", "length", "header", "json", "extra")),
            max_size=3)):
        if mutation == "datatype":
            tensor["datatype"] = draw(st.sampled_from(DATATYPES))
        elif mutation == "shape":
            tensor["shape"] = draw(st.one_of(st.lists(st.integers(-3, 2**62), max_size=5), JSON_SCALARS))
        elif mutation == "size" and isinstance(tensor.get("parameters"), dict):
            tensor["parameters"]["binary_data_size"] = draw(st.one_of(st.integers(-5, 2**40), JSON_SCALARS))
        elif mutation == "data":
            data = data[:draw(st.integers(0, len(data)))] + draw(st.binary(max_size=16))
        elif mutation == "elements":  # BYTES elements whose length prefixes lie
            data = draw(st.binary(max_size=12)) + data[draw(st.integers(0, len(data))):]
        elif mutation == "length":
            length_shift = draw(st.integers(-8, 8))
        elif mutation == "header" and isinstance(header, dict):
            tensor = draw(st.dictionaries(st.sampled_from(INPUT_FIELDS), JSON_VALUES, max_size=5))
            header["inputs"] = [tensor]
        elif mutation == "json":
            header = draw(JSON_VALUES)
        elif mutation == "extra" and isinstance(header, dict):
            header["inputs"] = header.get("inputs", []) + [dict(tensor)]
    text = json.dumps(header).encode()
    if draw(st.integers(0, 9)) == 0:
        return text + data, draw(st.sampled_from(BAD_LENGTHS))
    return text + data, str(max(0, len(text) + length_shift))


# --- gRPC: ModelInfer requests, typed contents or raw_input_contents --------------------------------

GRPC_CONTENTS = {
    "bytes_contents": st.lists(st.one_of(encoded_images(), valid_images()), max_size=3),
    "fp32_contents": st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), max_size=800),
    "uint_contents": st.lists(st.integers(0, 2**32 - 1), max_size=800),
    "int_contents": st.lists(st.integers(-2**31, 2**31 - 1), max_size=8),
    "bool_contents": st.lists(st.booleans(), max_size=4),
}


@st.composite
def valid_grpc_tensors(draw) -> tuple[pb.ModelInferRequest.InferInputTensor, bytes | None]:
    """A tensor ModelInfer accepts, and its raw contents (None: in typed contents)."""
    count, raw = draw(st.integers(1, 3)), draw(st.booleans())
    if draw(st.booleans()):
        images = [draw(valid_images()) for _ in range(count)]
        tensor = pb.ModelInferRequest.InferInputTensor(name="image_bytes", datatype="BYTES", shape=[count])
        if raw:
            return tensor, bytes_tensor(images)
        tensor.contents.bytes_contents.extend(images)
        return tensor, None
    datatype = draw(st.sampled_from(["UINT8", "FP32"]))
    pixels = np.full(784 * count, draw(st.integers(0, 255)))
    tensor = pb.ModelInferRequest.InferInputTensor(name="pixels", datatype=datatype, shape=[count, 28, 28, 1])
    if raw:
        return tensor, pixels.astype(np.uint8 if datatype == "UINT8" else np.float32).tobytes()
    (tensor.contents.uint_contents if datatype == "UINT8" else tensor.contents.fp32_contents).extend(pixels)
    return tensor, None


@st.composite
def grpc_tensors(draw) -> tuple[pb.ModelInferRequest.InferInputTensor, bytes | None]:
    """A valid tensor, then up to two things about it broken."""
    tensor, raw = draw(valid_grpc_tensors())
    for mutation in draw(st.lists(st.sampled_from(("datatype", "shape", "parameter", "typed", "raw", "none")),
                                  max_size=2)):
        if mutation == "datatype":
            tensor.datatype = draw(st.sampled_from(DATATYPES))
        elif mutation == "shape":
            del tensor.shape[:]
            tensor.shape.extend(draw(st.lists(st.integers(-3, 2**62), max_size=5)))
        elif mutation == "parameter":
            tensor.parameters["binary_data_size"].int64_param = draw(st.integers(-2**63, 2**63 - 1))
        elif mutation == "typed":
            tensor.ClearField("contents")
            field = draw(st.sampled_from(sorted(GRPC_CONTENTS)))
            getattr(tensor.contents, field).extend(draw(GRPC_CONTENTS[field]))
            raw = None
        elif mutation == "raw":
            tensor.ClearField("contents")
            odd_images = st.lists(encoded_images(), min_size=1, max_size=3)
            raw = draw(st.one_of(st.binary(max_size=64), st.builds(bytes_tensor, odd_images)))
        elif mutation == "none":
            tensor.ClearField("contents")
            raw = None
    return tensor, raw


@st.composite
def grpc_requests(draw) -> pb.ModelInferRequest:
    tensors = draw(st.lists(grpc_tensors(), max_size=2))
    request = pb.ModelInferRequest(model_name=MODEL, inputs=[tensor for tensor, _ in tensors])
    raws = [raw for _, raw in tensors if raw is not None]
    if raws and (len(raws) == len(tensors) or draw(st.booleans())):  # a mismatch KServe refuses, too
        request.raw_input_contents.extend(raws)
    if draw(st.booleans()):
        request.outputs.add(name=draw(st.sampled_from(["probabilities", "class_name", "nope"])))
    return request


@pytest.fixture(scope="module")
def server(published_repo: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("fuzzed-server")
    with grpc_model_server(published_repo, work) as (url, address, process):
        yield url, address, process


def assert_healthy(url: str, process) -> None:
    assert process.poll() is None
    assert requests.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
    response = requests.post(f"{url}/v1/models/{MODEL}:predict", json=valid_v1_body(), timeout=30)
    assert response.status_code == 200, response.text


def valid_v1_body() -> dict:
    buffer = io.BytesIO()
    Image.new("L", (28, 28), 40).save(buffer, format="PNG")
    return {"instances": [{"b64": b64(buffer.getvalue())}]}


def test_no_body_gets_a_server_error_or_a_dropped_connection_and_the_server_stays_healthy(server):
    url, _, process = server
    seen: collections.Counter = collections.Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(protocol_and_body=st.one_of(st.tuples(st.just("v1"), v1_bodies()),
                                       st.tuples(st.just("v2"), v2_bodies())))
    def answered_under_500(protocol_and_body):
        protocol, body = protocol_and_body
        path = f"/v1/models/{MODEL}:predict" if protocol == "v1" else f"/v2/models/{MODEL}/infer"
        response = requests.post(url + path, data=json.dumps(body).encode(), timeout=60,
                                 headers={"content-type": "application/json"})  # dropped: raises
        seen[protocol, response.status_code] += 1
        assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"

    answered_under_500()
    # Some bodies were valid and reached the model, so batches mixed good and bad requests.
    assert any(status == 200 for _, status in seen), sorted(seen.items())
    assert_healthy(url, process)


def test_no_binary_body_gets_a_server_error_or_a_dropped_connection(server):
    url, _, process = server
    seen: collections.Counter = collections.Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(body_and_length=binary_requests())
    def answered_under_500(body_and_length):
        body, length = body_and_length
        response = requests.post(f"{url}/v2/models/{MODEL}/infer", data=body, timeout=60,
                                 headers={"content-type": "application/octet-stream",
                                          "inference-header-content-length": length})
        seen[response.status_code] += 1
        assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"

    answered_under_500()
    assert seen[200] > 0, sorted(seen.items())
    assert_healthy(url, process)


def test_no_grpc_request_gets_internal_and_the_server_stays_healthy(server):
    url, address, process = server
    seen: collections.Counter = collections.Counter()
    with grpc.insecure_channel(address) as channel:
        infer = model_infer(channel)

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(request=grpc_requests())
        def answered_ok_or_invalid_argument(request):
            try:
                infer(request, timeout=60)
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
                assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{code}: {error.details()[:500]}"
            seen[code.name] += 1

        answered_ok_or_invalid_argument()
    assert seen["OK"] > 0, sorted(seen.items())
    assert_healthy(url, process)
