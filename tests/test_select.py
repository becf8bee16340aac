"""Selection of the best candidate, publishing of numbered versions (committed by a marker written
last) and of their releases."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import last_line, run_module
from PIL import Image

from trainer import model_repository, select
from trainer.atomic import COMMIT_MARKER, commit, is_committed
from trainer.model_repository import LAST_SELECTION_FILE
from trainer.select import CandidateError, Evaluation, choose_winner, promotes, select_and_publish


@pytest.fixture
def candidates(two_worker_export: Path, one_worker_export: Path) -> list[Path]:
    return [two_worker_export, one_worker_export]


def test_publishes_the_best_on_validation_as_version_1_then_2(candidates, data_dir, tmp_path):
    repo = tmp_path / "models"
    first = select_and_publish(candidates, data_dir, repo, "fmnist")
    # The numbering is the publisher's, the same without the ensemble (most of a selection's CPU).
    second = select_and_publish(candidates, data_dir, repo, "fmnist", ensemble=False)

    assert (first["version"], second["version"]) == (1, 2)
    assert model_repository.versions(repo, "fmnist") == [1, 2]
    assert (first["validation_examples"], first["test_examples"]) == (50, 100)
    ranked = {c["name"]: (c["validation_accuracy"], -c["validation_loss"]) for c in first["candidates"]}
    assert set(ranked) == {"cnn", "cnn_batchnorm", "ensemble"}
    best_single = max(["cnn", "cnn_batchnorm"], key=ranked.get)
    ensemble_accuracy = ranked["ensemble"][0]
    margin = first["ensemble"]["single_must_beat_by"]
    assert margin == pytest.approx(math.sqrt(ensemble_accuracy * (1 - ensemble_accuracy) / 50))
    beaten = ranked[best_single][0] - ensemble_accuracy > margin + 1e-9
    assert first["winner"] == (best_single if beaten else "ensemble")
    assert first["ranking"].startswith("the ensemble, unless")
    assert all(0 <= c["test_accuracy"] <= 1 for c in first["candidates"])  # reported beside
    version_dir = repo / "fmnist" / "1"
    assert json.loads((version_dir / "selection.json").read_text()) == first
    assert Image.open(version_dir / "report.png").size[0] > 500


def test_the_published_version_is_the_winner_itself(candidates, data_dir, tmp_path):
    repo = tmp_path / "models"
    selection = select_and_publish(candidates, data_dir, repo, "fmnist", ensemble=False)
    winner_dir = dict(zip(["cnn", "cnn_batchnorm"], candidates))[selection["winner"]]
    assert (repo / "fmnist" / "1" / "saved_model.pb").read_bytes() == (
        winner_dir / "saved_model.pb").read_bytes()
    assert [c["name"] for c in selection["candidates"]] == ["cnn", "cnn_batchnorm"]
    assert selection["ensemble"] is None
    assert selection["ranking"] == "validation accuracy, ties: lower validation loss"


def scored(name: str, validation_accuracy: float, validation_loss: float = 0.5,
           members: tuple[str, ...] = ()) -> Evaluation:
    return Evaluation(name=name, export_dir=Path(name), validation_accuracy=validation_accuracy,
                      validation_loss=validation_loss, accuracy=0.0, loss=0.0,
                      confusion=np.zeros((10, 10), dtype=int), members=members)


SINGLES = [scored("cnn", 0.90, 0.39), scored("cnn_gap", 0.82, 0.45)]


@pytest.mark.parametrize(("ensemble_accuracy", "examples", "expected"), [
    (0.86, 50, "ensemble"),  # cnn better by 0.04, less than one standard error (0.049)
    (0.94, 50, "ensemble"),  # the ensemble is the best outright
    (0.90, 50, "ensemble"),  # a tie
    (0.80, 50, "cnn"),  # cnn better by 0.10, more than one standard error (0.057)
    (0.88, 6000, "cnn"),  # better by 0.02 on 6,000 images: more than one standard error (0.004)
])
def test_the_ensemble_wins_unless_a_single_model_beats_it_by_more_than_one_standard_error(
        ensemble_accuracy, examples, expected):
    ensemble = scored("ensemble", ensemble_accuracy, members=("cnn", "cnn_gap"))
    assert choose_winner(SINGLES, ensemble, examples).name == expected


def test_without_an_ensemble_the_best_on_validation_wins_ties_to_the_lower_loss():
    tied = [scored("cnn", 0.90, 0.45), scored("cnn_gap", 0.90, 0.39), scored("cnn_vgg", 0.88, 0.20)]
    assert choose_winner(tied, None, 50).name == "cnn_gap"


def test_the_test_split_never_decides(candidates, data_dir, tmp_path, monkeypatch):
    """Swap the test images for noise: the scores on test change, the winner does not."""
    from trainer import select
    from trainer.fashion_mnist import Split

    chosen = select_and_publish(candidates, data_dir, tmp_path / "a", "fmnist")["winner"]
    real_load = select.load_split

    def noisy_test(directory, split):
        loaded = real_load(directory, split)
        if split != "test":
            return loaded
        noise = np.random.default_rng(0).integers(0, 256, loaded.images.shape, dtype=np.uint8)
        return Split(noise, loaded.labels)

    monkeypatch.setattr(select, "load_split", noisy_test)
    again = select_and_publish(candidates, data_dir, tmp_path / "b", "fmnist")
    assert again["winner"] == chosen


def test_the_ensemble_serves_the_mean_of_its_members(candidates, data_dir, tmp_path):
    from trainer import export
    from trainer.fashion_mnist import load_split

    repo = tmp_path / "models"
    selection = select_and_publish(candidates, data_dir, repo, "fmnist", min_improvement=0.0)
    record = selection["ensemble"]
    assert record["members"] == ["cnn", "cnn_batchnorm"]
    assert record["validation_gain"] == pytest.approx(
        record["validation_accuracy"] - record["best_member_validation_accuracy"])

    # Its own copies of the members: the fixtures' exports are shared by every test of the run (other
    # pytest-xdist workers read them meanwhile), so they are never moved.
    members = [shutil.copytree(member, tmp_path / "members" / member.parent.name) for member in candidates]
    ensemble_dir = tmp_path / "ensemble"
    export.save_ensemble(members, str(ensemble_dir))
    images = load_split(data_dir, "test").images[:8]
    expected = np.mean([export.predict_pixels(m, images) for m in members], axis=0)
    np.testing.assert_allclose(export.predict_pixels(ensemble_dir, images), expected, atol=1e-6)
    shutil.rmtree(tmp_path / "members")  # self-contained: it serves with its members gone
    np.testing.assert_allclose(export.predict_pixels(ensemble_dir, images), expected, atol=1e-6)


# The publisher's tests below select among the single models (ensemble=False): publishing is the same
# for an ensemble, whose save and evaluation (most of a selection's 8 CPU-seconds) the tests above check.
def test_interrupted_publish_leaves_no_partial_version(candidates, data_dir, tmp_path,
                                                       monkeypatch):
    repo = tmp_path / "models"
    select_and_publish(candidates, data_dir, repo, "fmnist", ensemble=False)
    version_1 = sorted(p.relative_to(repo) for p in (repo / "fmnist" / "1").rglob("*"))

    def crash_midway(source, destination, **kwargs):
        shutil.copy2(Path(source) / "saved_model.pb", Path(destination) / "saved_model.pb")
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(model_repository.shutil, "copytree", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        select_and_publish(candidates, data_dir, repo, "fmnist", ensemble=False)

    assert model_repository.versions(repo, "fmnist") == [1]
    assert sorted(p.relative_to(repo) for p in (repo / "fmnist" / "1").rglob("*")) == version_1
    assert [p.name for p in (repo / "fmnist").iterdir() if p.is_dir()] == ["1"]
    # The record of the last selection is the finished one's: an interrupted publish wrote none.
    assert json.loads((repo / "fmnist" / LAST_SELECTION_FILE).read_text())["version"] == 1


def test_a_crashed_publisher_staging_directory_is_not_a_version(candidates, data_dir, tmp_path):
    repo = tmp_path / "models"
    stale = repo / "fmnist" / ".1.staging-abc123"
    stale.mkdir(parents=True)
    (stale / "saved_model.pb").write_bytes(b"partial")

    selection = select_and_publish(candidates, data_dir, repo, "fmnist", ensemble=False)

    assert selection["version"] == 1
    assert model_repository.versions(repo, "fmnist") == [1]


def test_a_half_written_version_is_not_a_version_and_the_next_publish_numbers_past_it(
        candidates, data_dir, tmp_path):
    repo = tmp_path / "models"
    select_and_publish(candidates, data_dir, repo, "fmnist", ensemble=False)
    crashed = repo / "fmnist" / "2"  # a publisher killed before its marker
    crashed.mkdir()
    (crashed / "saved_model.pb").write_bytes(b"partial")
    assert model_repository.versions(repo, "fmnist") == [1]
    assert model_repository.latest_version(repo, "fmnist") == 1

    selection = select_and_publish(candidates, data_dir, repo, "fmnist", ensemble=False)

    assert selection["version"] == 3
    assert model_repository.versions(repo, "fmnist") == [1, 3]
    assert (crashed / "saved_model.pb").read_bytes() == b"partial" and not is_committed(crashed)


def test_the_release_is_the_version_alone_under_its_own_number(candidates, data_dir, tmp_path):
    repo, releases = tmp_path / "models", tmp_path / "releases"
    (releases / "fmnist" / "4").mkdir(parents=True)  # a release whose version is gone: never reused

    selection = select_and_publish(candidates, data_dir, repo, "fmnist", releases, ensemble=False)

    assert selection["version"] == 5
    release = model_repository.release_dir(releases, "fmnist", 5)
    assert [p.name for p in release.iterdir()] == ["5"]
    assert model_repository.committed_versions(release) == [5]
    version_dir = repo / "fmnist" / "5"
    files = sorted(str(p.relative_to(version_dir)) for p in version_dir.rglob("*"))
    assert files == sorted(str(p.relative_to(release / "5")) for p in (release / "5").rglob("*"))
    assert COMMIT_MARKER in files and "selection.json" in files
    assert json.loads((release / "5" / "selection.json").read_text())["version"] == 5


def test_an_export_without_its_marker_is_rejected(candidates, data_dir, tmp_path):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(candidates[0], unfinished)
    (unfinished / COMMIT_MARKER).unlink()
    with pytest.raises(CandidateError, match="unfinished: not a committed export"):
        select_and_publish([*candidates, unfinished], data_dir, tmp_path / "models", "fmnist")
    assert not (tmp_path / "models").exists()


def test_a_candidate_that_is_not_a_savedmodel_is_rejected(candidates, data_dir, tmp_path):
    bogus = tmp_path / "bogus"
    bogus.mkdir()
    (bogus / COMMIT_MARKER).write_text("{}\n")
    with pytest.raises(CandidateError, match="bogus: not a SavedModel"):
        select_and_publish([*candidates, bogus], data_dir, tmp_path / "models", "fmnist")
    assert not (tmp_path / "models").exists()


def test_cli_prints_the_table_and_the_version_and_writes_the_version_file(candidates, data_dir,
                                                                          tmp_path):
    version_file = tmp_path / "outputs" / "version"
    result = run_module("trainer.select", "--candidates", *candidates, "--data-dir", data_dir,
                        "--model-repo", tmp_path / "models", "--model-name", "fmnist",
                        "--releases-dir", tmp_path / "releases", "--published-version-file", version_file)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "<- published" in result.stdout
    assert f"release (a storageUri holding only version 1): {tmp_path / 'releases' / 'fmnist' / '1'}" \
        in result.stdout
    assert "as version 1:" in last_line(result.stdout)
    assert version_file.read_text() == "1\n"


def run_select(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, str]:
    """`python -m trainer.select ARGS` in this process (its entry point, without a TensorFlow import
    a test): (exit status, stdout, stderr)."""
    try:
        select.run([str(arg) for arg in args])
        status = 0
    except SystemExit as exit_info:
        status = exit_info.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_cli_missing_candidate_is_one_line(data_dir, tmp_path, capsys):
    status, _, err = run_select(capsys, "--candidates", tmp_path / "nope", "--data-dir", data_dir,
                                "--model-repo", tmp_path / "models")
    assert status == 2
    assert last_line(err) == f"select: error: {tmp_path / 'nope'}: no such export directory"


# --- The promotion gate: the winner against the served version, on the validation images -----------

ALWAYS_PREDICTED_CLASS = 0


@pytest.fixture(scope="module")
def constant_export(tmp_path_factory) -> Path:
    """A committed export that answers class 0 for every image: right on a tenth of balanced data,
    so any trained model is better and it is never better than one."""
    import tf_keras as keras

    from trainer.export import save_for_serving

    export_dir = tmp_path_factory.mktemp("constant") / "constant"
    model = keras.Sequential([keras.layers.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10, kernel_initializer="zeros")])
    bias = np.zeros(10, dtype="float32")
    bias[ALWAYS_PREDICTED_CLASS] = 10.0
    model.layers[-1].bias.assign(bias)
    save_for_serving(model, str(export_dir))
    commit(export_dir)
    return export_dir


def test_the_gate_is_better_by_at_least_the_margin_and_zero_means_not_worse():
    assert promotes(0.80, None, 0.5)  # nothing served: the first version
    assert promotes(0.90, 0.90, 0.0) and not promotes(0.89, 0.90, 0.0)
    assert promotes(0.93, 0.92, 0.01)  # float rounding (0.93 - 0.92 < 0.01) does not decide
    assert not promotes(0.929, 0.92, 0.01)


def test_a_served_version_that_is_better_stays_served_and_the_record_says_why(
        two_worker_export, constant_export, data_dir, tmp_path, capsys):
    repo, releases = tmp_path / "models", tmp_path / "releases"
    select_and_publish([two_worker_export], data_dir, repo, "fmnist", releases)
    version_file = tmp_path / "outputs" / "version"

    status, out, err = run_select(capsys, "--candidates", constant_export, "--data-dir", data_dir,
                                  "--model-repo", repo, "--model-name", "fmnist", "--releases-dir", releases,
                                  "--published-version-file", version_file)

    assert status == 0, err[-2000:]
    assert model_repository.versions(repo, "fmnist") == [1]
    assert model_repository.numbered_directories(releases / "fmnist") == [1]
    assert version_file.read_text() == "1\n"  # the served one: the serve step re-applies it
    record = json.loads((repo / "fmnist" / LAST_SELECTION_FILE).read_text())
    gate = record["promotion"]
    assert record["version"] is None and gate["promoted"] is False
    assert (gate["candidate"], gate["served_version"], gate["min_improvement"]) == ("constant", 1, 0.0)
    assert gate["served_validation_accuracy"] > gate["candidate_validation_accuracy"]
    assert gate["validation_examples"] > 0
    line = last_line(out)
    assert line.startswith("select: not promoted, version 1 stays served: constant validation accuracy ")
    assert f"{gate['candidate_validation_accuracy']:.4f}" in line
    assert f"{gate['served_validation_accuracy']:.4f}" in line
    assert "min improvement 0" in line and line.endswith("nothing published")
    assert "<- published" not in out


def test_a_candidate_better_by_more_than_the_margin_is_published(
        two_worker_export, constant_export, data_dir, tmp_path):
    repo = tmp_path / "models"
    select_and_publish([constant_export], data_dir, repo, "fmnist")  # nothing served: published
    first = json.loads((repo / "fmnist" / "1" / "selection.json").read_text())["promotion"]
    assert first["promoted"] and first["served_version"] is None

    # Better than the constant model by more than 0.05 (trained a few steps: well above a tenth).
    selection = select_and_publish([two_worker_export], data_dir, repo, "fmnist", min_improvement=0.05)

    gate = selection["promotion"]
    assert gate["candidate_validation_accuracy"] - gate["served_validation_accuracy"] > 0.05
    assert gate["promoted"] and gate["served_version"] == 1 and selection["version"] == 2
    assert json.loads((repo / "fmnist" / "2" / "selection.json").read_text()) == selection
    assert json.loads((repo / "fmnist" / LAST_SELECTION_FILE).read_text()) == selection


def test_a_candidate_no_better_than_the_margin_is_not_published(two_worker_export, data_dir, tmp_path):
    repo = tmp_path / "models"
    select_and_publish([two_worker_export], data_dir, repo, "fmnist")

    # The same model again: equal, so 0 lets it through and any positive margin does not.
    kept = select_and_publish([two_worker_export], data_dir, repo, "fmnist", min_improvement=0.001)
    again = select_and_publish([two_worker_export], data_dir, repo, "fmnist")

    assert kept["version"] is None and not kept["promotion"]["promoted"]
    assert (kept["promotion"]["candidate_validation_accuracy"]
            == kept["promotion"]["served_validation_accuracy"])
    assert again["version"] == 2 and model_repository.versions(repo, "fmnist") == [1, 2]


def test_cli_refuses_a_margin_outside_0_to_1(two_worker_export, data_dir, tmp_path, capsys):
    status, _, err = run_select(capsys, "--candidates", two_worker_export, "--data-dir", data_dir,
                                "--model-repo", tmp_path / "models", "--min-improvement", "1.5")
    assert status == 2
    assert last_line(err) == ("select: error: --min-improvement: must be a number from 0 to 1, "
                                        "got 1.5")
    assert not (tmp_path / "models").exists()


def test_after_a_rollback_the_gate_compares_with_the_served_version_not_the_newest(
        two_worker_export, constant_export, data_dir, tmp_path):
    repo = tmp_path / "models"
    select_and_publish([two_worker_export], data_dir, repo, "fmnist")
    model_repository.publish(constant_export, repo, "fmnist")  # version 2, worse, then rolled back:
    model_repository.write_rollout(repo / "fmnist", model_repository.RolloutState(1))

    # The same model as version 1 with a positive margin: not better than the served version 1,
    # though far better than the newest version 2.
    kept = select_and_publish([two_worker_export], data_dir, repo, "fmnist", min_improvement=0.001)

    assert kept["promotion"]["served_version"] == 1
    assert kept["version"] is None and not kept["promotion"]["promoted"]
