"""Every step that writes works on storage that refuses directory renames, as a GCS bucket mounted
with the GCS FUSE CSI driver's defaults does: ingest, a training export, select with its release,
and the request logger's rotation.

Two simulations, both checked to fire: gcsfuse_like/sitecustomize.py (an audit hook: Python's own
renames, in subprocesses and, switched on, in this process) and, where a C compiler is at hand, a
preloaded library that refuses rename(2) of a directory from any code, TensorFlow's C++ included
(its SavedModel and checkpoint writers rename files only: a temporary file over its final name, and
the shard files of `<prefix>_temp/` onto `<prefix>.*`, after which that directory is deleted).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent
from conftest import run_module, train_args
from rename_refusal import refusing_directory_renames, subprocess_env

from serving.process import REPO_ROOT, stop, wait_for_ports
from trainer import model_repository
from trainer.atomic import COMMIT_MARKER, is_committed
from trainer.dataset_files import MANIFEST_NAME
from trainer.fashion_mnist import write_split
from trainer.ingest import ingest
from trainer.select import select_and_publish

pytestmark = pytest.mark.slow  # trains, selects and serves on a filesystem that refuses renames

RENAME_A_DIRECTORY = """
import os, sys
os.makedirs(sys.argv[1] + "/sub")
open(sys.argv[1] + "/sub/file", "w").close()
os.rename(sys.argv[1] + "/sub/file", sys.argv[1] + "/sub/renamed")  # a file: allowed
os.rename(sys.argv[1] + "/sub", sys.argv[1] + "/moved")
"""

# rename(2) and its relatives, refused with EXDEV when the source is a directory.
REFUSING_LIBRARY_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

static int refused(int dirfd, const char *path) {
    struct stat status;
    if (fstatat(dirfd, path, &status, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(status.st_mode)) {
        fprintf(stderr, "refused: rename of the directory %s\n", path);
        errno = EXDEV;
        return 1;
    }
    return 0;
}

int rename(const char *from, const char *to) {
    static int (*real)(const char *, const char *);
    if (refused(AT_FDCWD, from)) return -1;
    if (!real) real = dlsym(RTLD_NEXT, "rename");
    return real(from, to);
}

int renameat(int from_fd, const char *from, int to_fd, const char *to) {
    static int (*real)(int, const char *, int, const char *);
    if (refused(from_fd, from)) return -1;
    if (!real) real = dlsym(RTLD_NEXT, "renameat");
    return real(from_fd, from, to_fd, to);
}

int renameat2(int from_fd, const char *from, int to_fd, const char *to, unsigned int flags) {
    static int (*real)(int, const char *, int, const char *, unsigned int);
    if (refused(from_fd, from)) return -1;
    if (!real) real = dlsym(RTLD_NEXT, "renameat2");
    return real(from_fd, from, to_fd, to, flags);
}
"""


@pytest.fixture(scope="session")
def refusing_library(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The preloadable library, or None without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    work = tmp_path_factory.mktemp("refuse-dir-rename")
    (work / "refuse.c").write_text(REFUSING_LIBRARY_SOURCE)
    library = work / "librefuse.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(work / "refuse.c"), "-ldl"],
                   check=True, capture_output=True)
    return library


@pytest.fixture(scope="session")
def gcsfuse_env(refusing_library: Path | None) -> dict[str, str]:
    """The environment of a child process on which directory renames fail."""
    env = subprocess_env()
    if refusing_library is not None:
        env["LD_PRELOAD"] = str(refusing_library)
    return env


def rename_a_directory(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RENAME_A_DIRECTORY, str(tmp_path / "work")],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def test_the_audit_hook_refuses_a_directory_rename_in_a_subprocess(tmp_path):
    result = rename_a_directory(tmp_path, subprocess_env())
    assert result.returncode == 1
    assert "OSError: [Errno 18] renaming a directory is refused here" in result.stderr
    assert (tmp_path / "work" / "sub" / "renamed").is_file() and not (tmp_path / "work" / "moved").exists()


def test_the_audit_hook_refuses_a_directory_rename_in_this_process_only_when_switched_on(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "file").write_text("x")
    with refusing_directory_renames():
        (tmp_path / "a" / "file").rename(tmp_path / "a" / "renamed")
        with pytest.raises(OSError) as raised:
            (tmp_path / "a").rename(tmp_path / "b")
        assert raised.value.errno == errno.EXDEV
        with pytest.raises(OSError):
            os.replace(tmp_path / "a", tmp_path / "b")
    (tmp_path / "a").rename(tmp_path / "b")  # switched off again
    assert (tmp_path / "b" / "renamed").is_file()


def test_the_preloaded_library_refuses_a_directory_rename_from_c(tmp_path, refusing_library):
    if refusing_library is None:
        pytest.skip("no C compiler for the preloaded library")
    result = rename_a_directory(tmp_path, {"LD_PRELOAD": str(refusing_library)})
    assert result.returncode == 1
    assert "refused: rename of the directory" in result.stderr
    assert "[Errno 18]" in result.stderr
    assert (tmp_path / "work" / "sub" / "renamed").is_file() and not (tmp_path / "work" / "moved").exists()


