"""The input pipeline: validation hold-out, augmentation, batching."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer import data
from trainer.fashion_mnist import Split


def distinct_images(count: int) -> Split:
    rng = np.random.default_rng(0)
    return Split(rng.integers(1, 256, (count, 28, 28, 1), dtype=np.uint8),
                 np.arange(count, dtype=np.uint8) % 10)


def is_flip_or_shift_of(image: np.ndarray, source: np.ndarray) -> bool:
    shift = data.SHIFT_PIXELS
    for candidate in (source, source[:, ::-1]):
        padded = np.pad(candidate, ((shift, shift), (shift, shift), (0, 0)))
        for dy in range(2 * shift + 1):
            for dx in range(2 * shift + 1):
                if np.array_equal(padded[dy:dy + 28, dx:dx + 28], image):
                    return True
    return False


def test_validation_holds_out_a_tenth_of_each_class_the_same_every_time():
    train = distinct_images(500)
    kept, held_out = data.split_validation(train)
    again_kept, again_held_out = data.split_validation(train)

    assert len(kept) == 450 and len(held_out) == 50
    assert np.bincount(held_out.labels).tolist() == [5] * 10
    np.testing.assert_array_equal(held_out.images, again_held_out.images)
    kept_rows = {image.tobytes() for image in kept.images}
    assert not any(image.tobytes() in kept_rows for image in held_out.images)


def test_batches_are_flipped_or_shifted_images_with_their_own_labels(monkeypatch):
    monkeypatch.setattr(data, "ZOOM_FRACTION", 0.0)  # zoom is checked on its own below
    split = distinct_images(10)  # one image per label
    sources = dict(zip(split.labels.tolist(), split.images))

    images, labels = next(iter(data.training_dataset(split, global_batch_size=8)))

    assert images.shape == (8, 28, 28, 1) and images.dtype == np.float32
    assert len(set(labels.numpy().tolist())) == 8  # shuffled without repeats within an epoch
    assert all(is_flip_or_shift_of(image.astype(np.uint8), sources[int(label)])
               for image, label in zip(images.numpy(), labels.numpy()))


def test_augmentation_changes_images_but_keeps_them_recognisable():
    split = distinct_images(64)
    images, labels = next(iter(data.training_dataset(split, global_batch_size=64)))
    originals = split.images[labels.numpy()].astype(np.float32)
    changed = [not np.array_equal(a, b) for a, b in zip(images.numpy(), originals)]
    assert sum(changed) > 60  # every draw zooms by some factor; 1 in 50 is neither flipped nor shifted
    assert images.numpy().min() >= 0 and images.numpy().max() <= 255


def test_zoom_scales_each_image_about_its_centre_within_the_fraction():
    images = np.zeros((64, 28, 28, 1), np.uint8)
    images[:, 10:18, 10:18] = 255  # an 8x8 square in the middle of each image

    np.testing.assert_allclose(data.zoom(images, 0.0).numpy(), images, atol=1e-3)  # identity
    zoomed = data.zoom(images, 0.25).numpy()[..., 0]

    heights = (zoomed.max(axis=2) > 127).sum(axis=1)
    widths = (zoomed.max(axis=1) > 127).sum(axis=1)
    assert heights.min() >= 6 and heights.max() <= 11  # 8 / 1.25 to 8 / 0.75 pixels
    assert heights.min() < 8 < heights.max() and not np.array_equal(heights, widths)
    assert zoomed[:, 0, :].max() == 0 and zoomed[:, :, 0].max() == 0  # zoomed out: a black border
    rows = np.arange(28)[np.newaxis, :]
    centres = (zoomed.sum(axis=2) * rows).sum(axis=1) / zoomed.sum(axis=(1, 2))
    np.testing.assert_allclose(centres, 13.5, atol=0.5)


def test_the_training_input_runs_without_autotuning_so_nothing_outlives_model_fit():
    """tf.data's autotuning thread held the end of model.fit for up to a minute
    (docs/results/demo-time.md)."""
    options = data.training_dataset(distinct_images(10), global_batch_size=8).options()
    assert options.autotune.enabled is False
    assert options.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.DATA
