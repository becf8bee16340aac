"""Re-cuts this holdout set from the Fashion-MNIST authors' sprite and checks it byte for byte.

Why: so that anyone can confirm the 300 images are real dataset images and none is in the sample.

    git -C <fashion-mnist clone> show HEAD:doc/img/fashion-mnist-sprite.png > sprite.png
    python datasets/fashion-mnist-holdout/cut.py --sprite sprite.png [--out DIR]

The sprite is a 30x30 grid of 28x28 grey images (RGBA, the three colour channels equal), three rows
per class in the dataset's class order. Every tile whose pixels are not exactly one of the sample's
600 images is kept, in row-major order; they are written as the test split in the official format.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
from PIL import Image

from trainer.dataset_files import SPLIT_FILES
from trainer.fashion_mnist import IMAGE_SIZE, NUM_CLASSES, read_split, write_split

HERE = Path(__file__).resolve().parent
SAMPLE_DIR = HERE.parent / "fashion-mnist-sample"
GRID = 30  # tiles per side
ROWS_PER_CLASS = 3
SPRITE_SHA256 = "a7de0a151f8c68e6e96f157a018ac290d1f6b0e7845892c3d7d85cb64961c3cb"
HOLDOUT_PER_CLASS = 30  # 90 tiles per class in the sprite, 60 of them in the sample
FILE_SHA256 = {
    "t10k-images-idx3-ubyte.gz": "44156f9a2b6bb2c8633dff5c2cf0e9d175d05e9b626a457af5b8c775aa97b832",
    "t10k-labels-idx1-ubyte.gz": "73711e7a90e4d312db5dd10891a19a5c1e64aa4e2afcac60e1320ca2605b1401",
}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sprite_tiles(sprite: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every tile of the sprite, row-major, and its class (its row // ROWS_PER_CLASS)."""
    if (digest := sha256_of(sprite)) != SPRITE_SHA256:
        raise SystemExit(f"cut: {sprite}: SHA-256 {digest}, not the authors' sprite {SPRITE_SHA256}")
    grey = np.asarray(Image.open(sprite))[..., 0]
    tiles = (grey.reshape(GRID, IMAGE_SIZE, GRID, IMAGE_SIZE).swapaxes(1, 2)
             .reshape(-1, IMAGE_SIZE, IMAGE_SIZE))
    labels = np.repeat(np.arange(GRID) // ROWS_PER_CLASS, GRID).astype(np.uint8)
    return tiles, labels


def sample_images() -> set[bytes]:
    return {image.tobytes() for split in ("train", "test")
            for image in read_split(SAMPLE_DIR, split).images[..., 0]}


def cut(sprite: Path, out: Path) -> None:
    tiles, labels = sprite_tiles(sprite)
    in_sample = sample_images()
    keep = np.array([tile.tobytes() not in in_sample for tile in tiles])
    counts = np.bincount(labels[keep], minlength=NUM_CLASSES).tolist()
    if counts != [HOLDOUT_PER_CLASS] * NUM_CLASSES:
        raise SystemExit(f"cut: expected {HOLDOUT_PER_CLASS} images per class, got {counts}")
    out.mkdir(parents=True, exist_ok=True)
    write_split(out, "test", tiles[keep], labels[keep])
    for name in SPLIT_FILES["test"]:
        if (digest := sha256_of(out / name)) != FILE_SHA256[name]:
            raise SystemExit(f"cut: {out / name}: SHA-256 {digest}, expected {FILE_SHA256[name]}")
    print(f"cut: {keep.sum()} images ({HOLDOUT_PER_CLASS} per class) in {out}, checksums match")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sprite", type=Path, required=True, help="doc/img/fashion-mnist-sprite.png")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    cut(args.sprite, args.out)


if __name__ == "__main__":
    main()
