"""Where the tests' pinned files come from, checksum-verified every time.

A CRD is looked for in ../shared/schemas (a sibling checkout of the shared material), then among
the upstream files the repository carries (testdata/upstream/), then in the cache .cache/fixtures/
(ignored by git), and only `download=True` (`make fixtures`) fetches it from
its pinned URL: the tests themselves never touch the network. A download is hashed while it is
written to a temporary file in the cache and moved into place only when its SHA-256 matches, so the
cache never holds a wrong or partial file.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.request
from pathlib import Path

from testdata.pins import CRD_PINS, SAMPLE_SHA256, Pin

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_SCHEMAS_DIR = REPO_ROOT.parent / "shared" / "schemas"
COMMITTED_DIR = REPO_ROOT / "testdata" / "upstream"  # pinned files ../shared does not carry
CACHE_DIR = REPO_ROOT / ".cache" / "fixtures"
SAMPLE_DIR = REPO_ROOT / "datasets" / "fashion-mnist-sample"
DOWNLOAD_TIMEOUT_S = 60.0  # per socket operation; the largest CRD is 3.2 MB
CHUNK_BYTES = 1 << 20
GET_THEM = "run `make fixtures` to download them (pinned URLs, SHA-256 checked)"


class FixtureError(Exception):
    """A pinned file exists but is wrong, or could not be downloaded: never skipped."""


class FixtureMissing(FixtureError):
    """A pinned file is nowhere on this machine; the message says what and how to get it."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _checked(path: Path, expected: str) -> Path:
    actual = sha256_of(path)
    if actual != expected:
        raise FixtureError(f"{path}: SHA-256 {actual} is not the pinned {expected} "
                           "(a changed or partial copy: remove it and get it again)")
    return path


def pin_for(name: str) -> Pin:
    try:
        return CRD_PINS[name]
    except KeyError:
        raise FixtureError(f"no pinned upstream file named {name!r} (have: {', '.join(sorted(CRD_PINS))})"
                           ) from None


def download(pin: Pin, cache_dir: Path, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Fetches `pin.url` into cache_dir/pin.name; on any failure nothing is left behind."""
    target = cache_dir / pin.name
    target.parent.mkdir(parents=True, exist_ok=True)
    # The temporary file sits next to the target so that the final move is an atomic rename.
    fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    temp = Path(temp_name)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(pin.url, timeout=timeout) as response:
            while chunk := response.read(CHUNK_BYTES):
                size += len(chunk)
                if size > pin.size:  # a wrong URL can serve anything: stop reading at the pinned size
                    break
                digest.update(chunk)
                out.write(chunk)
        if size != pin.size or digest.hexdigest() != pin.sha256:
            got = f"{size} B, SHA-256 {digest.hexdigest()}" if size <= pin.size else f"over {pin.size} B"
            raise FixtureError(f"{pin.url}: downloaded {got}, pinned {pin.size} B, SHA-256 {pin.sha256}; "
                               "nothing was cached")
        os.replace(temp, target)
        return target
    except (OSError, http.client.HTTPException) as error:  # URLError and timeouts are OSErrors
        raise FixtureError(f"{pin.url}: download failed ({error}); nothing was cached") from None
    finally:
        temp.unlink(missing_ok=True)


def resolve(pin: Pin, *, shared_dir: Path = SHARED_SCHEMAS_DIR, cache_dir: Path = CACHE_DIR,
            committed_dir: Path = COMMITTED_DIR, download_missing: bool = False) -> Path:
    """The verified local copy of `pin`: ../shared/schemas, else the repository's copy, else the cache,
    else (only when asked) a download into the cache. Raises FixtureMissing when it is nowhere and no
    download is asked."""
    for candidate in (shared_dir / pin.name, committed_dir / pin.name, cache_dir / pin.name):
        if candidate.is_file():
            return _checked(candidate, pin.sha256)
    if download_missing:
        return download(pin, cache_dir)
    raise FixtureMissing(f"upstream CRD {pin.name} is in none of {shared_dir}, {committed_dir} and "
                         f"{cache_dir}; {GET_THEM}")


def sample_dir(directory: Path = SAMPLE_DIR) -> Path:
    """The in-repo Fashion-MNIST sample, each file verified against its pin."""
    missing = [name for name in SAMPLE_SHA256 if not (directory / name).is_file()]
    if missing:  # said before any checksum: a missing file is a skip, a changed one an error
        raise FixtureMissing(f"the Fashion-MNIST sample file(s) {', '.join(missing)} are missing from "
                             f"{directory}; they are part of the repository: `git checkout -- datasets/`")
    for name, sha256 in SAMPLE_SHA256.items():
        _checked(directory / name, sha256)
    return directory
