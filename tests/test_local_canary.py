"""The local engine's canary (pipeline.local_canary) against a real server: the split it starts with,
the traffic, promote or roll back on the server's metrics, forced decisions, the history, and
`python -m pipeline promote|rollback` by hand. Rolling back never deletes a version."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
import requests
from conftest import last_line, refused_port, run_module

from pipeline.config import parse_config
from pipeline.local_canary import (
    HISTORY_FILE,
    Forced,
    RolloutRefused,
    by_hand,
    model_base,
    run_canary,
    send_traffic,
    starting_state,
    summary,
    traffic_images,
)
from serving.client import ServerError, inference_request
from serving.model import VERSION_HEADER
from serving.process import model_server
from trainer import atomic, model_repository
from trainer.model_repository import RolloutState

MODEL = "fmnist"
POLL_SECONDS = 0.2  # the server's version watcher, so that a new rollout state is seen at once
SWITCH_SECONDS = 30


def rollout_config(root: Path, **rollout: object) -> object:
    return parse_config({"pipeline": {"storageRoot": str(root), "modelName": MODEL,
                                      "rollout": {"canaryPercent": 50, "minRequests": 20, "maxWait": "60s",
                                                  **rollout}}})


@pytest.fixture(scope="module")
def root(published_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage root whose model repository holds versions 1 and 2 (the same model twice)."""
    root = tmp_path_factory.mktemp("root")
    shutil.copytree(published_repo, root / "models")
    model_repository.publish(root / "models" / MODEL / "1", root / "models", MODEL)
    return root


@pytest.fixture(scope="module")
def server(root: Path, tmp_path_factory: pytest.TempPathFactory):
    model_repository.write_rollout(root / "models" / MODEL, RolloutState(1, 2, 50))
    log = tmp_path_factory.mktemp("server") / "server.log"
    with model_server(root / "models", MODEL, log, "--poll-seconds", POLL_SECONDS) as (url, _):
        yield url


def answering_versions(url: str, image: bytes, count: int) -> Counter:
    path, body = inference_request([image], "v1", MODEL)
    return Counter(requests.post(url + path, json=body).headers[VERSION_HEADER] for _ in range(count))


def serving(url: str, image: bytes, state: RolloutState) -> None:
    """Until the server answers from exactly the versions of `state` (its watcher polls)."""
    wanted = {str(state.stable)} | ({str(state.canary)} if state.canary else set())
    deadline = time.monotonic() + SWITCH_SECONDS
    while set(answering_versions(url, image, 20)) != wanted:
        assert time.monotonic() < deadline, f"the server did not switch to {state}"
        time.sleep(POLL_SECONDS)


def start_canary(root: Path, url: str, image: bytes) -> Path:
    base = root / "models" / MODEL
    model_repository.write_rollout(base, RolloutState(1, 2, 50))
    serving(url, image, RolloutState(1, 2, 50))
    return base


@pytest.fixture(scope="module")
def image(data_dir: Path) -> bytes:
    return traffic_images(data_dir, 1)[0]


def history(base: Path) -> list[dict]:
    return json.loads((base / HISTORY_FILE).read_text())


def test_a_sound_canary_is_promoted_and_the_server_follows(root, server, image, data_dir):
    base = start_canary(root, server, image)
    # Both versions are one model: the latency bound is wide so that a busy machine cannot tip it.
    config = rollout_config(root, maxLatencyRatio=3)
    decision, state = run_canary(config, server, data_dir)
    assert decision.promote, decision.reason
    assert decision.canary.requests >= 20 and decision.stable.requests > 0
    assert decision.canary.errors == 0
    assert model_repository.read_rollout(base) == RolloutState(2)
    assert history(base)[-1]["decision"] == "promote" and history(base)[-1]["canary"]["requests"] >= 20
    assert summary(decision, state).startswith("promoted version 2: ")
    serving(server, image, RolloutState(2))


def test_a_forced_rollback_keeps_the_stable_version_and_the_canary_on_disk(root, server, image, data_dir):
    base = start_canary(root, server, image)
    decision, state = run_canary(rollout_config(root), server, data_dir, Forced.ROLLBACK)
    assert not decision.promote
    assert decision.reason.startswith("forced rollback (the evidence said ")
    assert model_repository.read_rollout(base) == RolloutState(1)
    assert model_repository.versions(root / "models", MODEL) == [1, 2]  # nothing deleted
    assert model_repository.served_version(root / "models", MODEL) == 1  # the gate's bar
    assert summary(decision, state).startswith("rolled back version 2, version 1 stays: forced rollback")
    serving(server, image, RolloutState(1))


def test_a_canary_short_of_requests_at_the_deadline_is_rolled_back(root, server, image, data_dir):
    base = start_canary(root, server, image)
    decision, _ = run_canary(rollout_config(root, minRequests=100000, maxWait="1s"), server, data_dir)
    assert not decision.promote
    assert "fewer than the 100000 required" in decision.reason
    assert model_repository.read_rollout(base) == RolloutState(1)


