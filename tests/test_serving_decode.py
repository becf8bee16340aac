"""Each image is decoded once, in the batch worker: model-sized grey PNGs by PIL, to exactly the
pixels of the export's own decode; every other image is left to the graph."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis.extra.numpy import arrays
from kserve.errors import InvalidInput
from PIL import Image
from test_serving_fuzz import png_declaring

from serving.inputs import MAX_IMAGE_PIXELS, Batch, decoded
from trainer.export import decode_image


def encoded(image: Image.Image, image_format: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


@settings(max_examples=30, deadline=None)
@given(arrays(np.uint8, (28, 28)))
def test_a_model_sized_grey_png_decodes_to_the_graphs_own_pixels(pixels):
    data = encoded(Image.fromarray(pixels))
    result = decoded(Batch(encoded=[data, data]))
    assert result.encoded is None and result.pixels.shape == (2, 28, 28, 1)
    assert result.pixels.dtype == np.float32
    np.testing.assert_array_equal(result.pixels[0], decode_image(tf.constant(data)).numpy())


GREY = np.arange(28 * 28, dtype=np.uint8).reshape(28, 28)


@pytest.mark.parametrize("data", [
    encoded(Image.fromarray(GREY), "JPEG"),  # lossy: PIL's and the graph's decoders may differ
    encoded(Image.fromarray(GREY).convert("RGB")),
    encoded(Image.fromarray(GREY[:27])),  # the graph resizes it
    encoded(Image.fromarray(GREY).convert("1")),
    encoded(Image.fromarray(GREY).convert("P")),
    encoded(Image.fromarray(GREY.astype(np.uint16) * 64)),  # 16 bits a pixel
], ids=["jpeg", "rgb", "27x28", "1-bit", "palette", "16-bit"])
def test_any_other_image_is_left_to_the_graph_decoded_once_there(data):
    batch = Batch(encoded=[data, encoded(Image.fromarray(GREY))])
    assert decoded(batch) is batch  # a request's images go to the model together, as sent


def test_image_checks_run_in_the_worker_and_name_the_image():
    with pytest.raises(InvalidInput, match=f"element 1: .*over the limit of {MAX_IMAGE_PIXELS}"):
        decoded(Batch(encoded=[encoded(Image.fromarray(GREY)), png_declaring(5000, 5000)], item="element"))
    with pytest.raises(InvalidInput, match="instance 0: not a readable PNG or JPEG image"):
        decoded(Batch(encoded=[encoded(Image.fromarray(GREY))[:60]]))
    with pytest.raises(InvalidInput, match="instance 0: GIF images are not accepted"):
        decoded(Batch(encoded=[encoded(Image.fromarray(GREY), "GIF")]))
