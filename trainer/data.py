"""tf.data input pipelines: a held-out validation split, augmentation, and per-worker sharding."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.fashion_mnist import IMAGE_SIZE, NUM_CLASSES, Split

VALIDATION_FRACTION = 0.1
SPLIT_SEED = 20_240_601  # fixed, so every worker and every rerun holds out the same images
SHUFFLE_SEED = 7  # the same on every worker, so that their DATA shards are disjoint
SHIFT_PIXELS = 2
# Each image's height and width scaled independently by up to this fraction either way (a garment
# photographed a little closer or wider). Kept, with label smoothing, because it raised every
# variant's validation accuracy (docs/results/model-quality.md). Zoomed out, the border is black, the
# images' background.
ZOOM_FRACTION = 0.1
# Fixed input parallelism, tf.data's autotuning off: autotuning held the end of model.fit (the
# iterator's teardown) at random, and slowed the epochs of trainings sharing the cores. Stalls still
# come from tf.distribute's own per-device pipelines, which these options do not reach
# (docs/results/demo-time.md). Two batches augmented at once and two ready keep a training step fed:
# augmenting a batch is cheap next to a step.
AUGMENT_PARALLELISM = 2
PREFETCH_BATCHES = 2


def split_validation(train: Split, fraction: float = VALIDATION_FRACTION) -> tuple[Split, Split]:
    """Holds out `fraction` of each class, the same images on every call."""
    rng = np.random.default_rng(SPLIT_SEED)
    held_out = []
    for class_id in range(NUM_CLASSES):
        members = rng.permutation(np.flatnonzero(train.labels == class_id))
        held_out.extend(members[: round(fraction * len(members))])
    mask = np.zeros(len(train), dtype=bool)
    mask[held_out] = True
    return (Split(train.images[~mask], train.labels[~mask]),
            Split(train.images[mask], train.labels[mask]))


def zoom(images: tf.Tensor, fraction: float) -> tf.Tensor:
    """Scales each image's height and width by a random factor in [1 - fraction, 1 + fraction]
    about its centre (bilinear; zoomed out, the border is 0), in one tf.image call for the batch."""
    count = tf.shape(images)[0]
    half = 0.5 * tf.random.uniform([count, 2], 1.0 - fraction, 1.0 + fraction)
    boxes = tf.concat([0.5 - half, 0.5 + half], axis=1)  # [y1, x1, y2, x2], normalised
    return tf.image.crop_and_resize(tf.cast(images, tf.float32), boxes, tf.range(count),
                                    [IMAGE_SIZE, IMAGE_SIZE], extrapolation_value=0.0)


def shift(images: tf.Tensor) -> tf.Tensor:
    """Moves each image by up to SHIFT_PIXELS in each direction (whole pixels, 0 fills)."""
    padded = tf.pad(images, [[0, 0], [SHIFT_PIXELS, SHIFT_PIXELS], [SHIFT_PIXELS, SHIFT_PIXELS], [0, 0]])
    offsets = tf.random.uniform([2, tf.shape(images)[0], 1], 0, 2 * SHIFT_PIXELS + 1, tf.int32)
    window = tf.range(IMAGE_SIZE)[tf.newaxis, :]
    rows = tf.gather(padded, offsets[0] + window, axis=1, batch_dims=1)
    return tf.gather(rows, offsets[1] + window, axis=2, batch_dims=1)


def augment(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Mirrors, zooms and shifts each image of a batch a little: clothes stay clothes, a small set
    goes further. Vectorised over the batch, so it costs next to nothing beside a training step.
    Returns float32 pixels, 0-255, as the models take them."""
    return shift(zoom(tf.image.random_flip_left_right(images), ZOOM_FRACTION)), labels


def training_dataset(split: Split, global_batch_size: int,
                     shuffle_seed: int | tf.Tensor = SHUFFLE_SEED) -> tf.data.Dataset:
    """Endless shuffled, augmented batches of `global_batch_size`; each worker keeps its shard.

    Shuffling and batching indices, then gathering whole batches, keeps per-image work out of
    tf.data. Repeating forever and stopping at a fixed steps_per_epoch gives every worker the
    same number of steps, which synchronous all-reduce needs. `shuffle_seed` may be a tensor
    computed where the dataset is built (parameter-server workers each build their own).
    """
    images, labels = tf.constant(split.images), tf.constant(split.labels)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.autotune.enabled = False
    return (
        tf.data.Dataset.range(len(split))
        .shuffle(len(split), seed=shuffle_seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(global_batch_size, drop_remainder=True)
        .map(lambda index: (tf.gather(images, index), tf.gather(labels, index)))
        .map(augment, num_parallel_calls=AUGMENT_PARALLELISM)
        .prefetch(PREFETCH_BATCHES)
        .with_options(options)
    )
