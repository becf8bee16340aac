"""Training with real worker processes, the serving export, refusals of bad arguments. (Resuming after
a lost worker: tests/test_pipeline_local.py, through the engine that restarts the step.)"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import last_line, run_module, train_args
from PIL import Image

from trainer import fashion_mnist, train
from trainer.atomic import is_committed

pytestmark = pytest.mark.slow  # trains worker processes


def encode(pixels: np.ndarray, image_format: str = "PNG", size: int = 28,
           mode: str = "L") -> bytes:
    image = Image.fromarray(pixels[..., 0]).convert(mode).resize((size, size))
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def test_images(data_dir: Path) -> fashion_mnist.Split:
    test = fashion_mnist.load_split(data_dir, "test")
    return fashion_mnist.Split(test.images[:20], test.labels[:20])


def test_two_workers_train_and_the_chief_exports_metrics(two_worker_export: Path):
    metrics = json.loads((two_worker_export / "metrics.json").read_text())
    assert metrics["workers"] == 2
    assert metrics["model"] == "cnn"
    assert metrics["epochs"] == 2 and metrics["steps_per_epoch"] == 6
    assert metrics["global_batch_size"] == 64  # 32 per replica x 2 replicas
    # 64 = 2 x train.REFERENCE_GLOBAL_BATCH: the rate times sqrt(2).
    assert metrics["learning_rate"] == pytest.approx(train.DEFAULT_LEARNING_RATE * math.sqrt(2))
    assert (metrics["gpus"], metrics["precision"]) == (0, "float32")  # auto: off on CPUs
    assert 0.0 <= metrics["validation"]["accuracy"] <= 1.0
    assert metrics["validation"]["examples"] == 50  # 10% of each class of the 500 held out
    assert metrics["examples_per_second"] > 0 and metrics["wall_time_seconds"] > 0
    leftovers = [p.name for p in two_worker_export.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []
    assert is_committed(two_worker_export)


def test_serving_default_classifies_png_bytes_like_the_pixels_signature(two_worker_export,
                                                                        test_images):
    loaded = tf.saved_model.load(str(two_worker_export))
    by_bytes = loaded.signatures["serving_default"](
        image_bytes=tf.constant([encode(image) for image in test_images.images]))
    by_pixels = loaded.signatures["pixels"](pixels=tf.constant(test_images.images, tf.float32))

    assert by_bytes["probabilities"].shape == (20, 10)
    np.testing.assert_allclose(by_bytes["probabilities"], by_pixels["probabilities"], atol=1e-5)
    np.testing.assert_array_equal(by_bytes["class_id"], by_pixels["class_id"])
    names = [name.decode() for name in by_bytes["class_name"].numpy()]
    assert names == [fashion_mnist.CLASS_NAMES[i] for i in by_bytes["class_id"].numpy()]
    np.testing.assert_allclose(np.sum(by_bytes["probabilities"], axis=1), 1.0, rtol=1e-5)


def test_a_mixed_precision_export_serves_float32_probabilities(one_worker_export, test_images):
    metrics = json.loads((one_worker_export / "metrics.json").read_text())
    assert metrics["precision"] == "mixed_float16"
    outputs = tf.saved_model.load(str(one_worker_export)).signatures["pixels"](
        pixels=tf.constant(test_images.images, tf.float32))
    assert outputs["probabilities"].dtype == tf.float32
    np.testing.assert_allclose(np.sum(outputs["probabilities"], axis=1), 1.0, rtol=1e-5)


def test_serving_default_takes_jpeg_colour_and_other_sizes(two_worker_export, test_images):
    loaded = tf.saved_model.load(str(two_worker_export))
    images = [encode(test_images.images[0], "JPEG", size=84, mode="RGB"),
              encode(test_images.images[1], "PNG", size=14, mode="RGBA")]
    result = loaded.signatures["serving_default"](image_bytes=tf.constant(images))
    assert result["probabilities"].shape == (2, 10)
    assert result["class_id"].shape == (2,)


BAD_ARGUMENTS = [
    ({"model": "resnet"}, "train: error: argument --model: invalid choice: 'resnet'"),
    ({"data-dir": "/nonexistent/data"}, "train: error: /nonexistent/data: no dataset here"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}'},
     "train: error: malformed TF_CONFIG: task.index 3 is not in 0..0"),
    ({"epochs": "0"}, "train: error: argument --epochs: must be a positive integer, got 0"),
    ({"gpus": "-1"}, "train: error: argument --gpus: must be a whole number >= 0, got -1"),
    ({"mixed-precision": "fp16"}, "train: error: argument --mixed-precision: invalid choice: 'fp16'"),
]


def bad_run(data_dir: Path, tmp_path: Path, change: dict[str, str]) -> tuple[list[str], str]:
    """The arguments and TF_CONFIG of a run of cnn with `change` made."""
    flags = {"model": "cnn", "data-dir": str(data_dir), "checkpoint-dir": str(tmp_path / "c"),
             "export-dir": str(tmp_path / "e"), "epochs": "1"}
    tf_config = change.pop("TF_CONFIG", "")
    flags.update(change)
    return [item for key, value in flags.items() for item in (f"--{key}", value)], tf_config


@pytest.mark.parametrize("change, message", BAD_ARGUMENTS)
def test_bad_arguments_exit_nonzero_with_one_clear_line(data_dir, tmp_path, change, message, capsys,
                                                        monkeypatch):
    argv, tf_config = bad_run(data_dir, tmp_path, dict(change))
    monkeypatch.setenv("TF_CONFIG", tf_config)

    with pytest.raises(SystemExit) as exit_info:
        train.run(argv)  # in process: the module's own entry point, without a TensorFlow import a case

    assert exit_info.value.code != 0
    assert last_line(capsys.readouterr().err).startswith(message)
    assert not (tmp_path / "e").exists()


def test_python_m_trainer_train_reports_a_bad_argument_in_one_line(data_dir, tmp_path):
    change, message = BAD_ARGUMENTS[2]
    argv, tf_config = bad_run(data_dir, tmp_path, dict(change))

    result = run_module("trainer.train", *argv, env={"TF_CONFIG": tf_config})

    assert result.returncode == 2  # a user's mistake: JobSet fails the set at once, no restart mends it
    assert last_line(result.stderr) == message, result.stderr[-2000:]


def test_a_checkpoint_dir_of_another_variant_is_refused(data_dir, tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "model.txt").write_text("cnn_dropout\n")

    with pytest.raises(SystemExit) as exit_info:
        train.run(train_args("cnn", data_dir, tmp_path, "--epochs", "1"))

    assert exit_info.value.code == 2
    assert last_line(capsys.readouterr().err) == (
        f"train: error: {tmp_path / 'checkpoints'}: holds checkpoints of 'cnn_dropout', not 'cnn'; "
        "give each variant its own --checkpoint-dir")
    assert (tmp_path / "checkpoints" / "model.txt").read_text() == "cnn_dropout\n"
