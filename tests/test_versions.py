"""Which versions the server serves (serving.versions, trainer.model_repository's rollout state): the
newest committed one alone, or a stable version and a canary splitting the batches."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.versions import VersionSet, load_state, wanted_state
from trainer import atomic, model_repository
from trainer.model_repository import RolloutState, RolloutStateError

SEED = 14


def committed_versions(base: Path, *numbers: int) -> Path:
    for number in numbers:
        (base / str(number)).mkdir(parents=True)
        atomic.commit(base / str(number))
    return base


def test_without_a_rollout_state_the_newest_committed_version_is_served(tmp_path):
    base = committed_versions(tmp_path, 1, 2)
    (base / "3").mkdir()  # being written: not a version yet
    assert wanted_state(base) == RolloutState(2)
    assert wanted_state(tmp_path / "nothing") is None


def test_the_rollout_state_names_what_is_served(tmp_path):
    base = committed_versions(tmp_path, 1, 2, 3)
    model_repository.write_rollout(base, RolloutState(1, 3, 25))
    assert wanted_state(base) == RolloutState(1, 3, 25)
    assert json.loads((base / "rollout.json").read_text()) == {"stable": 1, "canary": 3, "canaryPercent": 25}
    assert model_repository.served_version(tmp_path.parent, tmp_path.name) == 1


def test_a_rollout_state_naming_an_uncommitted_version_is_refused(tmp_path):
    base = committed_versions(tmp_path, 1)
    (base / "2").mkdir()
    model_repository.write_rollout(base, RolloutState(1, 2, 10))
    with pytest.raises(ValueError, match=r"names version 2, which is not a committed version"):
        wanted_state(base)


@pytest.mark.parametrize(("text", "problem"), [
    ("{", "JSONDecodeError"),
    ('{"canary": 2}', "KeyError: 'stable'"),
    ('{"stable": 0}', "0 is not a version number"),
    ('{"stable": "1"}', "version '1' is not a whole number"),
    ('{"stable": 1, "canary": 2, "canaryPercent": 12.5}', "canaryPercent 12.5 is not a whole number"),
    ('{"stable": 1, "canary": 2, "canaryPercent": true}', "canaryPercent True is not a whole number"),
    ('[1]', "ValueError: not a JSON object"),
    ('{"stable": 1, "canary": 1, "canaryPercent": 10}', "the canary is the stable version 1"),
    ('{"stable": 1, "canary": 2, "canaryPercent": 101}', "canaryPercent 101 is not within 0-100"),
])
def test_a_broken_rollout_state_is_a_one_line_error_naming_the_file(tmp_path, text, problem):
    (tmp_path / "rollout.json").write_text(text)
    with pytest.raises(RolloutStateError, match=r"rollout\.json: not a rollout state") as error:
        model_repository.read_rollout(tmp_path)
    assert problem in str(error.value) and "\n" not in str(error.value)


def test_two_versions_under_a_50_percent_split_share_400_batches_40_to_60_percent():
    versions = VersionSet(RolloutState(1, 2, 50), {1: "v1", 2: "v2"}, random.Random(SEED).random)
    share = Counter(versions.choose() for _ in range(400))["v2"] / 400
    assert 0.40 <= share <= 0.60


@pytest.mark.parametrize("percent", [0, 10, 90])
def test_the_canary_takes_its_percentage_and_the_stable_version_the_rest(percent):
    versions = VersionSet(RolloutState(1, 2, percent), {1: "v1", 2: "v2"}, random.Random(SEED).random)
    share = Counter(versions.choose() for _ in range(2000))["v2"] / 2000
    assert share == pytest.approx(percent / 100, abs=0.03)


def test_without_a_canary_the_stable_version_answers_everything():
    versions = VersionSet(RolloutState(4), {4: "v4"})
    assert {versions.choose() for _ in range(100)} == {"v4"}


def test_loading_a_new_state_reuses_the_versions_already_loaded():
    loads: list[int] = []

    def load(number: int) -> str:
        loads.append(number)
        return f"v{number}"

    before = load_state(RolloutState(1, 2, 10), None, load)
    after = load_state(RolloutState(2), before, load)
    assert loads == [1, 2]
    assert after.stable == "v2" and after.loaded == {2: "v2"}


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 200) | st.floats(allow_nan=False)
                           | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.sampled_from(["stable", "canary", "canaryPercent", "x"]),
                                             inner, max_size=4),
                           max_leaves=8)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(JSON_VALUES.map(json.dumps), st.text(max_size=30)))
def test_any_file_is_a_rollout_state_or_a_rollout_error(tmp_path, text):
    (tmp_path / "rollout.json").write_text(text)
    try:
        state = model_repository.read_rollout(tmp_path)
    except RolloutStateError as error:
        assert "\n" not in str(error)
        return
    assert state.stable >= 1 and 0 <= state.canary_percent <= 100
    assert model_repository.read_rollout(tmp_path) == state
    model_repository.write_rollout(tmp_path, state)  # written back, it reads the same
    assert model_repository.read_rollout(tmp_path) == state