def test_ingest_writes_and_replaces_a_dataset(sample_dir, tmp_path, gcsfuse_env):
    out = tmp_path / "data"
    first = run_module("trainer.ingest", "--source", sample_dir, "--out", out, env=gcsfuse_env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert is_committed(out)

    source = tmp_path / "source"
    shutil.copytree(sample_dir, source)
    write_split(source, "test", np.zeros((3, 28, 28)), np.array([1, 2, 3]))
    second = run_module("trainer.ingest", "--source", source, "--out", out, env=gcsfuse_env)

    assert second.returncode == 0, second.stderr[-2000:]
    assert is_committed(out)
    assert json.loads((out / MANIFEST_NAME).read_text())["counts"]["test"] == 3
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_ingest_in_this_process_replaces_a_dataset(sample_dir, tmp_path):
    out = tmp_path / "data"
    source = tmp_path / "source"
    shutil.copytree(sample_dir, source)
    write_split(source, "test", np.zeros((3, 28, 28)), np.array([1, 2, 3]))
    with refusing_directory_renames():
        ingest(str(sample_dir), out)
        manifest = ingest(str(source), out)
    assert manifest["counts"]["test"] == 3 and is_committed(out)


def test_a_training_export_replaces_an_earlier_one(data_dir, tmp_path, gcsfuse_env):
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    (export_dir / "stale.txt").write_text("from an earlier export")
    (export_dir / COMMIT_MARKER).write_text("{}\n")

    result = run_module("trainer.train", *train_args("cnn", data_dir, tmp_path, "--epochs", "2",
                                                     "--steps-per-epoch", "3"), env=gcsfuse_env)

    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused" not in result.stderr
    assert is_committed(export_dir) and not (export_dir / "stale.txt").exists()
    assert json.loads((export_dir / "metrics.json").read_text())["model"] == "cnn"
    assert (export_dir / "saved_model.pb").is_file() and (export_dir / "variables").is_dir()


def test_select_publishes_a_version_and_its_release(two_worker_export, one_worker_export, data_dir,
                                                    tmp_path, gcsfuse_env):
    repo, releases = tmp_path / "models", tmp_path / "releases"
    # Version 1 and its release, published here (renames allowed), then the command publishes the same
    # winner over them: one TensorFlow process rather than two. No ensemble: it is saved in a local
    # scratch directory, never on the bucket, and is most of a selection's CPU time.
    candidates = [two_worker_export, one_worker_export]
    select_and_publish(candidates, data_dir, repo, "fmnist", releases, ensemble=False)
    result = run_module("trainer.select", "--candidates", *candidates, "--no-ensemble",
                        "--data-dir", data_dir, "--model-repo", repo, "--model-name", "fmnist",
                        "--releases-dir", releases, "--published-version-file",
                        tmp_path / "version.txt", env=gcsfuse_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused" not in result.stderr
    assert (tmp_path / "version.txt").read_text() == "2\n"
    assert model_repository.versions(repo, "fmnist") == [1, 2]
    assert [p.name for p in (releases / "fmnist" / "2").iterdir()] == ["2"]
    assert is_committed(releases / "fmnist" / "2" / "2")


def post_event(url: str, number: int) -> None:
    event = CloudEvent({"id": f"e{number}", "type": "org.kubeflow.serving.inference.request",
                        "source": "test"}, {"instances": [number], "padding": "x" * 200})
    headers, body = to_binary(event)
    requests.post(url, headers=headers, data=body, timeout=10).raise_for_status()


def start_logger(out_dir: Path, port_file: Path, log: Path, env: dict[str, str],
                 *extra: str) -> subprocess.Popen:
    """The logger on the port it binds, which it writes to `port_file` once it listens."""
    with open(log, "w") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "serving.logger", "--port", "0", "--port-file", str(port_file),
             "--out-dir", str(out_dir), "--host", "127.0.0.1", *extra],
            cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **env})


def test_the_logger_rotates_by_size_and_closes_its_files_on_sigterm(tmp_path, gcsfuse_env):
    log, out_dir = tmp_path / "logger.log", tmp_path / "inference-log"
    process = start_logger(out_dir, tmp_path / "logger.ports", log, gcsfuse_env, "--rotate-bytes", "1000")
    try:
        port = wait_for_ports(tmp_path / "logger.ports", process, log)["http"]
        for number in range(12):
            post_event(f"http://127.0.0.1:{port}/", number)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        stop(process)
    assert "every event file is closed" in log.read_text()
    files = sorted(out_dir.iterdir())
    assert len(files) >= 3 and all(p.stat().st_size <= 1000 for p in files)
    ids = [json.loads(line)["id"] for p in files for line in p.read_text().splitlines()]
    assert ids == [f"e{number}" for number in range(12)]
