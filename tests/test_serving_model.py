"""The KServe model: v1 and v2 give the SavedModel's own predictions, bad input is a 400, new versions
are picked up, concurrent requests are batched."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import gc
import io
import random
import shutil
import struct
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from prometheus_client import REGISTRY

from trainer import fashion_mnist, model_repository
from trainer.atomic import COMMIT_MARKER

pytest.importorskip("kserve")
from fastapi.testclient import TestClient  # noqa: E402
from kserve import ModelServer  # noqa: E402
from kserve.model_server import app  # noqa: E402
from kserve.protocol.rest.server import RESTServer  # noqa: E402

from serving.inputs import Batch  # noqa: E402
from serving.metrics import ANSWERED_BY  # noqa: E402
from serving.model import VERSION_HEADER, FashionMnistModel  # noqa: E402
from serving.versions import VersionSet  # noqa: E402

WITHOUT_MARKER = shutil.ignore_patterns(COMMIT_MARKER)  # a version as a killed publisher leaves it

MODEL = "fmnist"


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels[..., 0]).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def served(published_repo: Path):
    """The model behind KServe's own REST application, in this process."""
    model = FashionMnistModel(MODEL, published_repo / MODEL, max_batch_size=16, max_wait_seconds=0.05,
                              poll_seconds=0.2)
    model.load()
    server = ModelServer(enable_grpc=False)
    server.register_model(model)
    RESTServer(app, server.dataplane, server.model_repository_extension, http_port=0).create_application()
    with TestClient(app, raise_server_exceptions=False) as client:
        yield model, client
    model.stop()


@pytest.fixture(scope="module")
def images(data_dir: Path) -> fashion_mnist.Split:
    test = fashion_mnist.load_split(data_dir, "test")
    return fashion_mnist.Split(test.images[:6], test.labels[:6])


@pytest.fixture(scope="module")
def expected(published_repo: Path, images) -> dict:
    direct = tf.saved_model.load(str(published_repo / MODEL / "1")).signatures["pixels"]
    return {k: v.numpy() for k, v in direct(pixels=tf.constant(images.images, tf.float32)).items()}


def assert_v1_matches(response, expected) -> None:
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert [p["class_id"] for p in predictions] == expected["class_id"].tolist()
    assert [p["class_name"] for p in predictions] == [n.decode() for n in expected["class_name"]]
    np.testing.assert_allclose([p["probabilities"] for p in predictions], expected["probabilities"],
                               atol=1e-5)


def test_v1_image_bytes_match_the_savedmodel(served, images, expected):
    _, client = served
    body = {"instances": [{"image_bytes": {"b64": base64.b64encode(png(x)).decode()}}
                          for x in images.images]}
    response = client.post(f"/v1/models/{MODEL}:predict", json=body)
    assert_v1_matches(response, expected)
    assert response.headers[VERSION_HEADER] == "1"


def test_v1_plain_b64_and_pixel_arrays_match_the_savedmodel(served, images, expected):
    _, client = served
    plain = {"instances": [{"b64": base64.b64encode(png(x)).decode()} for x in images.images]}
    assert_v1_matches(client.post(f"/v1/models/{MODEL}:predict", json=plain), expected)
    arrays = {"instances": [x[..., 0].tolist() for x in images.images]}
    assert_v1_matches(client.post(f"/v1/models/{MODEL}:predict", json=arrays), expected)


def test_v2_bytes_and_uint8_match_the_savedmodel(served, images, expected):
    _, client = served
    encoded = [base64.b64encode(png(x)).decode() for x in images.images]
    for tensor in (
        {"name": "image_bytes", "shape": [len(encoded)], "datatype": "BYTES", "data": encoded},
        {"name": "pixels", "shape": [len(encoded), 28, 28, 1], "datatype": "UINT8",
         "data": images.images.reshape(-1).tolist()},
    ):
        response = client.post(f"/v2/models/{MODEL}/infer", json={"inputs": [tensor]})
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        assert outputs["class_id"]["data"] == expected["class_id"].tolist()
        np.testing.assert_allclose(np.reshape(outputs["probabilities"]["data"], (-1, 10)),
                                   expected["probabilities"], atol=1e-5)
        assert response.json()["model_version"] == "1"


