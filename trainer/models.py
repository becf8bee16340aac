"""The Keras model of each CNN variant in `trainer.variants`, where a new variant is one function.

Every model takes raw pixels (0-255, shape [28, 28, 1]) and scales them itself, so that training,
evaluation and serving cannot disagree on preprocessing, and every model returns logits: both are
added here around a variant's layers, so that no variant can leave them out.
"""

from __future__ import annotations

from typing import Mapping

import tf_keras as keras
from tf_keras import layers

from trainer import variants
from trainer.fashion_mnist import IMAGE_SIZE, MAX_PIXEL_VALUE, NUM_CLASSES

INPUT_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, 1)

# Variant name -> its layers' builder; the same registry as trainer.variants (train.py's choices).
MODELS: Mapping[str, variants.Body] = variants.BUILDERS


def build_model(name: str) -> keras.Model:
    builders = variants.BUILDERS
    if name not in builders:
        raise KeyError(f"unknown model {name!r}; choose from {', '.join(sorted(builders))}")
    body = builders[name](layers)
    return keras.Sequential(
        [layers.Input(INPUT_SHAPE), layers.Rescaling(1.0 / MAX_PIXEL_VALUE), *body,
         layers.Dense(NUM_CLASSES)],
        name=name,
    )
