"""A storage that refuses directory renames, as GCS FUSE does by default: for this process (a
context manager) and for subprocesses (an environment that loads gcsfuse_like/sitecustomize.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterator

SITE_DIR = Path(__file__).resolve().parent / "gcsfuse_like"


def subprocess_env() -> dict[str, str]:
    """Extra environment for a child Python process in which directory renames fail."""
    paths = [str(SITE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def _load_hook():
    """The hook of sitecustomize.py, installed in this process once (an audit hook cannot be
    removed), off except inside `refusing_directory_renames`."""
    module = sys.modules.get("gcsfuse_like_hook")
    if module is None:
        spec = importlib.util.spec_from_file_location("gcsfuse_like_hook", SITE_DIR / "sitecustomize.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.ACTIVE[0] = False
        sys.modules["gcsfuse_like_hook"] = module
        sys.addaudithook(module.refuse_directory_renames)
    return module


@contextlib.contextmanager
def refusing_directory_renames() -> Iterator[None]:
    module = _load_hook()
    module.ACTIVE[0] = True
    try:
        yield
    finally:
        module.ACTIVE[0] = False