def test_readiness_and_health(served):
    _, client = served
    assert client.get(f"/v1/models/{MODEL}").json()["ready"] is True
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize("body, message", [
    ({"instances": []}, "no instances"),
    ({"instances": [[[0] * 28] * 28] * 65}, "at most 64 per request"),
    ({"rows": []}, 'with "instances"'),
    ({"instances": [{"b64": "!!!not base64!!!"}]}, "instance 0: invalid base64"),
    ({"instances": [{"b64": b64(b"hello, not an image")}]}, "instance 0: not a readable PNG or JPEG"),
    ({"instances": [{"image_bytes": {"b64": b64(png(np.zeros((28, 28, 1), np.uint8))[:40])}}]},
     "instance 0: not a readable PNG or JPEG"),
    ({"instances": [{"picture": "x"}]}, "got keys ['picture']"),
    ({"instances": [[[0] * 27] * 28]}, "shape [28, 27]"),
    ({"instances": [[[300] * 28] * 28]}, "within 0-255"),
    ({"instances": [[[-1] * 28] * 28]}, "within 0-255"),
    ({"instances": [[["a"] * 28] * 28]}, "must be numbers"),
    ({"instances": [[[0] * 28] * 28, {"b64": "AA=="}]}, "mixing encoded images and pixel arrays"),
])
def test_bad_v1_input_is_a_400_naming_the_problem(served, images, expected, body, message):
    _, client = served
    response = client.post(f"/v1/models/{MODEL}:predict", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    good = {"instances": [x[..., 0].tolist() for x in images.images]}
    assert_v1_matches(client.post(f"/v1/models/{MODEL}:predict", json=good), expected)


def test_nan_pixels_are_a_400(served):
    _, client = served
    body = '{"instances": [' + ",".join(["[" + ",".join(["NaN"] * 28) + "]"] * 28).join("[]") + "]}"
    response = client.post(f"/v1/models/{MODEL}:predict", content=body,
                           headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text


def test_bad_v2_input_is_a_400(served):
    _, client = served
    response = client.post(f"/v2/models/{MODEL}/infer", json={"inputs": [
        {"name": "pixels", "shape": [1, 28, 28], "datatype": "UINT8", "data": [0] * 784}]})
    assert response.status_code == 400 and "expected [N, 28, 28, 1]" in response.json()["error"]


def test_concurrent_requests_are_merged_into_batches(served, images):
    model, client = served
    body = {"instances": [images.images[0][..., 0].tolist()]}
    calls_before, instances_before = batch_metrics()
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(lambda _: client.post(f"/v1/models/{MODEL}:predict", json=body),
                                  range(12)))
    assert [r.status_code for r in responses] == [200] * 12
    calls, instances = batch_metrics()
    assert instances - instances_before == 12
    assert calls - calls_before < 12  # some model calls served several requests


def batch_metrics() -> tuple[float, float]:
    return (REGISTRY.get_sample_value("dist_ml_batch_size_count"),
            REGISTRY.get_sample_value("dist_ml_batch_size_sum"))


def test_the_loaded_model_is_kept_out_of_full_collections(served):
    assert gc.get_freeze_count() > 100_000  # TensorFlow and the model: ~440k objects


def served_version(client: TestClient, images) -> str:
    body = {"instances": [images.images[0][..., 0].tolist()]}
    response = client.post(f"/v1/models/{MODEL}:predict", json=body)
    assert response.status_code == 200, response.text
    return response.headers[VERSION_HEADER]


def test_a_half_written_version_is_never_served(served, published_repo, images):
    model, client = served
    before = served_version(client, images)
    number = max(model_repository.numbered_directories(published_repo / MODEL)) + 1
    half_written = published_repo / MODEL / str(number)  # a publisher killed before its marker
    # Copied without its marker: the watcher polls meanwhile, and must never see this one committed.
    shutil.copytree(published_repo / MODEL / before, half_written, ignore=WITHOUT_MARKER)
    shutil.rmtree(half_written / "variables")

    assert model.refresh()
    time.sleep(model.poll_seconds * 5)  # several polls of the watcher

    assert served_version(client, images) == before
    assert model.current.number == int(before)


def test_a_newly_published_version_is_picked_up(served, published_repo, images):
    _, client = served
    version = model_repository.publish(published_repo / MODEL / "1", published_repo, MODEL)
    deadline = time.monotonic() + 30
    while served_version(client, images) != str(version):
        assert time.monotonic() < deadline, f"version {version} was not picked up"
        time.sleep(0.1)


def test_a_base_path_of_a_release_serves_its_one_version(published_repo, images, expected, tmp_path):
    version = model_repository.publish(published_repo / MODEL / "1", tmp_path / "models", MODEL,
                                       releases=tmp_path / "releases")
    mnt_models = tmp_path / "mnt-models"  # what KServe's storage initializer makes of the release
    shutil.copytree(model_repository.release_dir(tmp_path / "releases", MODEL, version), mnt_models)
    model = FashionMnistModel(MODEL, mnt_models)
    assert model.refresh() and model.current.number == version
    batch = Batch(pixels=images.images.astype(np.float32))
    np.testing.assert_allclose(model.current.predict(batch)["probabilities"], expected["probabilities"],
                               atol=1e-5)


def test_no_committed_version_is_a_clear_error(published_repo, tmp_path):
    half_written = tmp_path / "base" / "1"
    shutil.copytree(published_repo / MODEL / "1", half_written, ignore=WITHOUT_MARKER)
    with pytest.raises(FileNotFoundError, match="base: no published version"):
        FashionMnistModel(MODEL, tmp_path / "base").load()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG of ~70 bytes whose header declares width x height (8-bit grey), with a token of data."""
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + png_chunk(b"IEND", b""))


def v2_pixels(shape, data, datatype="UINT8") -> dict:
    return {"inputs": [{"name": "pixels", "shape": shape, "datatype": datatype, "data": data}]}


@pytest.mark.parametrize("body, message", [
    (v2_pixels([1, 28, 28, 1], [0] * 783), "shape [1, 28, 28, 1] holds 784 values, data has 783"),
    (v2_pixels([2, 28, 28, 1], [0] * 784), "holds 1568 values, data has 784"),
    (v2_pixels([-1, 28, 28, 1], [0] * 784), "negative dimension"),
    (v2_pixels([1, 28, 28, 1], [300] * 784), "UINT8 data must be integers within 0-255"),
    (v2_pixels([1, 28, 28, 1], [-1] * 784), "UINT8 data must be integers within 0-255"),
    (v2_pixels([1, 28, 28, 1], [1.5] * 784), "UINT8 data must be integers within 0-255"),
    (v2_pixels([1, 28, 28, 1], ["a"] * 784), "UINT8 data must be numbers"),
    (v2_pixels([1, 28, 28, 1], [2 ** 70] * 784), "UINT8 data must be numbers"),
    (v2_pixels([1, 28, 28, 1], [1e300] * 784, "FP32"), "within 0-255"),
    ({"inputs": [{"name": "b", "shape": [2], "datatype": "BYTES", "data": ["AA=="]}]},
     "shape [2] holds 2 values, data has 1"),
    ({"inputs": [{"name": "b", "shape": [-1], "datatype": "BYTES", "data": ["AA=="]}]},
     "negative dimension"),
    ({"inputs": [{"name": "b", "shape": [1], "datatype": "BYTES",
                  "data": [b64(png_header_only(100_000, 100_000))]}]}, "over the limit of"),
    ({"inputs": [{"name": "b", "shape": [1], "datatype": "BYTES",
                  "data": [b64(png_header_only(5000, 5000))]}]}, "image is 5000x5000, over the limit"),
])
def test_bad_v2_input_is_a_400_naming_the_problem(served, body, message):
    _, client = served
    response = client.post(f"/v2/models/{MODEL}/infer", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


def test_an_image_declaring_billions_of_pixels_is_refused_from_its_header(served):
    _, client = served
    bomb = png_header_only(65_535, 65_535)  # 4.3 billion pixels in 33 bytes
    response = client.post(f"/v1/models/{MODEL}:predict", json={"instances": [{"b64": b64(bomb)}]})
    assert response.status_code == 400 and "over the limit of" in response.json()["error"]


def test_v2_metadata_describes_the_signatures_inputs_and_outputs(served, published_repo):
    _, client = served
    response = client.get(f"/v2/models/{MODEL}")
    assert response.status_code == 200, response.text
    loaded = tf.saved_model.load(str(published_repo / MODEL / "1"))
    v2_types = {tf.string: "BYTES", tf.float32: "FP32", tf.int32: "INT32"}

    def described(specs: dict) -> dict:
        return {name: (v2_types[spec.dtype], [-1 if s is None else s for s in spec.shape.as_list()])
                for name, spec in specs.items()}

    signature_inputs = {**described(loaded.signatures["serving_default"].structured_input_signature[1]),
                        **described(loaded.signatures["pixels"].structured_input_signature[1])}
    signature_outputs = described(loaded.signatures["serving_default"].structured_outputs)
    metadata = response.json()
    assert {t["name"]: (t["datatype"], t["shape"]) for t in metadata["inputs"]} == signature_inputs
    assert {t["name"]: (t["datatype"], t["shape"]) for t in metadata["outputs"]} == signature_outputs
    assert signature_inputs == {"image_bytes": ("BYTES", [-1]), "pixels": ("FP32", [-1, 28, 28, 1])}
    assert signature_outputs["probabilities"] == ("FP32", [-1, 10])


# --- two versions: the rollout state's stable version and canary ---------------------------------

SPLIT_SEED = 14


class FailingVersion:
    """A loaded version whose every model call fails, as a broken canary's would."""
    number = 99

    def predict(self, batch: Batch) -> dict:
        raise RuntimeError("this version is broken")


@pytest.fixture(scope="module")
def canary_base(published_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base path with versions 1 and 2 (the same model), 2 the canary at 50%."""
    base = tmp_path_factory.mktemp("canary") / MODEL
    shutil.copytree(published_repo / MODEL / "1", base / "1")
    model_repository.publish(base / "1", base.parent, MODEL)
    model_repository.write_rollout(base, model_repository.RolloutState(1, 2, 50))
    return base


def predict_each(model: FashionMnistModel, body: dict, count: int) -> list[tuple[dict, dict]]:
    """`count` requests one after another: (response body, response headers) each."""
    async def requests() -> list[tuple[dict, dict]]:
        answers = []
        for _ in range(count):
            headers: dict[str, str] = {}
            answers.append((await model.predict(body, response_headers=headers), headers))
        return answers
    return asyncio.run(requests())


def test_two_versions_under_a_50_percent_split_answer_400_requests_40_to_60_percent(canary_base, images):
    model = FashionMnistModel(MODEL, canary_base, max_wait_seconds=0.0)
    assert model.refresh() and model.versions.state == model_repository.RolloutState(1, 2, 50)
    model.versions = dataclasses.replace(model.versions, draw=random.Random(SPLIT_SEED).random)
    body = {"instances": [{"image_bytes": {"b64": base64.b64encode(png(images.images[0])).decode()}}]}
    answers = predict_each(model, body, 400)
    by_header = Counter(headers[VERSION_HEADER] for _, headers in answers)
    assert set(by_header) == {"1", "2"} and 0.40 <= by_header["2"] / 400 <= 0.60
    assert all(str(body["model_version"]) == headers[VERSION_HEADER] for body, headers in answers)
    assert model.current.number == 1  # metadata and MODEL_VERSION describe the stable version


def test_the_watcher_follows_the_rollout_state_and_keeps_what_is_loaded(canary_base):
    model = FashionMnistModel(MODEL, canary_base)
    model.refresh()
    canary = model.versions.loaded[2]
    model_repository.write_rollout(canary_base, model_repository.RolloutState(2))
    assert model.refresh() and model.versions.state == model_repository.RolloutState(2)
    assert model.versions.loaded == {2: canary}  # promoted without loading it again
    model_repository.write_rollout(canary_base, model_repository.RolloutState(1, 3, 10))
    with pytest.raises(ValueError, match="names version 3, which is not a committed version"):
        model.refresh()  # the watcher logs it and goes on serving version 2
    assert model.versions.state == model_repository.RolloutState(2)
    model_repository.write_rollout(canary_base, model_repository.RolloutState(1, 2, 50))


def test_a_failed_request_is_counted_against_the_version_that_failed_it(canary_base, images):
    model = FashionMnistModel(MODEL, canary_base, max_wait_seconds=0.0)
    model.refresh()
    model.versions = VersionSet(model_repository.RolloutState(1, 99, 100),
                                {1: model.current, 99: FailingVersion()})
    body = {"instances": [{"image_bytes": {"b64": base64.b64encode(png(images.images[0])).decode()}}]}

    async def request_noting_its_version() -> dict:
        answered_by: dict[str, str] = {}
        ANSWERED_BY.set(answered_by)  # as the server's middleware does per request
        with pytest.raises(RuntimeError, match="this version is broken"):
            await model.predict(body, response_headers={})
        return answered_by

    assert asyncio.run(request_noting_its_version()) == {"version": "99"}
