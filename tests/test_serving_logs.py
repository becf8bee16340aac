"""The server's log as whoever is paged on ERROR reads it: a refused request (a client's mistake, an
unknown model, a body over the limit, a full queue) adds one INFO line naming its protocol, status,
model and reason, never a traceback, over v1, v2, the binary extension and gRPC; a server fault is
still an ERROR with its traceback, over HTTP and gRPC."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import threading
import time
from pathlib import Path
from typing import Callable

import grpc
import pytest
import requests
from fastapi import FastAPI
from fastapi.testclient import TestClient
from kserve.errors import InvalidInput, ModelNotFound
from kserve.logging import KSERVE_LOGGER_NAME
from kserve.protocol.rest.server import RESTServer
from PIL import Image
from test_serving_protocols import grpc_model_server

from serving import client
from serving.grpc_messages import MODEL_INFER, model_infer, pb
from serving.kserve_overrides import InferenceRoute, OneLineRefusals
from serving.refusals import MAX_REASON_CHARS, log_refusal
from serving.server import add_error_handlers

pytestmark = pytest.mark.slow  # starts a model server

MODEL = "fmnist"
MAX_BODY_BYTES = 100_000
# How long the one image the queue admits (--max-queued-images 1) waits for its batch: the window in
# which the next request finds the queue full.
BATCH_WAIT_SECONDS = 1.5
QUEUED_SECONDS = 0.5  # for the first request to reach the queue
SECRET = "do-not-log-this"  # inside request bodies: no log line may repeat a body
# Lines every request gets, refused or not: uvicorn's access line, KServe's gRPC method line.
ACCESS_LINE = re.compile(r" uvicorn\.access | grpc method: ")
REFUSAL_LINE = re.compile(r" kserve INFO \[refusals\.py:\S+\] refused request: protocol=(?P<protocol>\S+) "
                          r'status=(?P<status>\S+) model="(?P<model>[^"]*)" reason="(?P<reason>.+)"$')
Send = Callable[[str, str], str]  # (URL, gRPC address) -> the status the client got


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (28, 28), 120).save(buffer, format="PNG")
    return buffer.getvalue()


def http_post(path: str, body: bytes, headers: dict[str, str] | None = None) -> Send:
    def send(url: str, _address: str) -> str:
        return str(requests.post(url + path, data=body, headers=headers or {}, timeout=30).status_code)
    return send


def grpc_infer(request: pb.ModelInferRequest) -> Send:
    def send(_url: str, address: str) -> str:
        with grpc.insecure_channel(address) as channel:
            try:
                model_infer(channel)(request, timeout=30)
            except grpc.RpcError as error:
                return error.code().name
        return grpc.StatusCode.OK.name
    return send


def binary_with_header_length(length: int) -> Send:
    path, body, headers = client.binary_request([png()], MODEL)
    return http_post(path, body, {**headers, "inference-header-content-length": str(length)})


V1, V2 = f"/v1/models/{MODEL}:predict", f"/v2/models/{MODEL}/infer"
JSON = {"content-type": "application/json"}
NOT_JSON = b"{not json " + SECRET.encode()
NOT_BASE64 = b'{"instances": [{"b64": "%% ' + SECRET.encode() + b'"}]}'
WRONG_SHAPE = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}'
NO_INPUTS = b'{"inputs": []}'
Tensor = pb.ModelInferRequest.InferInputTensor
REFUSALS = [  # (protocol, status, model the line names, request)
    pytest.param("v1", "400", MODEL, http_post(V1, NOT_JSON), id="v1-bad-json"),
    pytest.param("v1", "400", MODEL, http_post(V1, NOT_BASE64), id="v1-bad-instance"),
    pytest.param("v2", "422", MODEL, http_post(V2, NOT_JSON, JSON), id="v2-bad-json"),
    pytest.param("v2", "400", MODEL, http_post(V2, WRONG_SHAPE, JSON), id="v2-bad-tensor"),
    pytest.param("v2-binary", "400", MODEL, binary_with_header_length(10**6), id="v2-binary-bad-header"),
    pytest.param("v1", "404", "nope", http_post("/v1/models/nope:predict", b'{"instances": [[0]]}'),
                 id="v1-unknown-model"),
    pytest.param("v2", "404", "nope", http_post("/v2/models/nope/infer", NO_INPUTS, JSON),
                 id="v2-unknown-model"),
    pytest.param("v1", "413", MODEL, http_post(V1, b'{"instances": ["' + b"A" * MAX_BODY_BYTES + b'"]}'),
                 id="body-over-the-limit"),
    pytest.param("v2", "501", MODEL, http_post(f"/v2/models/{MODEL}/versions/1/infer", NO_INPUTS, JSON),
                 id="v2-model-version"),  # KServe's own route, not the lean one
    pytest.param("grpc", "INVALID_ARGUMENT", MODEL, grpc_infer(pb.ModelInferRequest(
        model_name=MODEL, inputs=[Tensor(name="x", datatype="FP32", shape=[1],
                                         contents=pb.InferTensorContents(fp32_contents=[1.0]))])),
                 id="grpc-bad-input"),
    pytest.param("grpc", "INVALID_ARGUMENT", MODEL, grpc_infer(pb.ModelInferRequest(
        model_name=MODEL, raw_input_contents=[SECRET.encode()])), id="grpc-refused-by-kserves-servicer"),
    pytest.param("grpc", "NOT_FOUND", "nope", grpc_infer(client.grpc_request([png()], "nope")),
                 id="grpc-unknown-model"),
]


@pytest.fixture(scope="module")
def server(published_repo: Path, tmp_path_factory: pytest.TempPathFactory):
    """(URL, gRPC address, log file) of a server whose queue admits one image for BATCH_WAIT_SECONDS,
    with uvicorn's access log on, warmed up: a good request of each protocol has been answered."""
    work = tmp_path_factory.mktemp("logs")
    with grpc_model_server(published_repo, work, "--access-log", "--max-body-bytes", MAX_BODY_BYTES,
                           "--max-queued-images", 1,
                           "--max-batch-size", 64, "--max-batch-wait-ms", int(BATCH_WAIT_SECONDS * 1000)
                           ) as (url, address, _):
        for protocol in ("v1", "v2", "v2-binary"):
            path, body, headers = client.http_request([png()], protocol, MODEL)
            assert http_post(path, body, headers)(url, address) == "200"
        assert grpc_infer(client.grpc_request([png()], MODEL))(url, address) == "OK"
        yield url, address, work / "server.log"


