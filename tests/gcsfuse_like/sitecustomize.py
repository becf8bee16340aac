"""Loaded at start-up by a Python process whose PYTHONPATH holds this directory: from then on it
refuses to rename a directory, as a GCS bucket mounted with the GCS FUSE CSI driver's defaults does
(`rename-dir-limit` 0). Renaming a file still works, as it does there.

Only Python's own renames are seen (os.rename, os.replace, and what calls them: pathlib, shutil);
TensorFlow's C++ file system calls libc directly (see tests/test_no_dir_renames.py for those).
"""

import errno
import os
import stat
import sys

# Switched by tests that load this file in their own process (tests/rename_refusal.py).
ACTIVE = [True]


def refuse_directory_renames(event: str, args: tuple) -> None:
    if event != "os.rename" or not ACTIVE[0]:  # os.replace raises the same audit event
        return
    source, _destination, source_dir_fd, _destination_dir_fd = args
    try:  # dir_fd is -1 when not given
        status = os.stat(source, dir_fd=None if source_dir_fd in (None, -1) else source_dir_fd,
                         follow_symlinks=False)
    except (OSError, TypeError, ValueError):
        return  # the rename itself will report it
    if stat.S_ISDIR(status.st_mode):
        raise OSError(errno.EXDEV, "renaming a directory is refused here (as on GCS FUSE)", source)


if __name__ == "sitecustomize":
    sys.addaudithook(refuse_directory_renames)
