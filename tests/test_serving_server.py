"""The server as users run it (a process on 127.0.0.1), with the client, load test and logger sink."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent
from conftest import refused_port, run_module
from fastapi import FastAPI
from fastapi.testclient import TestClient
from kserve.protocol.rest.server import PrintTimings
from PIL import Image
from timing_asgi import TimingMiddleware

from serving import client, loadtest
from serving import logger as logger_module
from serving import server as server_module
from serving.client import inference_request
from serving.kserve_overrides import without_kserve_timing
from serving.port_file import read_port_file
from serving.process import listening, model_server, port_file_beside, running_server
from serving.server import LimitAndMeasure
from trainer import fashion_mnist, model_repository

pytestmark = pytest.mark.slow  # starts model servers

MODEL = "fmnist"


@pytest.fixture(scope="module")
def image_dir(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    test = fashion_mnist.load_split(data_dir, "test")
    directory = tmp_path_factory.mktemp("images")
    for index, pixels in enumerate(test.images[:5]):
        Image.fromarray(pixels[..., 0]).save(directory / f"image-{index}.png")
    return directory


@pytest.fixture(scope="module")
def started_server(published_repo: Path, tmp_path_factory: pytest.TempPathFactory):
    """The module's server: its URL, process, log and request log."""
    work = tmp_path_factory.mktemp("server")
    with model_server(published_repo, MODEL, work / "server.log", "--log-file", work / "requests.jsonl",
                      "--max-body-bytes", "100000") as (url, process):
        yield url, process, work / "server.log", work / "requests.jsonl"


@pytest.fixture(scope="module")
def server(started_server) -> tuple[str, Path]:
    url, _, _, requests_log = started_server
    return url, requests_log


def png_body(image_dir: Path, protocol: str = "v1") -> tuple[str, dict]:
    return inference_request([(image_dir / "image-0.png").read_bytes()], protocol, MODEL)


def test_client_prints_class_and_confidence_per_image(server, image_dir):
    url, _ = server
    images = sorted(image_dir.iterdir())
    for protocol in ("v1", "v2"):
        result = run_module("serving.client", "predict", *images, "--url", url, "--protocol", protocol)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.strip().splitlines()
        assert len(lines) == len(images)
        assert all(line.startswith(f"{path}: ") and line.endswith("%)") for line, path in zip(lines, images))


def test_client_fails_with_the_servers_message(server, tmp_path):
    url, _ = server
    bogus = tmp_path / "bogus.png"
    bogus.write_text("not an image")
    result = run_module("serving.client", "predict", bogus, "--url", url)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        "serving.client: error: 400 from http://127.0.0.1:")
    assert "not a readable PNG or JPEG image" in result.stderr


def test_loadtest_reports_zero_errors_for_valid_input(server, image_dir, tmp_path):
    url, _ = server
    plot = tmp_path / "latency.png"
    result = run_module("serving.loadtest", "--url", url, "--concurrency", "4", "--requests", "40",
                        "--images", image_dir, "--plot", plot)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "requests: 40 in" in result.stdout
    assert "status: 200: 40" in result.stdout and "error rate: 0.00%" in result.stdout
    assert "p50" in result.stdout and "p99" in result.stdout and "latency histogram" in result.stdout
    assert Image.open(plot).size[0] > 0