def test_without_a_canary_the_rollout_step_does_nothing(root, server, data_dir):
    model_repository.write_rollout(root / "models" / MODEL, RolloutState(1))
    assert run_canary(rollout_config(root), server, data_dir) is None


@pytest.mark.parametrize(("state", "published", "percent", "expected"), [
    (None, 2, 10, RolloutState(1, 2, 10)),  # no rollout state yet: the version before is stable
    (RolloutState(1), 2, 10, RolloutState(1, 2, 10)),
    (RolloutState(1), 2, 0, RolloutState(2)),  # 0%: promoted at once
    (RolloutState(1, 2, 10), None, 10, RolloutState(1)),  # nothing published: an old canary is dropped
    (None, None, 10, RolloutState(2)),
])
def test_the_server_starts_with_this_runs_version_as_the_canary(tmp_path, state, published, percent,
                                                                  expected):
    base = tmp_path / MODEL
    for number in (1, 2):
        (base / str(number)).mkdir(parents=True)
        atomic.commit(base / str(number))
    if state is not None:
        model_repository.write_rollout(base, state)
    assert starting_state(base, published, percent) == expected


def test_the_first_version_has_no_canary(tmp_path):
    base = tmp_path / MODEL
    (base / "1").mkdir(parents=True)
    atomic.commit(base / "1")
    assert starting_state(base, 1, 10) == RolloutState(1)


@pytest.fixture
def repo_root(tmp_path: Path) -> Path:
    """A storage root with versions 1-3 committed (empty: no server reads them)."""
    base = tmp_path / "models" / MODEL
    for number in (1, 2, 3):
        (base / str(number)).mkdir(parents=True)
        atomic.commit(base / str(number))
    return tmp_path


def test_promote_and_rollback_by_hand_settle_the_canary(repo_root):
    base = model_base(rollout_config(repo_root))
    model_repository.write_rollout(base, RolloutState(2, 3, 10))
    result = run_module("pipeline", "promote", "--storage-root", repo_root)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "promoted version 3 by hand; version 3 is served"
    assert model_repository.read_rollout(base) == RolloutState(3)

    model_repository.write_rollout(base, RolloutState(2, 3, 10))
    result = run_module("pipeline", "rollback", "--storage-root", repo_root)
    assert result.stdout.strip() == "rolled back version 3 by hand; version 2 is served"
    assert model_repository.read_rollout(base) == RolloutState(2)
    assert [entry["decision"] for entry in history(base)] == ["promote", "rollback"]
    assert model_repository.versions(repo_root / "models", MODEL) == [1, 2, 3]


def test_rollback_without_a_canary_serves_the_version_before_or_the_one_named(repo_root):
    base = model_base(rollout_config(repo_root))
    result = run_module("pipeline", "rollback", "--storage-root", repo_root)  # no rollout state: 3 served
    assert result.stdout.strip() == "rolled back from version 3 to version 2 by hand; 3 stays on disk"
    assert model_repository.read_rollout(base) == RolloutState(2)
    assert "to version 1" in run_module("pipeline", "rollback", "--storage-root", repo_root).stdout
    assert by_hand(base, promote=False, to_version=3).endswith("to version 3 by hand; 1 stays on disk")
    assert model_repository.versions(repo_root / "models", MODEL) == [1, 2, 3]


@pytest.mark.parametrize(("state", "args", "message"), [
    (RolloutState(3), ["promote"], "promote: .*fmnist: no canary to promote"),
    (RolloutState(1), ["rollback"], "rollback: no version before 1 to roll back to"),
    (RolloutState(3), ["rollback", "--to-version", "7"], "rollback: version 7 is not a committed version"),
    (RolloutState(2, 3, 10), ["rollback", "--to-version", "1"], "rollback: version 3 is a canary: settle"),
])
def test_what_cannot_be_settled_is_a_one_line_error(repo_root, state, args, message):
    model_repository.write_rollout(model_base(rollout_config(repo_root)), state)
    result = run_module("pipeline", *args, "--storage-root", repo_root)
    assert result.returncode == 2
    assert re.search(f"pipeline: error: {message}", last_line(result.stderr)), result.stderr


def test_a_broken_rollout_state_is_a_one_line_error(repo_root):
    (model_base(rollout_config(repo_root)) / "rollout.json").write_text("{")
    result = run_module("pipeline", "promote", "--storage-root", repo_root)
    assert result.returncode == 2 and "rollout.json: not a rollout state" in last_line(result.stderr)
    with pytest.raises(RolloutRefused):
        by_hand(repo_root / "models" / "other", promote=True)


def test_a_server_that_does_not_answer_fails_the_step_in_one_line():
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(ServerError, match=rf"^{url}/metrics: "):
            send_traffic(url, MODEL, RolloutState(1, 2, 50), [b"image"], min_requests=1, max_wait_seconds=1)
