"""The KServe model: v1 and v2 give the SavedModel's own predictions, bad input is a 400, new versions
are picked up, concurrent requests are batched."""

from __future__ import annotations

import base64
import concurrent.futures
import gc
import io
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from prometheus_client import REGISTRY

from trainer import fashion_mnist, model_repository

pytest.importorskip("kserve")
from fastapi.testclient import TestClient  # noqa: E402
from kserve import ModelServer  # noqa: E402
from kserve.model_server import app  # noqa: E402
from kserve.protocol.rest.server import RESTServer  # noqa: E402

from serving.inputs import Batch  # noqa: E402
from serving.model import VERSION_HEADER, FashionMnistModel  # noqa: E402

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
    shutil.copytree(published_repo / MODEL / before, half_written)
    (half_written / "COMMITTED").unlink()
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
    shutil.copytree(published_repo / MODEL / "1", half_written)
    (half_written / "COMMITTED").unlink()
    with pytest.raises(FileNotFoundError, match="base: no published version"):
        FashionMnistModel(MODEL, tmp_path / "base").load()
