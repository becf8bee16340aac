"""tf.data input pipelines: a held-out validation split, augmentation, and per-worker sharding."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.fashion_mnist import NUM_CLASSES, Split

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


def augment(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Mirror images and shift them a little: clothes stay clothes, and a small set goes further."""
    image = tf.image.random_flip_left_right(image)
    padded = tf.pad(image, [[SHIFT_PIXELS, SHIFT_PIXELS], [SHIFT_PIXELS, SHIFT_PIXELS], [0, 0]])
    return tf.image.random_crop(padded, tf.shape(image)), label


def training_dataset(split: Split, global_batch_size: int) -> tf.data.Dataset:
    """Endless shuffled, augmented batches of `global_batch_size`; each worker keeps its shard.

    Repeating forever and stopping at a fixed steps_per_epoch gives every worker the same number
    of steps, which synchronous all-reduce needs.
    """
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return (
        tf.data.Dataset.from_tensor_slices((split.images, split.labels))
        .cache()
        .shuffle(len(split), seed=SHUFFLE_SEED, reshuffle_each_iteration=True)
        .repeat()
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(global_batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )
