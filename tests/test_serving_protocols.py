"""The v2 binary tensor data extension and gRPC v2 end to end: a real server process on 127.0.0.1
with its gRPC port, real HTTP and gRPC clients, the request log, and the predictor's ports as the
cluster gets them."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import struct
import subprocess
import time
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest
import requests
from conftest import REPO_ROOT, refused_port, run_module
from kserve.protocol.grpc import grpc_predict_v2_pb2 as kserve_pb
from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from kserve.protocol.infer_type import InferInput, InferRequest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from stack_checks import embedded, rendered_stack

from serving import client, loadtest
from serving.grpc_messages import model_infer, pb
from serving.process import listening, wait_until_ready
from trainer.fashion_mnist import CLASS_NAMES

pytestmark = pytest.mark.slow  # starts model servers

MODEL = "fmnist"
INFER = f"/v2/models/{MODEL}/infer"
GRPC_READY_SECONDS = 30
LOG_WAIT_SECONDS = 10
HEADER = "inference-header-content-length"
Tensor = pb.ModelInferRequest.InferInputTensor


@contextlib.contextmanager
def grpc_model_server(repo: Path, work: Path, *extra: object) -> Iterator[tuple[str, str, subprocess.Popen]]:
    """`python -m serving.server` with HTTP and gRPC on the free ports it binds; yields (URL, gRPC
    address, process)."""
    log = work / "server.log"
    with listening("serving.server", "--model-repo", repo, "--model-name", MODEL, "--http-port", 0,
                   "--grpc-port", 0, *extra, log=log) as (ports, process):
        url, address = f"http://127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['grpc']}"
        wait_until_ready(url, MODEL, process, log)
        with grpc.insecure_channel(address) as channel:
            grpc.channel_ready_future(channel).result(timeout=GRPC_READY_SECONDS)
        yield url, address, process


def png(value: int, size: tuple[int, int] = (28, 28)) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", size, value).save(buffer, format="PNG")
    return buffer.getvalue()


IMAGES = [png(30), png(120), png(240)]
PIXELS = np.stack([np.array(Image.open(io.BytesIO(image)), np.float32)[..., None] for image in IMAGES])


@pytest.fixture(scope="module")
def server(published_repo: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("protocols")
    with grpc_model_server(
        published_repo, work, "--log-file", work / "requests.jsonl", "--log-grpc-only"
    ) as (url, address, _):
        yield url, address, work / "requests.jsonl"


@pytest.fixture(scope="module")
def expected(server) -> list[tuple[str, float]]:
    """What v1 JSON answers for IMAGES: every other protocol must agree."""
    url, _, _ = server
    return client.predict(IMAGES, url, "v1", MODEL)


def assert_same(found: list[tuple[str, float]], expected: list[tuple[str, float]]) -> None:
    assert [name for name, _ in found] == [name for name, _ in expected]
    assert np.allclose([p for _, p in found], [p for _, p in expected], atol=1e-5)


def binary_post(url: str, header: dict, data: bytes, length: str | None = None) -> requests.Response:
    text = json.dumps(header).encode()
    headers = {"content-type": "application/octet-stream", HEADER: length or str(len(text))}
    return requests.post(url + INFER, data=text + data, headers=headers, timeout=30)


# --- the binary tensor data extension -------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["v2", "v2-binary", "grpc"])
def test_every_protocol_classifies_encoded_images_as_v1_does(server, expected, protocol):
    url, address, _ = server
    assert_same(client.predict(IMAGES, url, protocol, MODEL, grpc_target=address), expected)


def test_kserves_own_binary_request_is_understood(server, expected):
    """The SDK's InferRequest.to_rest (as InferenceRESTClient sends it) with images as BYTES."""
    url, _, _ = server
    tensor = InferInput("image_bytes", [len(IMAGES)], "BYTES")
    tensor.set_data_from_numpy(np.array(IMAGES, dtype=np.object_), binary_data=True)
    body, json_length = InferRequest(MODEL, [tensor]).to_rest()
    response = requests.post(
        url + INFER,
        data=body,
        timeout=30,
        headers={HEADER: str(json_length), "content-type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    assert_same(client.predictions(response.json(), "v2"), expected)


@pytest.mark.parametrize("datatype, dtype", [("FP32", np.float32), ("UINT8", np.uint8)])
def test_binary_pixel_tensors_answer_as_the_encoded_images_do(server, expected, datatype, dtype):
    url, _, _ = server
    data = PIXELS.astype(dtype).tobytes()
    response = binary_post(
        url,
        {
            "inputs": [
                {
                    "name": "pixels",
                    "shape": list(PIXELS.shape),
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(data)},
                }
            ]
        },
        data,
    )
    assert response.status_code == 200, response.text
    assert HEADER not in response.headers  # JSON outputs unless asked for binary ones
    assert_same(client.predictions(response.json(), "v2"), expected)


def test_binary_outputs_only_when_asked_and_only_those_named(server):
    url, _, _ = server
    data = client.bytes_tensor(IMAGES[:1])
    inputs = [
        {
            "name": "image_bytes",
            "shape": [1],
            "datatype": "BYTES",
            "parameters": {"binary_data_size": len(data)},
        }
    ]
    response = binary_post(
        url,
        {
            "inputs": inputs,
            "outputs": [{"name": "class_id", "parameters": {"binary_data": True}}, {"name": "class_name"}],
        },
        data,
    )
    assert response.status_code == 200, response.text
    json_length = int(response.headers[HEADER])
    header = json.loads(response.content[:json_length])
    assert [output["name"] for output in header["outputs"]] == ["class_id", "class_name"]
    class_id, class_name = header["outputs"]
    assert class_id["parameters"]["binary_data_size"] == 4 and "data" not in class_id
    assert struct.unpack("<i", response.content[json_length:]) == (CLASS_NAMES.index(class_name["data"][0]),)


GOOD_BYTES = client.bytes_tensor(IMAGES[:1])
GOOD_INPUT = {
    "name": "image_bytes",
    "shape": [1],
    "datatype": "BYTES",
    "parameters": {"binary_data_size": len(GOOD_BYTES)},
}


@pytest.mark.parametrize(
    "header, data, length, message",
    [
        ({"inputs": [GOOD_INPUT]}, GOOD_BYTES, "12x", "must be the JSON header's length"),
        ({"inputs": [GOOD_INPUT]}, GOOD_BYTES, "999999", "must be the JSON header's length"),
        ({"inputs": [GOOD_INPUT]}, GOOD_BYTES, "3", "not valid JSON"),
        ({"input": [GOOD_INPUT]}, GOOD_BYTES, None, 'a list of "inputs"'),
        ({"inputs": ["x"]}, GOOD_BYTES, None, "must be a JSON object"),
        ({"inputs": [{**GOOD_INPUT, "shape": "1"}]}, GOOD_BYTES, None, "a list shape"),
        ({"inputs": [{**GOOD_INPUT, "parameters": {}}]}, GOOD_BYTES, None, "neither data nor"),
        (
            {"inputs": [{**GOOD_INPUT, "parameters": {"binary_data_size": -1}}]},
            GOOD_BYTES,
            None,
            "non-negative",
        ),
        (
            {"inputs": [{**GOOD_INPUT, "parameters": {"binary_data_size": 10**9}}]},
            GOOD_BYTES,
            None,
            "past the body",
        ),
        ({"inputs": [GOOD_INPUT]}, GOOD_BYTES + b"xx", None, "belong to no input"),
        ({"inputs": [GOOD_INPUT], "parameters": [1]}, GOOD_BYTES, None, '"parameters" must be'),
        ({"inputs": [GOOD_INPUT], "outputs": [{"name": 3}]}, GOOD_BYTES, None, "requested output"),
        ({"inputs": [GOOD_INPUT], "outputs": [{"name": "nope"}]}, GOOD_BYTES, None, "nope"),
        ({"inputs": [{**GOOD_INPUT, "shape": [2]}]}, GOOD_BYTES, None, "does not match shape"),
        (
            {"inputs": [{**GOOD_INPUT, "parameters": {"binary_data_size": 6}}]},
            b"\xff\xff\xff\xffab",
            None,
            "does not match shape",
        ),
        (
            {"inputs": [{**GOOD_INPUT, "parameters": {"binary_data_size": 7}}]},
            struct.pack("<I", 3) + b"abc",
            None,
            "not a readable PNG or JPEG",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "shape": [1, 28, 28, 1],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 7},
                    }
                ]
            },
            b"1234567",
            None,
            "does not match shape",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "shape": [1, 28, 28, 1],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 3136},
                    }
                ]
            },
            np.full(784, np.nan, np.float32).tobytes(),
            None,
            "finite",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "shape": [1, 28, 28, 1],
                        "datatype": "FP16",
                        "parameters": {"binary_data_size": 1568},
                    }
                ]
            },
            bytes(1568),
            None,
            "FP16 is not accepted",
        ),
    ],
)
def test_every_malformed_binary_request_is_a_400_that_says_why(server, header, data, length, message):
    url, _, _ = server
    response = binary_post(url, header, data, length)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


def test_a_binary_body_without_its_header_is_a_400(server):
    url, _, _ = server
    response = requests.post(
        url + INFER, data=GOOD_BYTES, timeout=30, headers={"content-type": "application/octet-stream"}
    )
    assert response.status_code == 400 and HEADER in response.json()["error"]


# --- gRPC -----------------------------------------------------------------------------------------


def infer_grpc(address: str, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    with grpc.insecure_channel(address) as channel:
        return model_infer(channel)(request, timeout=30)


@pytest.mark.parametrize(
    "form", ["bytes_contents", "fp32_raw", "fp32_contents", "uint8_raw", "uint8_contents"]
)
def test_grpc_accepts_images_and_pixels_raw_and_typed(server, expected, form):
    _, address, _ = server
    shape = list(PIXELS.shape)
    tensor, raw = {
        "bytes_contents": (
            Tensor(
                name="image_bytes",
                datatype="BYTES",
                shape=[len(IMAGES)],
                contents=pb.InferTensorContents(bytes_contents=IMAGES),
            ),
            None,
        ),
        "fp32_raw": (Tensor(name="pixels", datatype="FP32", shape=shape), PIXELS.tobytes()),
        "fp32_contents": (
            Tensor(
                name="pixels",
                datatype="FP32",
                shape=shape,
                contents=pb.InferTensorContents(fp32_contents=PIXELS.ravel()),
            ),
            None,
        ),
        "uint8_raw": (
            Tensor(name="pixels", datatype="UINT8", shape=shape),
            PIXELS.astype(np.uint8).tobytes(),
        ),
        "uint8_contents": (
            Tensor(
                name="pixels",
                datatype="UINT8",
                shape=shape,
                contents=pb.InferTensorContents(uint_contents=PIXELS.astype(int).ravel()),
            ),
            None,
        ),
    }[form]
    response = infer_grpc(
        address,
        pb.ModelInferRequest(model_name=MODEL, inputs=[tensor], raw_input_contents=[raw] if raw else []),
    )
    # Raw inputs get raw outputs, typed inputs typed ones (KServe's InferRequest.use_binary_outputs).
    assert bool(response.raw_output_contents) == bool(raw)
    assert_same(client.grpc_predictions(response), expected)


@pytest.mark.parametrize(
    "request_, message",
    [
        (pb.ModelInferRequest(model_name=MODEL), "expected exactly one input"),
        (
            pb.ModelInferRequest(
                model_name=MODEL,
                inputs=[Tensor(name="pixels", datatype="FP32", shape=[1, 28, 28, 1])],
                raw_input_contents=[b"abc"],
            ),
            "does not match shape",
        ),
        (
            pb.ModelInferRequest(
                model_name=MODEL,
                inputs=[Tensor(name="image_bytes", datatype="BYTES", shape=[1])],
                raw_input_contents=[b"\xff\xff\xff\xffab"],
            ),
            "does not match shape",
        ),
        (
            pb.ModelInferRequest(
                model_name=MODEL,
                inputs=[Tensor(name="image_bytes", datatype="BYTES", shape=[2])],
                raw_input_contents=[client.bytes_tensor(IMAGES[:1])],
            ),
            "does not match shape",
        ),
        (
            pb.ModelInferRequest(
                model_name=MODEL,
                inputs=[
                    Tensor(
                        name="image_bytes",
                        datatype="BYTES",
                        shape=[1],
                        contents=pb.InferTensorContents(bytes_contents=[b"x"]),
                    )
                ],
            ),
            "not a readable PNG or JPEG",
        ),
        (
            pb.ModelInferRequest(
                model_name=MODEL,
                inputs=[Tensor(name="pixels", datatype="FP32", shape=[-1, 28, 28, 1])],
                raw_input_contents=[PIXELS[:1].tobytes()],
            ),
            "negative dimension",
        ),
        (
            pb.ModelInferRequest(
                model_name=MODEL,
                inputs=[
                    Tensor(
                        name="pixels",
                        datatype="UINT8",
                        shape=[1, 28, 28, 1],
                        contents=pb.InferTensorContents(uint_contents=[300] * 784),
                    )
                ],
            ),
            "0-255",
        ),
        (
            pb.ModelInferRequest(
                model_name=MODEL, inputs=[Tensor(name="pixels", datatype="bogus", shape=[1])]
            ),
            "invalid content type",
        ),
    ],
)
def test_grpc_bad_input_is_invalid_argument_never_internal(server, request_, message):
    _, address, _ = server
    with pytest.raises(grpc.RpcError) as raised:
        infer_grpc(address, request_)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert message in raised.value.details()


# --- the request log ------------------------------------------------------------------------------


def logged(log_file: Path, request_id: str, timeout: float = LOG_WAIT_SECONDS) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = (
            [json.loads(line) for line in log_file.read_text().splitlines()] if log_file.exists() else []
        )
        found = [entry for entry in entries if entry["id"] == request_id]
        if found:
            return found
        time.sleep(0.1)
    return []


def test_with_log_grpc_only_grpc_requests_are_logged_once_and_http_ones_left_to_kserves_logger(server):
    url, address, log_file = server
    response = requests.post(
        f"{url}/v1/models/{MODEL}:predict",
        timeout=30,
        headers={"x-request-id": "http-1"},
        json={"instances": [{"b64": base64.b64encode(IMAGES[0]).decode()}]},
    )
    assert response.status_code == 200, response.text
    request = client.grpc_request(IMAGES[:2], MODEL)
    request.id = "grpc-1"
    infer_grpc(address, request)
    (entry,) = logged(log_file, "grpc-1")
    assert entry["protocol"] == "grpc" and entry["instances"] == 2 and entry["model_version"] == 1
    assert logged(log_file, "http-1", timeout=0.5) == []


# --- the client and the load test -----------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["v2-binary", "grpc"])
def test_client_and_loadtest_speak_binary_and_grpc(server, tmp_path, protocol):
    url, address, _ = server
    image = tmp_path / "image.png"
    image.write_bytes(IMAGES[0])
    result = run_module(
        "serving.client",
        "predict",
        str(image),
        "--url",
        url,
        "--grpc-address",
        address,
        "--protocol",
        protocol,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{image}: ") and result.stdout.strip().endswith("%)")
    report = loadtest.run_load(
        address if protocol == "grpc" else url,
        IMAGES,
        4,
        protocol,
        MODEL,
        total_requests=20,
        images_per_request=2,
    )
    assert report.requests == 20 and report.statuses == {200: 20} and report.images_per_second > 0


def test_the_client_reports_grpc_errors_in_one_line(server, tmp_path):
    _, address, _ = server
    bogus = tmp_path / "bogus.png"
    bogus.write_text("not an image")
    result = run_module(
        "serving.client", "predict", str(bogus), "--grpc-address", address, "--protocol", "grpc"
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"serving.client: error: INVALID_ARGUMENT from {address}: element 0: not a readable PNG or JPEG"
        )
    )


# --- the predictor on the cluster -----------------------------------------------------------------


@pytest.fixture(scope="module", params=["local", "gke"])
def predictor(request) -> dict:
    from test_cluster_contracts import stack_values, template_of

    stack = rendered_stack(request.param, stack_values(request.param))
    return embedded(template_of(stack), "serve")


def test_the_predictor_declares_grpc_as_a_second_h2c_port_behind_the_http_one(predictor, validate_crd):
    (container,) = predictor["spec"]["predictor"]["containers"]
    http, grpc_port = container["ports"]
    # KServe routes, probes and puts its agent (the logger) in front of the first port only.
    assert http["name"] == "http1" and container["args"][container["args"].index("--http-port") + 1] == str(
        http["containerPort"]
    )
    # A name with "h2c" or "grpc" makes KServe's Service port appProtocol kubernetes.io/h2c.
    assert "h2c" in grpc_port["name"] or "grpc" in grpc_port["name"]
    assert container["args"][container["args"].index("--grpc-port") + 1] == str(grpc_port["containerPort"])
    assert grpc_port["containerPort"] != http["containerPort"]
    assert validate_crd("serving.kserve.io_inferenceservices.yaml", predictor) == []


def test_with_kserves_logger_the_server_logs_grpc_requests_to_the_same_sink(predictor):
    spec = predictor["spec"]["predictor"]
    (container,) = spec["containers"]
    args = container["args"]
    assert "logger" in spec  # both stacks deploy the request logger
    assert args[args.index("--log-url") + 1] == spec["logger"]["url"] and "--log-grpc-only" in args