def logged_while(log: Path, send: Callable[[], object]) -> list[str]:
    """The lines the server logged while `send` ran: each refusal is logged before it is answered."""
    offset = log.stat().st_size
    send()
    return log.read_bytes()[offset:].decode().splitlines()


def refusal_lines(lines: list[str]) -> list[re.Match]:
    """The lines besides the access lines, each asserted to be a refusal's."""
    own = [line for line in lines if not ACCESS_LINE.search(line)]
    matches = [REFUSAL_LINE.search(line) for line in own]
    assert all(matches), own
    return matches


def assert_quiet(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert "Traceback" not in text and SECRET not in text, text
    assert not re.search(r" (ERROR|WARNING|CRITICAL)\b", text), text


@pytest.mark.parametrize("protocol, status, model, send", REFUSALS)
def test_a_refused_request_is_one_info_line_without_a_traceback(server, protocol, status, model, send):
    url, address, log = server
    answered: list[str] = []
    lines = logged_while(log, lambda: answered.append(send(url, address)))
    assert answered == [status]
    assert_quiet(lines)
    [line] = refusal_lines(lines)
    assert (line["protocol"], line["status"], line["model"]) == (protocol, status, model)


def test_with_access_log_each_http_request_is_one_access_line(server):
    url, address, log = server
    path, body, headers = client.http_request([png()], "v1", MODEL)
    lines = logged_while(log, lambda: [http_post(path, body, headers)(url, address) for _ in range(2)])
    access = re.compile(rf' uvicorn\.access INFO: .* "POST /v1/models/{MODEL}(:|%3A)predict HTTP/1\.1" 200 ')
    assert len([line for line in lines if access.search(line)]) == 2, lines
    assert_quiet(lines)


def test_a_full_queue_is_one_info_line_over_http_and_grpc(server):
    url, address, log = server
    path, body, headers = client.http_request([png()], "v1", MODEL)
    good = http_post(path, body, headers)
    answered: dict[str, str] = {}
    first = threading.Thread(target=lambda: answered.update(first=good(url, address)))
    first.start()
    time.sleep(QUEUED_SECONDS)  # the first image now waits in the batcher for its batch to fill

    def refused() -> None:
        answered["v1"] = good(url, address)
        answered["grpc"] = grpc_infer(client.grpc_request([png()], MODEL))(url, address)

    lines = logged_while(log, refused)
    first.join(timeout=30)
    assert answered == {"first": "200", "v1": "503", "grpc": "RESOURCE_EXHAUSTED"}
    assert_quiet(lines)
    assert [(line["protocol"], line["status"]) for line in refusal_lines(lines)] == [
        ("v1", "503"), ("grpc", "RESOURCE_EXHAUSTED")]


# --- the log line, and server faults (no hook makes the real model fail: handlers with stand-ins) ----


@pytest.fixture
def kserve_log(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> pytest.LogCaptureFixture:
    """The records of KServe's logger, where the refusals and KServe's fault lines go; it does not
    propagate once a ModelServer configured logging, so caplog listens to it directly."""
    logger = logging.getLogger(KSERVE_LOGGER_NAME)
    monkeypatch.setattr(logger, "propagate", False)
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger=KSERVE_LOGGER_NAME)
    yield caplog
    logger.removeHandler(caplog.handler)


def test_a_refusals_line_is_cut_short_and_stays_one_line(kserve_log):
    log_refusal("v1", 400, "a\nmodel", "line one\nline two " + "x" * 10 * MAX_REASON_CHARS)
    [record] = kserve_log.records
    message = record.getMessage()
    assert "\n" not in message and len(message) < 2 * MAX_REASON_CHARS
    assert message.startswith('refused request: protocol=v1 status=400 model="a\\nmodel" reason="line one\\n')
    assert record.levelno == logging.INFO and record.exc_info is None


class StandInDataPlane:
    """The calls InferenceRoute makes of KServe's data plane; inference raises `error`."""

    def __init__(self, error: Exception):
        self.error = error

    async def model_ready(self, _model_name: str, _disable_predictor_health_check: bool) -> bool:
        return True

    def decode(self, body: bytes, headers: dict) -> tuple[bytes, dict]:
        return body, {}

    async def infer(self, **_request: object) -> tuple:
        raise self.error


def http_app(error: Exception) -> FastAPI:
    """An application set up as serving.server's main sets up KServe's, its handlers added before
    KServe's own, as ModelServer.start adds them later; the data plane raises `error`."""
    application = FastAPI()
    application.add_middleware(InferenceRoute, dataplane=StandInDataPlane(error), handlers=application)
    add_error_handlers(application)
    rest = RESTServer("kserve.model_server:app", None, None, http_port=0)
    rest._add_exception_handlers(application)  # what RESTServer.create_application adds
    return application


@pytest.mark.parametrize("error, status, level, traceback", [
    pytest.param(RuntimeError("the model broke"), 500, logging.ERROR, True, id="fault"),
    pytest.param(InvalidInput("instance 0: not an image"), 400, logging.INFO, False, id="invalid-input"),
    pytest.param(ModelNotFound(MODEL), 404, logging.INFO, False, id="unknown-model"),
])
def test_over_http_a_fault_keeps_its_traceback_and_a_refusal_is_one_line(kserve_log, error, status, level,
                                                                        traceback):
    with TestClient(http_app(error), raise_server_exceptions=False) as test_client:
        response = test_client.post(f"/v1/models/{MODEL}:predict", content=b"{}")
    assert response.status_code == status
    assert str(error) in response.json()["error"]
    [record] = kserve_log.records
    assert record.levelno == level and (record.exc_info is not None) == traceback
    if not traceback:
        assert record.getMessage().startswith(f'refused request: protocol=v1 status={status} model="{MODEL}"')


class StandInContext:
    """What the interceptor asks of a gRPC call's context: the status it aborts with."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details


@pytest.mark.parametrize("error, code, level, traceback", [
    pytest.param(RuntimeError("the model broke"), grpc.StatusCode.INTERNAL, logging.ERROR, True, id="fault"),
    pytest.param(InvalidInput("input 'x': bad"), grpc.StatusCode.INVALID_ARGUMENT, logging.INFO, False,
                 id="invalid-input"),
])
def test_over_grpc_a_fault_keeps_its_traceback_and_a_refusal_is_one_line(kserve_log, error, code, level,
                                                                        traceback):
    context = StandInContext()
    request = pb.ModelInferRequest(model_name=MODEL)
    try:  # the interceptor handles the error inside the `except` that caught it, as gRPC calls it
        raise error
    except Exception as caught:
        asyncio.run(OneLineRefusals().handle_exception(caught, request, context, MODEL_INFER))
    assert context.code == code
    [record] = kserve_log.records
    assert record.levelno == level and (record.exc_info not in (None, (None, None, None))) == traceback
    if not traceback:
        assert record.getMessage() == (f'refused request: protocol=grpc status={code.name} model="{MODEL}" '
                                       f'reason="{error}"')
