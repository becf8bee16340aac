"""tf.data input pipelines: a held-out validation split, augmentation, and per-worker sharding."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.fashion_mnist import IMAGE_SIZE, NUM_CLASSES, Split

VALIDATION_FRACTION = 0.1
SPLIT_SEED = 20_240_601  # fixed, so every worker and every rerun holds out the same images
SHUFFLE_SEED = 7  # the same on every worker, so that their DATA shards are disjoint
SHIFT_PIXELS = 2


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


def augment(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Mirrors and shifts each image of a batch a little: clothes stay clothes, a small set goes
    further. Vectorised over the batch, so it costs next to nothing beside a training step."""
    images = tf.image.random_flip_left_right(images)
    padded = tf.pad(images, [[0, 0], [SHIFT_PIXELS, SHIFT_PIXELS], [SHIFT_PIXELS, SHIFT_PIXELS], [0, 0]])
    offsets = tf.random.uniform([2, tf.shape(images)[0], 1], 0, 2 * SHIFT_PIXELS + 1, tf.int32)
    window = tf.range(IMAGE_SIZE)[tf.newaxis, :]
    rows = tf.gather(padded, offsets[0] + window, axis=1, batch_dims=1)
    return tf.gather(rows, offsets[1] + window, axis=2, batch_dims=1), labels


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
    return (
        tf.data.Dataset.range(len(split))
        .shuffle(len(split), seed=shuffle_seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(global_batch_size, drop_remainder=True)
        .map(lambda index: (tf.gather(images, index), tf.gather(labels, index)))
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )
