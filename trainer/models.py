"""The CNN variants, as a registry of named builders: a new variant is its name in
`trainer.variants.VARIANTS` (which the pipeline reads without TensorFlow) and one decorated function.

Every model takes raw pixels (0-255, shape [28, 28, 1]) and scales them itself, so that training,
evaluation and serving cannot disagree on preprocessing. Every model returns logits.
"""

from __future__ import annotations

from typing import Callable

import tf_keras as keras
from tf_keras import layers

from trainer.fashion_mnist import IMAGE_SIZE, MAX_PIXEL_VALUE, NUM_CLASSES
from trainer.variants import VARIANTS

INPUT_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, 1)

ModelBuilder = Callable[[], keras.Model]
MODELS: dict[str, ModelBuilder] = {}


def register(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    if name not in VARIANTS:
        raise ValueError(f"variant {name!r} is not in trainer.variants.VARIANTS; add it there first")

    def add(builder: ModelBuilder) -> ModelBuilder:
        MODELS[name] = builder
        return builder

    return add


def build_model(name: str) -> keras.Model:
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; choose from {', '.join(sorted(MODELS))}")
    return MODELS[name]()


def _sequential(name: str, *body: layers.Layer) -> keras.Model:
    return keras.Sequential(
        [layers.Input(INPUT_SHAPE), layers.Rescaling(1.0 / MAX_PIXEL_VALUE), *body],
        name=name,
    )


@register("cnn")
def cnn() -> keras.Model:
    return _sequential(
        "cnn",
        layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(NUM_CLASSES),
    )


@register("cnn_dropout")
def cnn_dropout() -> keras.Model:
    return _sequential(
        "cnn_dropout",
        layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Dropout(0.5),
        layers.Conv2D(64, 3, activation="relu"),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(NUM_CLASSES),
    )


@register("cnn_batchnorm")
def cnn_batchnorm() -> keras.Model:
    return _sequential(
        "cnn_batchnorm",
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
        layers.Dense(NUM_CLASSES),
    )
