"""Property-based: whatever body an outside client sends, the server answers it with a status under
500 on a connection that stays whole, and serves valid requests afterwards."""

from __future__ import annotations

import base64
import collections
import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from serving.process import model_server

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


@pytest.fixture(scope="module")
def server(published_repo: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("fuzzed-server")
    with model_server(published_repo, MODEL, work / "server.log") as (url, process):
        yield url, process


def valid_v1_body() -> dict:
    buffer = io.BytesIO()
    Image.new("L", (28, 28), 40).save(buffer, format="PNG")
    return {"instances": [{"b64": b64(buffer.getvalue())}]}


def test_no_body_gets_a_server_error_or_a_dropped_connection_and_the_server_stays_healthy(server):
    url, process = server
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
    assert process.poll() is None
    assert requests.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
    response = requests.post(f"{url}/v1/models/{MODEL}:predict", json=valid_v1_body(), timeout=30)
    assert response.status_code == 200, response.text
