"""The model registry and the variants' shapes."""

from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from trainer import models, variants
from trainer.variants import VARIANTS


def test_registry_holds_exactly_the_variants_the_pipeline_validates_against():
    assert tuple(models.MODELS) == VARIANTS
    assert VARIANTS[:3] == ("cnn", "cnn_dropout", "cnn_batchnorm")  # defined first, trained first


def test_a_variant_defined_twice_is_refused():
    with pytest.raises(ValueError, match="variant 'cnn' is defined twice"):
        variants.variant(variants.cnn)


@pytest.mark.parametrize("name", VARIANTS)  # a new variant is checked with no edit here
def test_each_variant_scales_raw_pixels_itself_and_returns_ten_logits(name):
    model = models.build_model(name)
    assert isinstance(model.layers[0], keras.layers.Rescaling)
    assert model.input_shape == (None, 28, 28, 1)
    logits = model(np.full((2, 28, 28, 1), 255.0, np.float32))
    assert logits.shape == (2, 10)


def test_cnn_batchnorm_normalises_both_conv_blocks():
    kinds = [type(layer).__name__ for layer in models.build_model("cnn_batchnorm").layers]
    assert kinds.count("BatchNormalization") == 2
    assert kinds.count("Conv2D") == 3


def test_a_fourth_variant_is_one_function_and_gets_scaling_and_logits(monkeypatch):
    monkeypatch.setattr(variants, "BUILDERS", dict(variants.BUILDERS))

    @variants.variant
    def tiny(layers):
        return [layers.Flatten()]

    assert variants.VARIANTS[-1] == "tiny"
    model = models.build_model("tiny")
    assert [type(layer).__name__ for layer in model.layers] == ["Rescaling", "Flatten", "Dense"]
    assert model.output_shape == (None, 10)


def test_unknown_variant_names_the_choices():
    choices = ", ".join(sorted(VARIANTS))
    with pytest.raises(KeyError, match=f"unknown model 'resnet'; choose from {choices}\""):
        models.build_model("resnet")


def test_smoothed_loss_takes_class_ids_and_matches_keras_on_one_hot_targets():
    import tensorflow as tf

    from trainer.train import LABEL_SMOOTHING, SmoothedSparseCrossentropy

    logits = tf.constant(np.random.default_rng(0).normal(size=(6, 10)), tf.float32)
    ids = tf.constant([0, 3, 9, 1, 1, 7])
    expected = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=LABEL_SMOOTHING)(
        tf.one_hot(ids, 10), logits)
    assert float(SmoothedSparseCrossentropy()(ids, logits)) == pytest.approx(float(expected), rel=1e-6)
    unsmoothed = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(ids, logits)
    assert float(SmoothedSparseCrossentropy(0.0)(ids[:, None], logits)) == pytest.approx(
        float(unsmoothed), rel=1e-6)
    assert float(SmoothedSparseCrossentropy()(ids, logits)) != pytest.approx(float(unsmoothed))
