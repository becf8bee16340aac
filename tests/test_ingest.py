"""Ingest: directory, HTTP and tfds sources, structural and checksum checks, atomic writes."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import refused_port, run_module

from trainer import fashion_mnist
from trainer.atomic import COMMIT_MARKER, is_committed
from trainer.dataset_files import FILE_NAMES
from trainer.fashion_mnist import DatasetError, write_split
from trainer.ingest import SourceUnavailable, ingest, ingest_with_fallback


@pytest.fixture
def source_copy(sample_dir: Path, tmp_path: Path) -> Path:
    """A writable copy of the sample, for corrupting."""
    copy = tmp_path / "source"
    shutil.copytree(sample_dir, copy)
    return copy


@pytest.fixture
def http_server(sample_dir: Path):
    """The sample served on 127.0.0.1 like a mirror; yields the base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(sample_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []


def test_ingest_from_directory_writes_checked_data_and_manifest(sample_dir, tmp_path):
    out = tmp_path / "data"
    manifest = ingest(str(sample_dir), out)

    assert manifest["source"] == str(sample_dir.resolve())
    assert manifest["counts"] == {"train": 500, "test": 100}
    for name in FILE_NAMES:
        expected = hashlib.md5((sample_dir / name).read_bytes()).hexdigest()
        assert manifest["files"][name]["md5"] == expected
    assert json.loads((out / "manifest.json").read_text()) == manifest
    train = fashion_mnist.load_split(out, "train")
    assert train.images.shape == (500, 28, 28, 1) and train.images.dtype == np.uint8
    assert np.bincount(train.labels).tolist() == [50] * 10


def test_second_run_on_the_same_source_is_a_noop(sample_dir, tmp_path, capsys):
    out = tmp_path / "data"
    ingest(str(sample_dir), out)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()

    ingest(str(sample_dir), out)

    assert "nothing to do" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_ingest_from_local_http_server(http_server, sample_dir, tmp_path):
    out = tmp_path / "data"
    manifest = ingest(http_server, out)

    assert manifest["source"] == http_server
    assert manifest["counts"] == {"train": 500, "test": 100}
    assert (out / "t10k-labels-idx1-ubyte.gz").read_bytes() == (
        sample_dir / "t10k-labels-idx1-ubyte.gz").read_bytes()


def test_unreachable_source_uses_the_fallback_with_a_warning(sample_dir, tmp_path, capsys):
    out = tmp_path / "data"
    with refused_port() as port:
        manifest = ingest_with_fallback(f"http://127.0.0.1:{port}/", str(sample_dir), out)

    warning = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    assert len(warning) == 1 and "unreachable" in warning[0] and str(sample_dir) in warning[0]
    assert manifest["source"] == str(sample_dir.resolve())


def test_unreachable_source_without_fallback_fails_and_writes_nothing(tmp_path):
    out = tmp_path / "data"
    with refused_port() as port, pytest.raises(SourceUnavailable, match="unreachable"):
        ingest(f"http://127.0.0.1:{port}/", out)
    assert_nothing_written(out)


def corrupt_gzip(path: Path) -> None:
    path.write_bytes(b"this is not gzip data at all")


def truncate_gzip_stream(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def truncate_idx_body(path: Path) -> None:
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[:-100]))


def set_bad_magic(path: Path) -> None:
    raw = bytearray(gzip.decompress(path.read_bytes()))
    raw[3] = 0x09
    path.write_bytes(gzip.compress(bytes(raw)))


@pytest.mark.parametrize("file_name, damage, message", [
    ("train-images-idx3-ubyte.gz", corrupt_gzip, "not a valid gzip file"),
    ("t10k-images-idx3-ubyte.gz", truncate_gzip_stream, "not a valid gzip file"),
    ("train-images-idx3-ubyte.gz", truncate_idx_body, "truncated"),
    ("t10k-labels-idx1-ubyte.gz", set_bad_magic, "bad IDX magic number"),
])
def test_damaged_file_fails_naming_it_and_writes_nothing(source_copy, tmp_path, file_name,
                                                         damage, message):
    damage(source_copy / file_name)
    out = tmp_path / "data"

    with pytest.raises(DatasetError, match=message) as raised:
        ingest(str(source_copy), out)

    assert str(raised.value).startswith(file_name)
    assert_nothing_written(out)


