"""The serving contract: a SavedModel that TF Serving, KServe and our own server load as is.

Signatures:
- `serving_default`: `image_bytes` (tf.string [None], PNG or JPEG, any size, grey or colour) ->
  `probabilities` [None, 10], `class_id` [None], `class_name` [None]. Decoding, conversion to grey
  and resizing happen in the graph. TF Serving decodes `{"image_bytes": {"b64": ...}}` instances
  into this input because its name ends in `_bytes`.
- `pixels`: `pixels` (float32 [None, 28, 28, 1], values 0-255) -> the same outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from trainer.fashion_mnist import CLASS_NAMES, IMAGE_SIZE
from trainer.serving_contract import IMAGE_BYTES_INPUT, PIXELS_INPUT, PIXELS_SIGNATURE, SERVING_SIGNATURE

METRICS_FILE = "metrics.json"  # written by the trainer inside the export


def decode_image(encoded: tf.Tensor) -> tf.Tensor:
    """PNG or JPEG bytes of any size and colour -> float32 [28, 28, 1], values 0-255."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    grey = tf.image.rgb_to_grayscale(image)
    resized = tf.image.resize(grey, [IMAGE_SIZE, IMAGE_SIZE], antialias=True)
    return tf.clip_by_value(resized, 0.0, 255.0)


class Signatures(tf.Module):
    """The two serving signatures around `probabilities`, which a subclass defines."""

    def __init__(self):
        super().__init__()
        self.class_names = tf.constant(CLASS_NAMES)

    def probabilities(self, pixels: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError

    def _predict(self, pixels: tf.Tensor) -> dict[str, tf.Tensor]:
        probabilities = self.probabilities(pixels)
        class_id = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {
            "probabilities": probabilities,
            "class_id": class_id,
            "class_name": tf.gather(self.class_names, class_id),
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=IMAGE_BYTES_INPUT)])
    def serve_image_bytes(self, image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
        pixels = tf.map_fn(
            decode_image, image_bytes,
            fn_output_signature=tf.TensorSpec([IMAGE_SIZE, IMAGE_SIZE, 1], tf.float32),
        )
        return self._predict(pixels)

    @tf.function(input_signature=[
        tf.TensorSpec([None, IMAGE_SIZE, IMAGE_SIZE, 1], tf.float32, name=PIXELS_INPUT)
    ])
    def serve_pixels(self, pixels: tf.Tensor) -> dict[str, tf.Tensor]:
        return self._predict(pixels)


class ServingModule(Signatures):
    """Wraps a trained model (logits from raw pixels) with the two serving signatures."""

    def __init__(self, model: keras.Model):
        super().__init__()
        self.model = model

    def probabilities(self, pixels: tf.Tensor) -> tf.Tensor:
        return tf.nn.softmax(self.model(pixels, training=False))


class EnsembleModule(Signatures):
    """The mean of several exports' probabilities, behind the same two signatures.

    Each member is a loaded SavedModel of this contract; its restored `serve_pixels` function and
    variables are tracked here, so the ensemble saves as one self-contained SavedModel. Averaging
    probabilities of models trained differently cancels part of each one's errors on unseen images.
    """

    def __init__(self, members: Sequence[tf.Module]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = list(members)

    def probabilities(self, pixels: tf.Tensor) -> tf.Tensor:
        return tf.add_n([member.serve_pixels(pixels)["probabilities"] for member in self.members]) \
            / len(self.members)


def save_module(module: Signatures, export_dir: str) -> None:
    tf.saved_model.save(
        module,
        export_dir,
        signatures={
            SERVING_SIGNATURE: module.serve_image_bytes,
            PIXELS_SIGNATURE: module.serve_pixels,
        },
    )


def save_for_serving(model: keras.Model, export_dir: str) -> None:
    save_module(ServingModule(model), export_dir)


# Reads a SavedModel directory; a caller that reads the same export twice may pass a cached one.
Loader = Callable[[Path], object]


def load_saved_model(export_dir: Path) -> object:
    return tf.saved_model.load(str(export_dir))


def save_ensemble(member_dirs: Sequence[Path], export_dir: str, load: Loader = load_saved_model) -> None:
    """One SavedModel serving the mean probabilities of the exports in `member_dirs`."""
    save_module(EnsembleModule([load(member) for member in member_dirs]), export_dir)


def pixels_predictor(export_dir: Path, load: Loader = load_saved_model) -> Callable[[np.ndarray], np.ndarray]:
    """The export loaded once, as a function: uint8 images [N, 28, 28, 1] -> class probabilities
    [N, 10], through the `pixels` signature."""
    predict = load(export_dir).signatures[PIXELS_SIGNATURE]

    def probabilities(images: np.ndarray) -> np.ndarray:
        return predict(pixels=tf.constant(images, tf.float32))["probabilities"].numpy()

    return probabilities


def predict_pixels(export_dir: Path, images: np.ndarray) -> np.ndarray:
    """Class probabilities [N, 10] for uint8 images [N, 28, 28, 1], through the `pixels` signature."""
    return pixels_predictor(export_dir)(images)


def accuracy_and_loss(probabilities: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of predicted probabilities against true class ids."""
    picked = probabilities[np.arange(len(labels)), labels]
    accuracy = float(np.mean(probabilities.argmax(axis=1) == labels))
    return accuracy, float(-np.mean(np.log(np.maximum(picked, 1e-7))))
