"""The CNN variants, each one function below: its name is the variant's name, and it returns the
layers between the scaled input and the logits. The pipeline trains every variant defined here unless
told otherwise, in the order they are defined.

To add a variant, add one decorated function to this module; nothing else changes. The pipeline's
default, the stack config, the Argo render (a `train-<name>` step and TFJob) and `make demo` follow.

This module imports only the standard library, so that the pipeline, the stack config and the
Makefile read `VARIANTS` without TensorFlow (or a virtualenv): each function is handed Keras' `layers`
module, and `trainer.models` wraps what it returns in a model that scales raw pixels itself and ends
in the logits layer.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

# keras.layers -> the variant's layers, between Rescaling and the final Dense(NUM_CLASSES).
Body = Callable[[ModuleType], list[Any]]
BUILDERS: dict[str, Body] = {}


def variant(body: Body) -> Body:
    """Registers `body` as the variant named after the function."""
    if body.__name__ in BUILDERS:
        raise ValueError(f"variant {body.__name__!r} is defined twice in trainer.variants")
    BUILDERS[body.__name__] = body
    return body


def __getattr__(name: str) -> tuple[str, ...]:
    """`VARIANTS`, every variant in the order defined: computed when read, so that a function added
    anywhere in this module counts."""
    if name == "VARIANTS":
        return tuple(BUILDERS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@variant
def cnn(layers: ModuleType) -> list[Any]:
    """One convolution block and a dense layer: the baseline."""
    return [
        layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
    ]


@variant
def cnn_dropout(layers: ModuleType) -> list[Any]:
    """Three convolutions with dropout after the second block."""
    return [
        layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Dropout(0.5),
        layers.Conv2D(64, 3, activation="relu"),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
    ]


@variant
def cnn_batchnorm(layers: ModuleType) -> list[Any]:
    """Three convolutions, the first two batch-normalised before their activation."""
    return [
        layers.Conv2D(32, 3),
        layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3),
        layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, activation="relu"),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
    ]


@variant
def cnn_vgg(layers: ModuleType) -> list[Any]:
    """Two 3x3 convolutions before the first pooling (as VGG stacks them), a third after it, each
    batch-normalised; dropout before a wider dense layer. The slowest variant, which `make demo`
    leaves out; how it scores: docs/results/model-quality.md."""
    return [
        layers.Conv2D(32, 3, padding="same"),
        layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.Conv2D(32, 3),
        layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3),
        layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dropout(0.3),
        layers.Dense(128, activation="relu"),
    ]


@variant
def cnn_gap(layers: ModuleType) -> list[Any]:
    """Five batch-normalised 3x3 convolutions (16 channels, then two of 32 and two of 64, pooled
    between), averaged over the image (global average pooling) instead of flattened into a dense
    layer: 71k weights against `cnn`'s 347k, and what a garment looks like anywhere in the frame
    counts the same. The best variant by cross-validation on the sample, so `make demo` trains it
    beside `cnn` (docs/results/model-quality.md)."""
    def conv(filters: int) -> list[Any]:
        return [layers.Conv2D(filters, 3, padding="same"), layers.BatchNormalization(),
                layers.Activation("relu")]

    return [
        *conv(16),
        layers.MaxPooling2D(2),
        *conv(32), *conv(32),
        layers.MaxPooling2D(2),
        *conv(64), *conv(64),
        layers.GlobalAveragePooling2D(),
        layers.Dropout(0.3),
    ]
