"""Fashion-MNIST on disk: the four official gzip-compressed IDX files, checked and loaded.

The IDX format (http://yann.lecun.com/exdb/mnist/): a big-endian header of a magic number and one
count per dimension, then unsigned bytes. Everything here is NumPy; TensorFlow is not needed.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import struct
import zlib
from pathlib import Path

import numpy as np

from trainer.dataset_files import FULL_COUNTS, MANIFEST_NAME, OFFICIAL_MD5, SPLIT_FILES

CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
NUM_CLASSES = len(CLASS_NAMES)
IMAGE_SIZE = 28
MAX_PIXEL_VALUE = 255  # pixels are unsigned bytes

IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dimension



class DatasetError(ValueError):
    """A dataset file is missing, corrupt, truncated or inconsistent; the message names the file."""


@dataclasses.dataclass(frozen=True)
class Split:
    images: np.ndarray  # uint8 [N, 28, 28, 1], pixel values 0-255
    labels: np.ndarray  # uint8 [N], class ids 0-9

    def __len__(self) -> int:
        return len(self.labels)


def md5_of(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _decompress(path: Path) -> bytes:
    try:
        with gzip.open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        raise DatasetError(f"{path.name}: file is missing") from None
    except (OSError, EOFError, zlib.error) as error:
        raise DatasetError(f"{path.name}: not a valid gzip file ({error})") from None


def _parse_idx(path: Path, magic: int, dims: int) -> np.ndarray:
    raw = _decompress(path)
    header_size = 4 * (1 + dims)
    if len(raw) < header_size:
        raise DatasetError(f"{path.name}: truncated: {len(raw)} bytes, shorter than the IDX header")
    found_magic, *shape = struct.unpack(f">{1 + dims}I", raw[:header_size])
    if found_magic != magic:
        raise DatasetError(
            f"{path.name}: bad IDX magic number 0x{found_magic:08x}, expected 0x{magic:08x}"
        )
    expected = int(np.prod(shape))
    body = len(raw) - header_size
    if body != expected:
        problem = "truncated" if body < expected else "trailing data"
        raise DatasetError(
            f"{path.name}: {problem}: header declares shape {tuple(shape)} "
            f"({expected} bytes) but the file holds {body} bytes"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape(shape)


def write_idx_gz(path: Path, magic: int, array: np.ndarray) -> None:
    header = struct.pack(f">{1 + array.ndim}I", magic, *array.shape)
    # mtime=0 makes the bytes, and so the manifest checksums, the same on every run.
    with gzip.GzipFile(path, "wb", mtime=0) as file:
        file.write(header + array.astype(np.uint8).tobytes())


def write_split(directory: Path, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Writes a split in the official format; images are [N, 28, 28] or [N, 28, 28, 1]."""
    images_name, labels_name = SPLIT_FILES[split]
    write_idx_gz(directory / images_name, IMAGES_MAGIC, images.reshape(images.shape[:3]))
    write_idx_gz(directory / labels_name, LABELS_MAGIC, labels)


def read_split(directory: Path, split: str) -> Split:
    """Reads and structurally checks one split; raises DatasetError naming the bad file."""
    images_name, labels_name = SPLIT_FILES[split]
    images = _parse_idx(directory / images_name, IMAGES_MAGIC, dims=3)
    labels = _parse_idx(directory / labels_name, LABELS_MAGIC, dims=1)
    if images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise DatasetError(
            f"{images_name}: images are {images.shape[1]}x{images.shape[2]}, "
            f"expected {IMAGE_SIZE}x{IMAGE_SIZE}"
        )
    if len(images) != len(labels):
        raise DatasetError(
            f"{labels_name}: {len(labels)} labels but {images_name} holds {len(images)} images"
        )
    if len(labels) == 0:
        raise DatasetError(f"{labels_name}: holds no items")
    if labels.max() >= NUM_CLASSES:
        raise DatasetError(
            f"{labels_name}: label {int(labels.max())} out of range 0-{NUM_CLASSES - 1}"
        )
    return Split(images=images[..., np.newaxis], labels=labels)


def verify_official_checksums(directory: Path, split: str, count: int) -> None:
    """Files that claim to be the full dataset must be byte-identical to the official ones."""
    if count != FULL_COUNTS[split]:
        return
    for name in SPLIT_FILES[split]:
        actual = md5_of(directory / name)
        if actual != OFFICIAL_MD5[name]:
            raise DatasetError(
                f"{name}: claims the full dataset ({count} items) but its MD5 {actual} "
                f"is not the official {OFFICIAL_MD5[name]}"
            )


def read_manifest(data_dir: Path) -> dict:
    path = data_dir / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(
            f"{data_dir}: no dataset here ({MANIFEST_NAME} missing); "
            "run `python -m trainer.ingest --out DATA_DIR` first"
        ) from None
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path}: not valid JSON ({error})") from None


def load_split(data_dir: Path, split: str) -> Split:
    """Loads a split of an ingested dataset (one that has a manifest)."""
    read_manifest(data_dir)
    return read_split(data_dir, split)
