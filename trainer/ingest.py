"""Ingest Fashion-MNIST into a data directory, checked, with a manifest.

    python -m trainer.ingest --source SRC --out DATA_DIR [--fallback-source SRC]

SRC is an http(s) base URL (default: the official mirror), a local directory holding the four
official `.gz` files, or `tfds` (tensorflow-datasets `fashion_mnist`, its data_dir under DATA_DIR).
The files are fetched into a staging directory beside DATA_DIR and checked, so a failure leaves
DATA_DIR as it was; then they are moved into DATA_DIR file by file and the commit marker
(trainer.atomic.COMMIT_MARKER) is written last. No directory is renamed, so DATA_DIR may be on
object storage mounted with GCS FUSE. The manifest (source, counts, checksums) is the memoization
key of the pipeline; a second run on the same source finds it, committed, and does nothing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

import numpy as np

from common import cli
from trainer.atomic import COMMIT_MARKER, is_committed, staged_directory
from trainer.dataset_files import FILE_NAMES, MANIFEST_NAME, OFFICIAL_MIRROR, SPLIT_FILES
from trainer.fashion_mnist import (
    DatasetError,
    md5_of,
    read_split,
    verify_official_checksums,
    write_split,
)

TFDS_SOURCE = "tfds"
DOWNLOAD_TIMEOUT_SECONDS = 30
TFDS_BATCH_SIZE = 10_000
TFDS_DIR = "tfds"  # tensorflow-datasets' data_dir, inside the data directory
# What ingest writes into DATA_DIR: a directory holding nothing else is one of ours to replace.
INGEST_NAMES = frozenset({*FILE_NAMES, MANIFEST_NAME, COMMIT_MARKER, TFDS_DIR})


class SourceUnavailable(Exception):
    """The source could not be reached (network down, host unknown, HTTP error, no such directory)."""


def log(message: str) -> None:
    print(f"ingest: {message}", flush=True)


def normalize_source(source: str) -> str:
    """One spelling per source, so that the manifest comparison on a re-run is exact."""
    if source == TFDS_SOURCE:
        return source
    if source.startswith(("http://", "https://")):
        return source if source.endswith("/") else source + "/"
    return str(Path(source).expanduser().resolve())


# --- fetching: each writes the four official file names into `staging` ------------------------


def fetch_http(base_url: str, staging: Path) -> None:
    for name in FILE_NAMES:
        url = base_url + name
        log(f"downloading {url}")
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response, open(
                staging / name, "wb"
            ) as file:
                shutil.copyfileobj(response, file)
        except http.client.IncompleteRead as error:
            raise DatasetError(f"{name}: truncated download ({error})") from None
        except (urllib.error.URLError, socket.timeout, ConnectionError) as error:
            reason = getattr(error, "reason", error)
            raise SourceUnavailable(f"{url}: unreachable ({reason})") from None


def fetch_directory(directory: Path, staging: Path) -> None:
    if not directory.is_dir():
        raise SourceUnavailable(f"{directory}: no such directory")
    for name in FILE_NAMES:
        if not (directory / name).is_file():
            raise DatasetError(f"{name}: file is missing from {directory}")
        shutil.copyfile(directory / name, staging / name)


def fetch_tfds(staging: Path) -> None:
    # Imported here: tensorflow-datasets pulls in TensorFlow, which the file sources do not need.
    import tensorflow_datasets as tfds

    log("loading fashion_mnist with tensorflow-datasets")
    for split, tfds_split in (("train", "train"), ("test", "test")):
        try:
            dataset = tfds.load("fashion_mnist", split=tfds_split, data_dir=str(staging / TFDS_DIR))
            batches = list(tfds.as_numpy(dataset.batch(TFDS_BATCH_SIZE)))
        except Exception as error:  # tfds wraps download failures in many types
            raise SourceUnavailable(f"tensorflow-datasets fashion_mnist: {error}") from None
        write_split(staging, split,
                    np.concatenate([batch["image"] for batch in batches]),
                    np.concatenate([batch["label"] for batch in batches]))


def fetch(source: str, staging: Path) -> None:
    if source == TFDS_SOURCE:
        fetch_tfds(staging)
    elif source.startswith(("http://", "https://")):
        fetch_http(source, staging)
    else:
        fetch_directory(Path(source), staging)


# --- checking, the manifest, and the commit ----------------------------------------------------


def build_manifest(source: str, directory: Path) -> dict:
    """Checks every file (raising DatasetError) and describes what was ingested."""
    counts = {}
    for split in SPLIT_FILES:
        counts[split] = len(read_split(directory, split))
        # tensorflow-datasets verifies its own downloads; our re-encoded .gz bytes differ from
        # the official ones, so the official MD5s apply to the other sources only.
        if source != TFDS_SOURCE:
            verify_official_checksums(directory, split, counts[split])
    return {
        "source": source,
        "counts": counts,
        "files": {name: {"md5": md5_of(directory / name)} for name in FILE_NAMES},
    }


def is_current(out: Path, source: str) -> dict | None:
    """The manifest of `out` when it already holds intact, committed data from `source`, else None."""
    if not is_committed(out):
        return None
    try:
        manifest = json.loads((out / MANIFEST_NAME).read_text())
        if manifest["source"] != source:
            return None
        for name, entry in manifest["files"].items():
            if md5_of(out / name) != entry["md5"]:
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_replaceable(out: Path) -> None:
    """`out` may be replaced when it is missing, empty, or a data directory of ours: one with a
    manifest, or holding only names ingest writes (what a run killed while committing leaves)."""
    if out.exists() and not out.is_dir():
        raise cli.UsageError(f"{out}: exists and is not a directory")
    if not out.is_dir() or (out / MANIFEST_NAME).exists():
        return
    if any(child.name not in INGEST_NAMES for child in out.iterdir()):
        raise cli.UsageError(
            f"{out}: exists, is not empty and holds no {MANIFEST_NAME}; "
            "refusing to replace it (choose another --out)"
        )


def ingest(source: str, out: Path) -> dict:
    """Ingests `source` into `out` unless it is already there; returns the manifest."""
    source = normalize_source(source)
    current = is_current(out, source)
    if current is not None:
        log(f"{out} already holds {describe(current)}; nothing to do")
        return current
    check_replaceable(out)
    with staged_directory(out) as staging:
        fetch(source, staging)
        manifest = build_manifest(source, staging)
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out}: {describe(manifest)}")
    return manifest


def ingest_with_fallback(source: str, fallback: str | None, out: Path) -> dict:
    try:
        return ingest(source, out)
    except SourceUnavailable as error:
        if fallback is None:
            raise
        print(f"ingest: WARNING: {error}; using the fallback {fallback}", file=sys.stderr, flush=True)
        return ingest(fallback, out)


def describe(manifest: dict) -> str:
    counts = manifest["counts"]
    return f"{counts['train']} train + {counts['test']} test images from {manifest['source']}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="ingest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=OFFICIAL_MIRROR,
                        help="http(s) base URL, directory of the four .gz files, or 'tfds' "
                        "(default: the official mirror)")
    parser.add_argument("--out", type=Path, required=True, help="data directory to write")
    parser.add_argument("--fallback-source",
                        help="used, with a warning, when --source cannot be reached")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    ingest_with_fallback(args.source, args.fallback_source, args.out)


if __name__ == "__main__":
    cli.run("ingest", main, expected=(DatasetError, SourceUnavailable))