@pytest.mark.parametrize("images, labels, message", [
    (np.zeros((5, 28, 28)), np.zeros(4), "4 labels but t10k-images-idx3-ubyte.gz holds 5 images"),
    (np.zeros((5, 32, 32)), np.zeros(5), "images are 32x32, expected 28x28"),
    (np.zeros((5, 28, 28)), np.array([0, 1, 2, 3, 10]), "label 10 out of range 0-9"),
])
def test_inconsistent_split_fails(source_copy, tmp_path, images, labels, message):
    write_split(source_copy, "test", images, labels)
    out = tmp_path / "data"
    with pytest.raises(DatasetError, match=message):
        ingest(str(source_copy), out)
    assert_nothing_written(out)


def test_files_claiming_the_full_dataset_must_match_the_official_md5(source_copy, tmp_path):
    rng = np.random.default_rng(0)
    write_split(source_copy, "test", rng.integers(0, 256, (10_000, 28, 28)),
                rng.integers(0, 10, 10_000))
    out = tmp_path / "data"
    with pytest.raises(DatasetError, match="claims the full dataset .* not the official"):
        ingest(str(source_copy), out)
    assert_nothing_written(out)


def test_failed_ingest_keeps_the_earlier_dataset(sample_dir, source_copy, tmp_path):
    out = tmp_path / "data"
    ingest(str(sample_dir), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    corrupt_gzip(source_copy / "train-labels-idx1-ubyte.gz")

    with pytest.raises(DatasetError):
        ingest(str(source_copy), out)

    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_new_source_replaces_the_earlier_dataset(sample_dir, source_copy, tmp_path):
    out = tmp_path / "data"
    ingest(str(sample_dir), out)
    write_split(source_copy, "test", np.zeros((3, 28, 28)), np.array([1, 2, 3]))

    manifest = ingest(str(source_copy), out)

    assert manifest["counts"]["test"] == 3
    assert fashion_mnist.load_split(out, "test").labels.tolist() == [1, 2, 3]


def test_data_without_its_marker_is_not_current_and_is_ingested_again(sample_dir, tmp_path, capsys):
    out = tmp_path / "data"
    ingest(str(sample_dir), out)
    assert is_committed(out)
    (out / COMMIT_MARKER).unlink()  # as a run killed while moving its files in leaves it
    capsys.readouterr()

    ingest(str(sample_dir), out)

    assert "nothing to do" not in capsys.readouterr().out
    assert is_committed(out)


def test_a_directory_left_by_a_killed_commit_is_replaced(sample_dir, tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    shutil.copyfile(sample_dir / FILE_NAMES[0], out / FILE_NAMES[0])  # no manifest, no marker yet

    manifest = ingest(str(sample_dir), out)

    assert manifest["counts"] == {"train": 500, "test": 100} and is_committed(out)


def test_refuses_to_replace_a_directory_that_is_not_a_dataset(sample_dir, tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(Exception, match="refusing to replace it"):
        ingest(str(sample_dir), out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_tfds_source_converts_to_idx_files(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    out = tmp_path / "data"
    with tfds.testing.mock_data(num_examples=12):
        manifest = ingest("tfds", out)

    assert manifest["source"] == "tfds"
    assert manifest["counts"] == {"train": 12, "test": 12}
    test = fashion_mnist.load_split(out, "test")
    assert test.images.shape == (12, 28, 28, 1)


def test_cli_error_is_one_line_and_nonzero(source_copy, tmp_path):
    corrupt_gzip(source_copy / "train-labels-idx1-ubyte.gz")
    result = run_module("trainer.ingest", "--source", source_copy, "--out", tmp_path / "data")

    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "ingest: error: train-labels-idx1-ubyte.gz: not a valid gzip file "
        "(Not a gzipped file (b'th'))"
    ]