def test_the_client_speaks_grpc_without_importing_kserve():
    """Importing kserve parses sys.argv (kserve.model_server) and rejects --protocol grpc."""
    with refused_port() as port:
        result = run_module(
            "serving.client",
            "predict",
            str(REPO_ROOT / "README.md"),
            "--protocol",
            "grpc",
            "--grpc-address",
            f"127.0.0.1:{port}",
        )
    assert result.returncode == 1 and "UNAVAILABLE from 127.0.0.1:" in result.stderr, result.stderr


def grpc_request_counts(url: str) -> dict[str, float]:
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    return {
        sample.labels["status"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "dist_ml_requests_total" and sample.labels.get("protocol") == "grpc"
    }


def metric_total(url: str, name: str, **labels: str) -> float:
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def grpc_answering_versions(url: str) -> set[str]:
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    return {sample.labels["version"] for family in text_string_to_metric_families(metrics)
            for sample in family.samples if sample.name == "dist_ml_requests_total"
            and sample.labels.get("protocol") == "grpc" and sample.labels["status"] == "200"}


def served_version(url: str) -> str:
    instance = {"image_bytes": {"b64": base64.b64encode(IMAGES[0]).decode()}}
    response = requests.post(f"{url}/v1/models/{MODEL}:predict", json={"instances": [instance]}, timeout=10)
    return response.headers["x-model-version"]


def test_grpc_requests_are_counted_by_outcome_with_the_http_ones(server):
    url, address, _ = server
    before = grpc_request_counts(url)
    infer_grpc(address, client.grpc_request(IMAGES[:1], MODEL))
    with pytest.raises(grpc.RpcError):
        infer_grpc(address, client.grpc_request([b"not an image"], MODEL))
    after = grpc_request_counts(url)
    assert after.get("200", 0) - before.get("200", 0) == 1
    assert after.get("400", 0) - before.get("400", 0) == 1
    # Labelled, as HTTP requests are, by the version that answered (the canary decision reads it).
    assert grpc_answering_versions(url) == {served_version(url)}


def test_grpc_metadata_and_readiness_describe_the_served_version(server):
    _, address, _ = server
    with grpc.insecure_channel(address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        assert stub.ServerReady(kserve_pb.ServerReadyRequest()).ready
        assert stub.ModelReady(kserve_pb.ModelReadyRequest(name=MODEL)).ready
        metadata = stub.ModelMetadata(kserve_pb.ModelMetadataRequest(name=MODEL))
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("image_bytes", "BYTES", [-1]),
        ("pixels", "FP32", [-1, 28, 28, 1]),
    ]
    assert [t.name for t in metadata.outputs] == ["probabilities", "class_id", "class_name"]


@pytest.fixture(scope="module")
def slow_grpc_server(published_repo: Path, tmp_path_factory: pytest.TempPathFactory):
    """Batches wait 1.5 s to fill, and one image at a time is admitted."""
    work = tmp_path_factory.mktemp("slow-grpc")
    with grpc_model_server(
        published_repo,
        work,
        "--max-batch-wait-ms",
        "1500",
        "--max-batch-size",
        "64",
        "--max-queued-images",
        "1",
    ) as (url, address, _):
        yield url, address


def test_a_full_queue_is_resource_exhausted_over_grpc_and_counted_as_a_503(slow_grpc_server):
    url, address = slow_grpc_server
    request = client.grpc_request(IMAGES[:1], MODEL)
    with grpc.insecure_channel(address) as channel:
        infer = model_infer(channel)
        first = infer.future(request, timeout=30)
        time.sleep(0.5)  # the first image now waits in the batcher for its batch to fill
        with pytest.raises(grpc.RpcError) as refused:
            infer(request, timeout=30)
        assert first.result().outputs  # the admitted one is answered
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
    assert "retry" in refused.value.details()
    assert grpc_request_counts(url).get("503") == 1
    # Counted once, as a full queue, not also as a "not ready" error.
    assert metric_total(url, "dist_ml_queue_full_total") == 1
    assert metric_total(url, "dist_ml_errors_total", kind="not_ready") == 0
