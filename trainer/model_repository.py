"""The model repository, REPO/<model name>/<version>/ (TF Serving's layout: it serves the highest),
and releases, RELEASES/<model name>/<N>/<N>/, each one version alone for a cluster to download.

A version is a directory named by a positive integer that holds the commit marker
(trainer.atomic.COMMIT_MARKER). Publishing writes the files straight into the new version's
directory and the marker last; no directory is renamed, so this works on object storage mounted
with GCS FUSE. Readers (the server's poller, the local pipeline, selection) see committed versions
only, so they never see a partial one.

A release is for KServe: its storage initializer copies everything under the InferenceService's
storageUri into /mnt/models, and a TF-Serving-style server wants a base path whose numbered
children are versions. A storageUri of RELEASES/<model name>/<N> therefore gives exactly
/mnt/models/<N>/..., one committed version, for the built-in TF Serving runtime and for our server
(`--model-base-path /mnt/models`) alike.

Numbering after a crash: a publish killed midway leaves <N>/ (and perhaps its release) without the
marker. That directory is never served and its number is never reused: the next publish numbers
past every numbered directory, committed or not, of the repository and of the releases. So no
publisher writes into a directory that another, slower one may still be writing, and a number
always means one model (a pod that downloads release N again after a restart gets the same files).
The abandoned directory stays for a person to look at and delete. A publish that fails with an
exception in-process removes what it wrote, and its number may then be used again.

What is served, REPO/<model name>/rollout.json (ROLLOUT_FILE, written whole): {"stable": N,
"canary": M or null, "canaryPercent": P}, the stable version and the canary that takes P% of the
requests. The local engine writes it (serve starts a canary; promote and roll back settle it) and
the server's version watcher follows it. Without it, the latest committed version is served alone.
A rollback only names another stable version here: no version is ever deleted.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Callable

from trainer.atomic import commit, copy_contents, is_committed, write_whole

# What trainer.select writes (the pipeline's engines read them, without TensorFlow): its record inside
# each published version, and the latest one, promoted or not, beside the versions.
SELECTION_FILE = "selection.json"
LAST_SELECTION_FILE = "last-selection.json"
ROLLOUT_FILE = "rollout.json"
# Each attempt loses a race to another publisher that claimed the same number first.
MAX_CLAIM_ATTEMPTS = 100


def numbered_directories(base: Path) -> list[int]:
    """Every child directory named by a positive integer, committed or not, ascending."""
    if not base.is_dir():
        return []
    return sorted(int(child.name) for child in base.iterdir()
                  if child.name.isdigit() and int(child.name) > 0 and child.is_dir())


def committed_versions(base: Path) -> list[int]:
    """The versions under a base path (TF Serving's `model_base_path`): committed numbered
    children, ascending. Staging, half-written and other directories are not versions."""
    return [number for number in numbered_directories(base) if is_committed(base / str(number))]


def latest_committed(base: Path) -> int | None:
    published = committed_versions(base)
    return published[-1] if published else None


def versions(repo: Path, model_name: str) -> list[int]:
    """The published versions of `model_name` in `repo`, ascending."""
    return committed_versions(repo / model_name)


def latest_version(repo: Path, model_name: str) -> int | None:
    return latest_committed(repo / model_name)


def release_dir(releases: Path, model_name: str, version: int) -> Path:
    """The storageUri of a release: it holds one directory, `<version>/`, the version itself."""
    return releases / model_name / str(version)


def claim_version(model_dir: Path, release_model_dir: Path | None) -> int:
    """Creates the next version's empty directory (and its release's), numbered past every numbered
    directory of either; mkdir fails on an existing one, so two publishers never share a number."""
    for _ in range(MAX_CLAIM_ATTEMPTS):
        taken = numbered_directories(model_dir)
        if release_model_dir is not None:
            taken += numbered_directories(release_model_dir)
        version = max(taken, default=0) + 1
        try:
            (model_dir / str(version)).mkdir(parents=True)
        except FileExistsError:
            continue
        if release_model_dir is None:
            return version
        try:
            (release_model_dir / str(version)).mkdir(parents=True)
            return version
        except FileExistsError:
            (model_dir / str(version)).rmdir()
    raise RuntimeError(f"{model_dir}: no free version number after {MAX_CLAIM_ATTEMPTS} attempts")


def publish(source: Path, repo: Path, model_name: str,
            add_files: Callable[[Path, int], None] = lambda directory, version: None,
            releases: Path | None = None) -> int:
    """Publishes a copy of `source` as the next version; `add_files` may add files to it first.

    With `releases`, the version is also published as the release RELEASES/<name>/<N>/<N>/,
    committed before the repository's version, so that every committed version has its release.
    Returns the new version number.
    """
    release_model_dir = releases / model_name if releases is not None else None
    version = claim_version(repo / model_name, release_model_dir)
    version_dir = repo / model_name / str(version)
    release = release_dir(releases, model_name, version) if releases is not None else None
    try:
        copy_contents(source, version_dir)
        add_files(version_dir, version)
        if release is not None:
            copy_contents(version_dir, release / str(version))
            commit(release / str(version), {"model_name": model_name, "version": version})
        commit(version_dir, {"model_name": model_name, "version": version})
    except BaseException:
        # Never committed, so never read; removed so that the number is free again.
        shutil.rmtree(version_dir, ignore_errors=True)
        if release is not None:
            shutil.rmtree(release, ignore_errors=True)
        raise
    return version


class RolloutStateError(ValueError):
    """rollout.json cannot be read as a rollout state; names the file and what is wrong."""


@dataclasses.dataclass(frozen=True)
class RolloutState:
    """The served versions: `stable`, and a `canary` answering `canary_percent`% of the requests."""
    stable: int
    canary: int | None = None
    canary_percent: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.canary_percent <= 100):
            raise RolloutStateError(f"canaryPercent {self.canary_percent} is not within 0-100")
        if self.canary is not None and self.canary == self.stable:
            raise RolloutStateError(f"the canary is the stable version {self.stable}")

    def as_json(self) -> dict:
        return {"stable": self.stable, "canary": self.canary, "canaryPercent": self.canary_percent}


def read_rollout(base: Path) -> RolloutState | None:
    """The rollout state under a base path, None when there is none (the latest version is served)."""
    path = base / ROLLOUT_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
        canary = record.get("canary")
        return RolloutState(_version(record["stable"]), None if canary is None else _version(canary),
                            _whole_number(record.get("canaryPercent", 0), "canaryPercent"))
    except (ValueError, KeyError) as error:
        raise RolloutStateError(f"{path}: not a rollout state ({type(error).__name__}: {error})") from None


def _whole_number(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} {value!r} is not a whole number")
    return value


def _version(value: object) -> int:
    if _whole_number(value, "version") < 1:
        raise ValueError(f"{value!r} is not a version number")
    return value


def write_rollout(base: Path, state: RolloutState) -> None:
    write_whole(base / ROLLOUT_FILE, json.dumps(state.as_json()) + "\n")


def served_version(repo: Path, model_name: str) -> int | None:
    """The stable version being served: rollout.json's, else the latest committed. The promotion gate
    compares with it, so that a version rolled back is not the bar the next run must clear."""
    state = read_rollout(repo / model_name)
    return state.stable if state is not None else latest_version(repo, model_name)
