"""Directories that appear whole or not at all: write into a staging sibling, then rename."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def staged_directory(final: Path, replace: bool = True) -> Iterator[Path]:
    """Yields an empty staging directory beside `final` that becomes `final` when the block ends.

    On an exception the staging directory is removed and `final` is untouched. With `replace`, an
    existing `final` is swapped out only once the new one is complete; without it, an existing
    `final` is an error (FileExistsError) and stays as it was. Staging names start with a dot, so
    that readers that list numbered versions or known file names never see them.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.staging-", dir=final.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; pods of other users read it too
    try:
        yield staging
        if final.exists() and not replace:
            raise FileExistsError(f"{final}: already exists")
        _move_into_place(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(staging: Path, final: Path) -> None:
    if not final.exists():
        staging.rename(final)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{final.name}.retired-", dir=final.parent))
    final.rename(retired / final.name)
    try:
        staging.rename(final)
    except OSError:
        (retired / final.name).rename(final)
        raise
    shutil.rmtree(retired)
