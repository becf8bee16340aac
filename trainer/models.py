"""The Keras model of each CNN variant in `trainer.variants`, where a new variant is one function.

Every model takes raw pixels (0-255, shape [28, 28, 1]) and scales them itself, so that training,
evaluation and serving cannot disagree on preprocessing, and every model returns float32 logits: both
are added here around a variant's layers, so that no variant can leave them out.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

import tf_keras as keras
from tf_keras import layers

from trainer import variants
from trainer.fashion_mnist import IMAGE_SIZE, MAX_PIXEL_VALUE, NUM_CLASSES

INPUT_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, 1)

# Variant name -> its layers' builder; the same registry as trainer.variants (train.py's choices).
MODELS: Mapping[str, variants.Body] = variants.BUILDERS


@contextlib.contextmanager
def dtype_policy(policy: str) -> Iterator[None]:
    """Layers built here take Keras' dtype `policy` (e.g. mixed_float16); the global one is restored."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def build_model(name: str, policy: str = "float32") -> keras.Model:
    """The variant's model under dtype `policy`. Its logits are float32 whatever the policy: under
    mixed_float16 the softmax and the loss would otherwise run in float16, which overflows, and the
    export's probabilities stay float32."""
    builders = variants.BUILDERS
    if name not in builders:
        raise KeyError(f"unknown model {name!r}; choose from {', '.join(sorted(builders))}")
    with dtype_policy(policy):
        body = builders[name](layers)
        return keras.Sequential(
            [layers.Input(INPUT_SHAPE), layers.Rescaling(1.0 / MAX_PIXEL_VALUE), *body,
             layers.Dense(NUM_CLASSES, dtype="float32")],
            name=name,
        )
