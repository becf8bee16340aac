"""The model repository: REPO/<model name>/<version>/, TF Serving's layout (it serves the highest).

Only directories named by a positive integer are versions. A version is published by copying into
a hidden staging directory and renaming it into place, so readers never see a partial version and
a crash at any point leaves the earlier versions as they were.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from trainer.atomic import staged_directory


def versions(repo: Path, model_name: str) -> list[int]:
    """The published versions, ascending; staging and other directories are not versions."""
    model_dir = repo / model_name
    if not model_dir.is_dir():
        return []
    return sorted(
        int(child.name) for child in model_dir.iterdir()
        if child.is_dir() and child.name.isdigit() and int(child.name) > 0
    )


def latest_version(repo: Path, model_name: str) -> int | None:
    published = versions(repo, model_name)
    return published[-1] if published else None


def publish(source: Path, repo: Path, model_name: str,
            add_files: Callable[[Path, int], None] = lambda directory, version: None) -> int:
    """Publishes a copy of `source` as the next version; `add_files` may add files to it first.

    Returns the new version number.
    """
    version = (latest_version(repo, model_name) or 0) + 1
    with staged_directory(repo / model_name / str(version), replace=False) as staging:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        add_files(staging, version)
    return version