def test_loadtest_sends_several_images_per_request(server, image_dir):
    url, log_file = server
    result = run_module("serving.loadtest", "--url", url, "--concurrency", "2", "--requests", "4",
                        "--images", image_dir, "--images-per-request", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "images/s (3 per request)" in result.stdout and "status: 200: 4" in result.stdout


def test_without_access_log_a_request_adds_no_access_line(server, image_dir):
    url, log_file = server
    path, body = png_body(image_dir)
    for _ in range(3):
        assert requests.post(url + path, json=body, timeout=30).status_code == 200
    assert " uvicorn.access " not in (log_file.parent / "server.log").read_text()


def predict_seconds_count(url: str) -> float:
    """KServe's own request_predict_seconds count for the model, from /metrics."""
    metrics = requests.get(url + "/metrics", timeout=10).text
    count = re.search(rf'^request_predict_seconds_count{{model_name="{MODEL}"}} (\S+)$', metrics, re.M)
    return float(count[1])


def test_kserves_predict_histogram_counts_every_request_both_protocols(server, image_dir):
    url, _ = server
    before = predict_seconds_count(url)
    for protocol in ("v1", "v2", "v1"):
        path, body = png_body(image_dir, protocol)
        assert requests.post(url + path, json=body, timeout=30).status_code == 200
    assert predict_seconds_count(url) == before + 3


LOADTEST_ARGS = ["--concurrency", "1", "--requests", "1"]
SERVER_ARGS = ["--model-repo", "runs/models"]


@pytest.mark.parametrize("module, prog, args, message", [
    (loadtest, "serving.loadtest", [*LOADTEST_ARGS, "--url", "127.0.0.1:8080"],
     "argument --url: '127.0.0.1:8080' is not an http:// or https:// URL"),
    (loadtest, "serving.loadtest", [*LOADTEST_ARGS, "--max-error-rate", "5"],
     "argument --max-error-rate: must be between 0 and 1, got 5"),
    (loadtest, "serving.loadtest", [*LOADTEST_ARGS, "--images-per-request", "0"],
     "argument --images-per-request: must be a positive integer, got 0"),
    (client, "serving.client predict", ["predict", "image.png", "--url", "localhost:8080"],
     "argument --url: 'localhost:8080' is not an http:// or https:// URL"),
    (server_module, "serving.server", [*SERVER_ARGS, "--max-batch-wait-ms", "-1"],
     "argument --max-batch-wait-ms: must be a finite number >= 0, got -1"),
    (server_module, "serving.server", [*SERVER_ARGS, "--max-batch-wait-ms", "inf"],
     "argument --max-batch-wait-ms: must be a finite number >= 0, got inf"),
    (server_module, "serving.server", [*SERVER_ARGS, "--max-queued-images", "0"],
     "argument --max-queued-images: must be a positive integer, got 0"),
    (server_module, "serving.server", ["--model-name", MODEL],
     "one of the arguments --model-repo --model-base-path is required"),
    (server_module, "serving.server", [*SERVER_ARGS, "--model-base-path", "/mnt/models"],
     "argument --model-base-path: not allowed with argument --model-repo"),
    (logger_module, "serving.logger", ["--port", "1", "--out-dir", "log", "--rotate-seconds", "0"],
     "argument --rotate-seconds: must be a positive number, got 0"),
    (logger_module, "serving.logger", ["--port", "1", "--out-dir", "log", "--rotate-bytes", "0"],
     "argument --rotate-bytes: must be a positive integer, got 0"),
])
def test_bad_arguments_are_one_line_errors(module, prog, args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"{prog}: error: {message} (see --help)\n"


def test_kserves_timing_middleware_is_left_out_and_ours_kept():
    application = FastAPI()
    application.add_middleware(LimitAndMeasure, max_body_bytes=100)
    without_kserve_timing(application)
    application.add_middleware(TimingMiddleware, client=PrintTimings())  # as KServe does on start
    with TestClient(application):  # the first call (lifespan) builds the stack
        layers, layer = [], application.middleware_stack
        while layer is not None:
            layers.append(type(layer))
            layer = getattr(layer, "app", None)
    assert LimitAndMeasure in layers and TimingMiddleware not in layers


def test_loadtest_fails_over_the_error_rate(server, tmp_path):
    url, _ = server
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "broken.png").write_bytes(b"\x89PNG broken")
    result = run_module("serving.loadtest", "--url", url, "--concurrency", "2", "--requests", "6",
                        "--images", bad)
    assert result.returncode == 1
    assert "status: 400: 6" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("serving.loadtest: error: error rate 100.00%")


def test_every_request_is_logged_with_its_id(server, image_dir):
    url, log_file = server
    path, body = png_body(image_dir)
    ids = [f"request-{i}" for i in range(5)]
    for request_id in ids:
        assert requests.post(url + path, json=body, headers={"x-request-id": request_id}).status_code == 200
    deadline = time.monotonic() + 10
    while True:
        entries = [json.loads(line) for line in log_file.read_text().splitlines()]
        logged = [e for e in entries if e["id"] in ids]
        if len(logged) == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [e["id"] for e in logged] == ids
    entry = logged[0]
    assert entry["model_version"] == 1 and entry["instances"] == 1 and entry["input_bytes"] > 0
    assert entry["response"]["predictions"][0]["class_name"] in fashion_mnist.CLASS_NAMES
    assert entry["latency_ms"] > 0 and "payload" not in entry


def test_a_body_over_the_limit_is_a_413_and_the_next_request_succeeds(server, image_dir):
    url, _ = server
    path, body = png_body(image_dir)
    too_big = {"instances": [{"b64": "A" * 200_000}]}
    response = requests.post(url + path, json=too_big)
    assert response.status_code == 413
    assert "over the limit of 100000 bytes" in response.json()["error"]
    assert requests.post(url + path, json=body).status_code == 200


def test_a_chunked_body_is_held_to_the_same_limit(server, image_dir):
    url, _ = server
    path, body = png_body(image_dir)

    def chunks(data: bytes, size: int = 10_000):  # a generator: requests sends it chunked
        yield from (data[i:i + size] for i in range(0, len(data), size))

    small = json.dumps(body).encode()
    assert requests.post(url + path, data=chunks(small)).status_code == 200
    too_big = json.dumps({"instances": [{"b64": "A" * 200_000}]}).encode()
    response = requests.post(url + path, data=chunks(too_big))
    assert response.status_code == 413 and "over the limit of 100000 bytes" in response.json()["error"]


@pytest.mark.parametrize("body", ['{"inputs": Infinity}', '{"inputs": [{"name": "x", "shape": [NaN], '
                                  '"datatype": "FP32", "data": [1]}]}'])
def test_an_invalid_v2_body_holding_nan_or_infinity_is_a_422(server, body):
    url, _ = server
    response = requests.post(f"{url}/v2/models/{MODEL}/infer", data=body,
                             headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith("invalid request: ")


@pytest.mark.parametrize("method, path, body, headers, status, error", [
    ("POST", "/v1/models/nope:predict", b'{"instances": [[0]]}', {}, 404, "nope does not exist"),
    ("POST", "/v2/models/nope/infer", b'{"inputs": []}', {"content-type": "application/json"}, 404,
     "nope does not exist"),
    ("POST", f"/v1/models/{MODEL}:predict", b"{not json", {}, 400, "Unrecognized request format"),
    ("POST", f"/v2/models/{MODEL}/infer", b"{not json", {"content-type": "application/json"}, 422,
     "invalid request: body.1: JSON decode error"),
    ("POST", f"/v2/models/{MODEL}/infer", b'{"inputs": 3}', {"content-type": "application/json"}, 422,
     "invalid request: body.inputs"),
    # not answered by the lean route: KServe's own routes and answers
    ("POST", f"/v2/models/{MODEL}/versions/1/infer", b'{"inputs": []}',
     {"content-type": "application/json"}, 501, "not supported"),
    ("GET", f"/v1/models/{MODEL}:predict", b"", {}, 404, f"{MODEL}:predict does not exist"),
])
def test_the_inference_routes_answer_as_kserves_own(server, method, path, body, headers, status, error):
    url, _ = server
    # Each is refused before a version is chosen: counted under version "".
    counted = f'dist_ml_requests_total{{protocol="{path[1:3]}",status="{status}",version=""}}'
    before = metric(url, counted)
    response = requests.request(method, url + path, data=body, headers=headers)
    assert response.status_code == status, response.text
    if error is not None:
        assert error in response.json()["error"]
    if method == "POST":
        assert metric(url, counted) == before + 1


def test_both_protocols_answer_with_the_version(server, image_dir):
    url, _ = server
    for protocol in ("v1", "v2"):
        path, body = png_body(image_dir, protocol)
        response = requests.post(url + path, json=body)
        assert response.status_code == 200 and response.headers["x-model-version"] == "1", response.text


def test_metrics_count_requests_batches_errors_and_the_version(server, image_dir):
    url, _ = server
    path, body = png_body(image_dir, "v2")
    assert requests.post(url + path, json=body).status_code == 200
    requests.post(url + path, json={"inputs": []})
    metrics = requests.get(f"{url}/metrics").text
    assert 'dist_ml_requests_total{protocol="v2",status="200",version="1"}' in metrics
    assert 'dist_ml_request_seconds_bucket{le="0.1",protocol="v2",status="200",version="1"}' in metrics
    assert "dist_ml_batch_size_count" in metrics
    assert 'dist_ml_errors_total{kind="invalid_input",version=""}' in metrics  # refused before a version
    assert 'dist_ml_model_version{model="fmnist"} 1.0' in metrics


def test_a_server_under_test_binds_port_zero_and_answers_on_the_port_it_reports(started_server):
    """serving.process gives the server port 0, never a port chosen beforehand (tests/test_bound_ports.py):
    the server binds it, and the port file and its log line name the port it answers on."""
    url, process, log, _ = started_server
    assert process.args[process.args.index("--http-port") + 1] == "0"
    port = int(url.rpartition(":")[2])
    assert port > 0 and read_port_file(port_file_beside(log)) == {"http": port}
    assert f"serving.server: listening on http port {port}" in log.read_text()
    assert requests.get(f"{url}/v1/models/{MODEL}").status_code == 200


def test_a_dead_log_sink_neither_fails_nor_slows_predictions(published_repo, image_dir, tmp_path):
    with refused_port() as port, model_server(published_repo, MODEL, tmp_path / "server.log", "--log-url",
                                              f"http://127.0.0.1:{port}/") as (url, _):
        path, body = png_body(image_dir)
        requests.post(url + path, json=body)  # warm-up: the first call traces the model
        latencies = []
        for _ in range(20):
            started = time.perf_counter()
            assert requests.post(url + path, json=body).status_code == 200
            latencies.append(time.perf_counter() - started)
        assert np.median(latencies) < 0.5
        deadline = time.monotonic() + 15
        while "dist_ml_log_entries_dropped_total 2" not in requests.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline, "dropped log entries were not counted"
            time.sleep(0.2)


def logged_lines(out_dir: Path) -> list[str]:
    """Every line of the logger's files, oldest file first."""
    files = sorted(out_dir.glob("events-*.jsonl")) if out_dir.is_dir() else []
    return [line for path in files for line in path.read_text().splitlines()]


def test_the_logger_sink_receives_request_and_response_events(published_repo, image_dir, tmp_path):
    out_dir = tmp_path / "inference-log"
    with listening("serving.logger", "--port", 0, "--out-dir", out_dir, "--host", "127.0.0.1",
                   log=tmp_path / "logger.log") as (sink, _), \
            model_server(published_repo, MODEL, tmp_path / "server.log", "--log-url",
                         f"http://127.0.0.1:{sink['http']}/") as (url, _):
        path, body = png_body(image_dir)
        for i in range(3):
            requests.post(url + path, json=body, headers={"x-request-id": f"r{i}"}).raise_for_status()
        deadline = time.monotonic() + 15
        while len(logged_lines(out_dir)) < 6:
            assert time.monotonic() < deadline, (tmp_path / "logger.log").read_text()
            time.sleep(0.1)
    events = [json.loads(line) for line in logged_lines(out_dir)]
    assert [(e["id"], e["type"].rsplit(".", 1)[1]) for e in events] == [
        (f"r{i}", kind) for i in range(3) for kind in ("request", "response")]
    assert events[1]["data"]["predictions"][0]["class_name"] in fashion_mnist.CLASS_NAMES


def wait_for_logger(port: int, log: Path) -> requests.Response:
    """The answer to a POST of `{}` (not a CloudEvent), once the logger listens."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return requests.post(f"http://127.0.0.1:{port}/", data=b"{}",
                                 headers={"content-type": "application/json"})
        except requests.ConnectionError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)


def test_the_logger_sink_rejects_what_is_not_a_cloudevent(tmp_path):
    with listening("serving.logger", "--port", 0, "--out-dir", tmp_path / "log", "--host",
                   "127.0.0.1", log=tmp_path / "logger.log") as (ports, _):
        response = wait_for_logger(ports["http"], tmp_path / "logger.log")
    assert response.status_code == 400 and "not a CloudEvent" in response.json()["error"]
    assert logged_lines(tmp_path / "log") == []


def open_files_under(pid: int, directory: Path) -> list[str]:
    fds = Path(f"/proc/{pid}/fd")
    return [target for fd in fds.iterdir()
            if (target := os.readlink(fd)).startswith(str(directory) + "/")]


def post_request_event(port: int, number: int) -> None:
    event = CloudEvent({"id": f"e{number}", "type": "org.kubeflow.serving.inference.request",
                        "source": "test"}, {"instances": [number]})
    headers, body = to_binary(event)
    requests.post(f"http://127.0.0.1:{port}/", headers=headers, data=body, timeout=10).raise_for_status()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see open files")
def test_the_logger_closes_a_file_once_it_is_rotate_seconds_old_while_running(tmp_path):
    out_dir, log = tmp_path / "log", tmp_path / "logger.log"
    with listening("serving.logger", "--port", 0, "--out-dir", out_dir, "--host", "127.0.0.1",
                   "--rotate-seconds", "0.5", log=log) as (ports, process):
        port = ports["http"]
        wait_for_logger(port, log)
        post_request_event(port, 0)
        assert len(open_files_under(process.pid, out_dir)) == 1  # open until it is old enough
        time.sleep(1.5)
        assert open_files_under(process.pid, out_dir) == []
        post_request_event(port, 1)  # a new file
        time.sleep(1.5)
        assert open_files_under(process.pid, out_dir) == []
        files = sorted(p.name for p in out_dir.iterdir())
    assert len(files) == 2 and all(re.fullmatch(r"events-\d{8}T\d{6}\.\d{6}Z-\d{6}\.jsonl", f) for f in files)
    assert [json.loads(line)["id"] for line in logged_lines(out_dir)] == ["e0", "e1"]


def test_the_logger_files_rotate_by_size_and_sort_by_time(tmp_path):
    files = logger_module.RotatingEventFiles(tmp_path, rotate_seconds=3600, rotate_bytes=100)
    for number in range(10):
        files.append({"id": number, "padding": "x" * 20})  # 45 bytes a line
    files.close()
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 5 and all((tmp_path / n).stat().st_size <= 100 for n in names)
    assert [json.loads(line)["id"] for line in logged_lines(tmp_path)] == list(range(10))
    with pytest.raises(RuntimeError, match="closed"):
        files.append({"id": 10})


def test_the_server_serves_a_release_from_a_base_path(published_repo, image_dir, tmp_path):
    version = model_repository.publish(published_repo / MODEL / "1", tmp_path / "models", MODEL,
                                       releases=tmp_path / "releases")
    mnt_models = tmp_path / "mnt-models"  # as KServe's storage initializer copies the storageUri
    shutil.copytree(model_repository.release_dir(tmp_path / "releases", MODEL, version), mnt_models)
    with running_server(["--model-base-path", mnt_models, "--model-name", MODEL], MODEL,
                        tmp_path / "server.log") as (url, _):
        path, body = png_body(image_dir)
        response = requests.post(url + path, json=body)
    assert response.status_code == 200 and response.headers["x-model-version"] == str(version)


def test_sigterm_lets_in_flight_requests_finish(published_repo, image_dir, tmp_path):
    with model_server(published_repo, MODEL, tmp_path / "server.log", "--max-batch-wait-ms", "1500",
                      "--max-batch-size", "64") as (url, process):
        path, body = png_body(image_dir)
        result: dict = {}
        request = threading.Thread(target=lambda: result.update(
            response=requests.post(url + path, json=body, timeout=30)))
        request.start()
        time.sleep(0.5)  # the request now waits in the batcher for its batch to fill
        process.send_signal(signal.SIGTERM)
        request.join(timeout=30)
        assert result["response"].status_code == 200
        assert process.wait(timeout=40) == 0



@pytest.fixture(scope="module")
def slow_batch_server(published_repo: Path, tmp_path_factory: pytest.TempPathFactory):
    """A server whose batches wait 1.5 s to fill and which admits one image at a time."""
    work = tmp_path_factory.mktemp("slow-batch-server")
    with model_server(published_repo, MODEL, work / "server.log", "--max-batch-wait-ms", "1500",
                      "--max-batch-size", "64", "--max-queued-images", "1") as (url, _):
        yield url


def metric(url: str, sample: str) -> float:
    """The value of one sample (name and labels) of the server's /metrics, 0 when absent."""
    metrics = requests.get(f"{url}/metrics").text
    match = re.search(rf"^{re.escape(sample)} (\S+)$", metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def queue_full_count(url: str) -> float:
    return metric(url, "dist_ml_queue_full_total")


def post_in_background(url: str, path: str, body: dict) -> tuple[threading.Thread, dict]:
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(
        response=requests.post(url + path, json=body, timeout=30)))
    thread.start()
    return thread, result


def test_a_full_queue_is_a_503_with_retry_after_counted_in_metrics(slow_batch_server, image_dir):
    url = slow_batch_server
    path, body = png_body(image_dir)
    before = queue_full_count(url)
    not_ready_before = metric(url, 'dist_ml_errors_total{kind="not_ready"}')
    first, result = post_in_background(url, path, body)
    time.sleep(0.5)  # the first image now waits in the batcher for its batch to fill
    started = time.perf_counter()
    refused = requests.post(url + path, json=body, timeout=30)
    refused_in = time.perf_counter() - started
    first.join(timeout=30)
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"] == "1" and "retry" in refused.json()["error"]
    assert refused_in < 1.0  # refused at once, not after waiting for the batch
    assert result["response"].status_code == 200
    assert queue_full_count(url) == before + 1
    # counted once: a full queue is not the model being "not ready"
    assert metric(url, 'dist_ml_errors_total{kind="not_ready"}') == not_ready_before
    assert requests.post(url + path, json=body, timeout=30).status_code == 200


def test_a_client_that_goes_away_does_not_block_the_others(slow_batch_server, image_dir):
    url = slow_batch_server
    path, body = png_body(image_dir)
    payload = json.dumps(body).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as gone:
        gone.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        time.sleep(0.3)  # admitted and waiting for its batch
    deadline = time.monotonic() + 10
    while (response := requests.post(url + path, json=body, timeout=30)).status_code == 503:
        assert time.monotonic() < deadline, "the gone client's image was never let go"
        time.sleep(0.2)
    assert response.status_code == 200
    assert requests.get(f"{url}/v2/health/ready").status_code == 200
