"""Directories that readers trust only once committed: every file written, then a marker file last.

Built for object storage mounted as a file system (a GCS bucket through the GCS FUSE CSI driver),
where renaming a non-empty directory is refused (the driver's `rename-dir-limit` is 0 by default)
and a file becomes an object only once it is closed. So nothing here renames a directory. A
directory is complete once its COMMIT_MARKER file exists; the marker is written after every other
file in it was closed, and readers ignore a directory without it. Renaming one file is allowed
there (GCS FUSE copies the object, then deletes the old one), and is how the marker, and a staged
directory's files, arrive whole.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

COMMIT_MARKER = "COMMITTED"
_MARKER_TEMPORARY = f".{COMMIT_MARKER}.tmp"
_MARKER_NAMES = (COMMIT_MARKER, _MARKER_TEMPORARY)


def is_committed(directory: Path) -> bool:
    """True once `directory` was written in full (its marker exists)."""
    return (directory / COMMIT_MARKER).is_file()


def write_whole(path: Path, text: str) -> None:
    """Writes `path` beside itself (`.<name>.tmp`) and renames it over (a file rename, which GCS FUSE
    allows), so that a reader never sees it half-written."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def commit(directory: Path, info: dict | None = None) -> None:
    """Marks `directory` complete. Call it only once every other file in it is closed.

    The marker holds a small JSON record (`committed_at`, UTC, and `info`), written whole.
    """
    record = {"committed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(), **(info or {})}
    write_whole(directory / COMMIT_MARKER, json.dumps(record) + "\n")


def uncommit(directory: Path) -> None:
    """Withdraws the marker: from now until the next `commit`, readers ignore `directory`."""
    (directory / COMMIT_MARKER).unlink(missing_ok=True)


def copy_contents(source: Path, destination: Path) -> None:
    """Copies the files under `source` into `destination`, leaving out `source`'s own marker (a copy
    of a committed directory is committed by its writer, once the copy is complete)."""
    shutil.copytree(source, destination, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(*_MARKER_NAMES))


@contextlib.contextmanager
def staged_directory(final: Path, replace: bool = True, info: dict | None = None) -> Iterator[Path]:
    """Yields an empty staging directory beside `final`, whose files become `final`'s, committed,
    when the block ends.

    On an exception the staging directory is removed and `final` is untouched, so a failed run
    leaves the earlier contents (committed or not) as they were. At the end, with `replace`, an
    existing `final` is first uncommitted, then emptied, then the staged files are moved in one by
    one (file renames; the directories are made anew) and the marker is written last: a crash in
    that short window leaves `final` uncommitted, which readers ignore and the next run replaces.
    Without `replace`, an existing `final` is an error (FileExistsError) and stays as it was.
    Staging names start with a dot, so that readers that list numbered versions or known file names
    never see them; one left by a killed process is garbage, never read.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.staging-", dir=final.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; pods of other users read it too
    try:
        yield staging
        if final.exists() and not replace:
            raise FileExistsError(f"{final}: already exists")
        _move_into_place(staging, final, info)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(staging: Path, final: Path, info: dict | None) -> None:
    if final.is_dir():
        uncommit(final)
        empty_directory(final)
    else:
        final.mkdir()
    move_files(staging, final)
    commit(final, info)


def empty_directory(directory: Path) -> None:
    """Removes everything inside `directory`, which stays."""
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def move_files(source: Path, destination: Path) -> None:
    """Moves every file under `source` to the same place under `destination` by renaming files
    only: directories are created, never renamed. A marker in `source` is not moved."""
    for root, directories, files in os.walk(source):
        relative = Path(root).relative_to(source)
        (destination / relative).mkdir(exist_ok=True)
        # os.walk lists a symbolic link to a directory among the directories and does not enter it.
        links = [name for name in directories if (Path(root) / name).is_symlink()]
        for name in [*files, *links]:
            if relative == Path(".") and name in _MARKER_NAMES:
                continue
            os.replace(Path(root) / name, destination / relative / name)
