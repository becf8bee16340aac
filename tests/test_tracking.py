"""Experiment tracking (trainer.tracking, pipeline.local_tracking) against MLflow's own store: a
training run continued when training resumes, selection's comparison and the registered version,
aliases that follow the rollout, the local engine's choice of store, and a store that fails costing
one warning line and nothing else."""

from __future__ import annotations

import re
import shutil
import socket
import sqlite3
import time
from pathlib import Path

import mlflow
import pytest
from conftest import built_once
from mlflow import MlflowClient

from common import tracking_names as names
from pipeline import local_canary, local_tracking
from pipeline.config import ConfigError, load_config
from trainer import model_repository, tracking
from trainer.atomic import commit
from trainer.model_repository import RolloutState

MODEL = "fmnist"


@pytest.fixture(scope="session")
def new_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with the installed MLflow's tables, made once per run: each test's store is a copy
    (making the tables runs every one of MLflow's migrations, each synced to disk)."""
    def make(directory: Path) -> None:
        MlflowClient(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}")

    return built_once(tmp_path_factory, "mlflow-tables", make) / "mlflow.db"


def copy_of(database: Path, uri: str) -> str:
    """`database` copied to where the SQLite store `uri` lives: a URI this process has not opened, so
    MLflow checks the copy's schema when it first does."""
    path = Path(uri.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True)
    shutil.copy(database, path)
    return uri


@pytest.fixture
def store(tmp_path, new_database) -> dict[str, str]:
    """An embedded store's environment, as the local engine gives its steps, prepared as it prepares it."""
    config = load_config(None, {"storageRoot": str(tmp_path / "root")})
    env = local_tracking.environment(config, "run-1", environ={})
    copy_of(new_database, env[names.TRACKING_URI_ENV])
    local_tracking.prepare(env)
    return env


def client_of(env: dict[str, str]) -> MlflowClient:
    return MlflowClient(tracking_uri=env[names.TRACKING_URI_ENV])


def selection(version: int | None, winner: str = "cnn") -> dict:
    return {"model_name": MODEL, "ranking": "validation accuracy", "validation_examples": 45,
            "test_examples": 100, "winner": winner, "version": version,
            "promotion": {"promoted": version is not None, "reason": "first version"},
            "candidates": [{"name": name, "validation_accuracy": 0.8, "validation_loss": 0.5,
                            "test_accuracy": 0.7, "test_loss": 0.6} for name in ("cnn", "cnn_gap")]}


def publish(env: dict[str, str], root: Path, version: int, run: str | None = None) -> None:
    """What select leaves under a storage root: a committed version in the model repository,
    registered as its release with its training run."""
    version_dir = root / "models" / MODEL / str(version)
    version_dir.mkdir(parents=True)
    commit(version_dir)
    runs = {"cnn": run} if run else {}
    release = model_repository.release_dir(root / "releases", MODEL, version)
    # Each version its pipeline run's: a select step's retries share one run.
    pipeline_run = {names.PIPELINE_RUN_ENV: f"{root.name}-{version}"}
    tracking.track_selection(tracking.Tracking.from_environment("select", {**env, **pipeline_run}),
                             selection(version), runs, release.as_uri(), [])


def aliases(env: dict[str, str]) -> dict[str, str]:
    """Alias -> our version number."""
    model = client_of(env).get_registered_model(MODEL)
    return {alias: client_of(env).get_model_version(MODEL, number).tags[names.VERSION_TAG]
            for alias, number in model.aliases.items()}


def test_a_training_run_is_continued_where_training_resumes_and_a_finished_one_is_not(store, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    first = tracking.begin_training(tracking.Tracking.from_environment("train", store), "cnn", checkpoints,
                                    {"variant": "cnn", "epochs": 3})
    tracked = tracking.Tracking.from_environment("train", store)
    tracked.log_metrics(first, {"loss": 1.5}, step=1)
    # The set restarted: the new chief finds the run in the checkpoint directory.
    resumed = tracking.begin_training(tracked, "cnn", checkpoints, {"variant": "cnn", "epochs": 3})
    assert resumed == first
    assert client_of(store).get_run(first).info.status == tracking.RUNNING
    tracked.log_metrics(first, {"loss": 1.0}, step=2)
    metrics = tmp_path / "metrics.json"
    metrics.write_text("{}\n")
    tracking.end_training(tracked, first, checkpoints, {"validation_accuracy": 0.8}, [metrics])
    run = client_of(store).get_run(first)
    assert run.info.status == tracking.FINISHED
    experiment = client_of(store).get_experiment(run.info.experiment_id)
    assert experiment.tags[names.EXPERIMENT_KIND_TAG] == names.MODEL_TRAINING_KIND  # the UI opens its runs
    assert run.data.params == {"variant": "cnn", "epochs": "3"}
    assert run.data.tags[names.PIPELINE_RUN_TAG] == "run-1" and run.data.tags[names.VARIANT_TAG] == "cnn"
    assert [m.value for m in client_of(store).get_metric_history(first, "loss")] == [1.5, 1.0]
    assert [a.path for a in client_of(store).list_artifacts(first)] == ["metrics.json"]
    # The next training in that directory is a run of its own, and so is one whose run the store lost.
    second = tracking.begin_training(tracked, "cnn", checkpoints, {"variant": "cnn"})
    assert second != first
    (checkpoints / tracking.RUN_ID_FILE).write_text("0" * 32 + "\n")  # a run this store never had
    third = tracking.begin_training(tracked, "cnn", checkpoints, {"variant": "cnn"})
    assert third not in (first, second, None) and tracked.on


def test_selection_is_a_run_and_the_published_version_is_registered_with_its_links(store, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv(names.TRACKING_URI_ENV, store[names.TRACKING_URI_ENV])  # for mlflow.search_runs
    training = tracking.begin_training(tracking.Tracking.from_environment("train", store), "cnn",
                                       tmp_path, {"variant": "cnn"})
    publish(store, tmp_path, 1, training)
    (select_run,) = mlflow.search_runs(experiment_names=[MODEL], output_format="list",
                                       filter_string=f"tags.`{names.STEP_TAG}` = 'select'")
    assert select_run.data.params["winner"] == "cnn" and select_run.data.params["published_version"] == "1"
    assert select_run.data.metrics["cnn_gap.test_accuracy"] == 0.7
    assert select_run.data.tags[names.DECISION_TAG] == "first version"
    (version,) = client_of(store).search_model_versions(f"name = '{MODEL}'")
    assert version.run_id == training  # the winner's training run
    assert version.tags[names.VERSION_TAG] == "1" and version.tags[names.TRAINING_RUNS_TAG] == training
    assert version.source == model_repository.release_dir(tmp_path / "releases", MODEL, 1).as_uri()
    # A retried select registers nothing twice.
    tracking.register_version(tracking.Tracking.from_environment("select", store), MODEL, 1,
                              version.source, training, [training])
    assert len(client_of(store).search_model_versions(f"name = '{MODEL}'")) == 1


def test_the_aliases_follow_the_rollout_through_canary_promote_and_rollback(store, tmp_path):
    tracked = tracking.Tracking.from_environment("rollout", store)
    base = tmp_path / "models" / MODEL
    publish(store, tmp_path, 1)
    local_canary.serve_state(base, RolloutState(1), tracked)
    assert aliases(store) == {names.CHAMPION: "1"}
    publish(store, tmp_path, 2)
    local_canary.serve_state(base, RolloutState(1, 2, 10), tracked)
    assert aliases(store) == {names.CHAMPION: "1", names.CHALLENGER: "2"}
    local_canary.by_hand(base, promote=True, tracked=tracked)
    assert aliases(store) == {names.CHAMPION: "2"}
    local_canary.by_hand(base, promote=False, tracked=tracked)  # back to the version before
    assert aliases(store) == {names.CHAMPION: "1"}
    assert model_repository.read_rollout(base) == RolloutState(1)


def test_two_storage_roots_on_one_store_never_share_a_version(store, tmp_path):
    """A laptop's `make demo` and a team's pipeline, each its own model repository, tracked by one
    store: each root's version 1 is a registered version of its own, and each rollout moves the
    aliases to its own repository's version."""
    roots = {name: tmp_path / name for name in ("laptop", "team")}
    tracked = tracking.Tracking.from_environment("rollout", store)
    for root in roots.values():
        publish(store, root, 1)
    found = client_of(store).search_model_versions(f"name = '{MODEL}'")
    assert sorted(version.tags[names.URI_TAG] for version in found) == sorted(
        model_repository.release_dir(root / "releases", MODEL, 1).as_uri() for root in roots.values())
    for root in roots.values():
        local_canary.serve_state(root / "models" / MODEL, RolloutState(1), tracked)
        champion = client_of(store).get_model_version_by_alias(MODEL, names.CHAMPION)
        assert champion.tags[names.URI_TAG] == local_canary.release_repository(root / "models" / MODEL) + "/1"
    # The team's canary is the team's; the laptop's rollout without one leaves it alone.
    publish(store, roots["team"], 2)
    local_canary.serve_state(roots["team"] / "models" / MODEL, RolloutState(1, 2, 10), tracked)
    local_canary.serve_state(roots["laptop"] / "models" / MODEL, RolloutState(1), tracked)
    assert aliases(store) == {names.CHAMPION: "1", names.CHALLENGER: "2"}


def run_of(env: dict[str, str], run_id: str):
    return client_of(env).get_run(run_id)


@pytest.mark.parametrize(("stopped_by", "status"), [(RuntimeError("a worker was lost"), tracking.FAILED),
                                                    (SystemExit(143), tracking.KILLED),
                                                    (KeyboardInterrupt(), tracking.KILLED)])
def test_a_training_that_does_not_finish_ends_its_run_failed_or_killed_and_a_resume_runs_it_again(
    store, tmp_path, stopped_by, status
):
    tracked = tracking.Tracking.from_environment("train", store)
    run_id = tracking.begin_training(tracked, "cnn", tmp_path, {"variant": "cnn"})
    with pytest.raises(type(stopped_by)), tracking.ends_with_its_step(tracked, run_id):
        raise stopped_by
    assert run_of(store, run_id).info.status == status
    resumed = tracking.begin_training(tracking.Tracking.from_environment("train", store), "cnn", tmp_path,
                                      {"variant": "cnn"}, resumes=True)
    assert resumed == run_id and run_of(store, run_id).info.status == tracking.RUNNING


def test_a_training_begun_again_at_epoch_1_starts_a_run_that_names_the_one_it_ends(store, tmp_path):
    """No backup to resume from (a retry after the backup was lost, or a set restarted before its first
    epoch's end): the epochs would be logged again at the same steps of the old run."""
    tracked = tracking.Tracking.from_environment("train", store)
    old = tracking.begin_training(tracked, "cnn", tmp_path, {"variant": "cnn"})
    tracked.log_metrics(old, {"loss": 2.0}, step=1)
    new = tracking.begin_training(tracked, "cnn", tmp_path, {"variant": "cnn"}, resumes=False)
    assert new not in (old, None)
    assert run_of(store, old).info.status == tracking.FAILED
    assert run_of(store, new).data.tags[names.RESTARTED_FROM_TAG] == old
    assert (tmp_path / tracking.RUN_ID_FILE).read_text().strip() == new


def test_a_run_whose_tracking_turned_off_keeps_its_id_and_the_next_training_there_ends_it(store, tmp_path):
    tracked = tracking.Tracking.from_environment("train", store)
    run_id = tracking.begin_training(tracked, "cnn", tmp_path, {"variant": "cnn"})
    tracked.client = None  # a failed call on the way: this process tracks nothing more
    tracking.end_training(tracked, run_id, tmp_path, {"validation_accuracy": 0.8}, [])
    assert (tmp_path / tracking.RUN_ID_FILE).read_text().strip() == run_id
    assert run_of(store, run_id).info.status == tracking.RUNNING
    # The next training in that directory begins at epoch 1 (a finished training leaves no backup).
    after = tracking.begin_training(tracking.Tracking.from_environment("train", store), "cnn", tmp_path,
                                    {"variant": "cnn"}, resumes=False)
    assert run_of(store, run_id).info.status == tracking.FAILED
    assert run_of(store, after).data.tags[names.RESTARTED_FROM_TAG] == run_id


def test_a_retried_selection_reuses_its_run_and_a_failing_one_ends_it_failed(store, tmp_path, monkeypatch):
    for _attempt in range(2):  # Argo's retry of the pipeline run's select step
        tracking.track_selection(tracking.Tracking.from_environment("select", store), selection(1), {},
                                 None, [])
    select_runs = mlflow_runs(store, "select")
    assert len(select_runs) == 1 and select_runs[0].info.status == tracking.FINISHED
    def broken(*_args) -> None:
        raise KeyError("winner")

    monkeypatch.setattr(tracking, "log_selection", broken)
    with pytest.raises(KeyError):
        tracking.track_selection(tracking.Tracking.from_environment("select", store), selection(1), {},
                                 None, [])
    (failed,) = mlflow_runs(store, "select")
    assert failed.info.run_id == select_runs[0].info.run_id and failed.info.status == tracking.FAILED


def mlflow_runs(env: dict[str, str], step: str) -> list:
    experiment = client_of(env).get_experiment_by_name(MODEL)
    return client_of(env).search_runs([experiment.experiment_id], f"tags.`{names.STEP_TAG}` = '{step}'")


def closed_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


def test_a_store_that_refuses_is_one_warning_and_the_step_goes_on(tmp_path, capsys, monkeypatch):
    for variable in tracking.CLIENT_DEFAULTS:
        monkeypatch.delenv(variable, raising=False)
    env = {names.TRACKING_URI_ENV: f"http://127.0.0.1:{closed_port()}", names.EXPERIMENT_ENV: MODEL}
    tracked = tracking.Tracking.from_environment("train", env)
    started = time.monotonic()
    assert tracking.begin_training(tracked, "cnn", tmp_path, {"variant": "cnn"}) is None
    tracked.log_metrics("nothing", {"loss": 1.0})
    tracking.follow_rollout(tracked, MODEL, (tmp_path / "releases" / MODEL).as_uri(), 1, None)
    assert time.monotonic() - started < tracking.REQUEST_TIMEOUT_SECONDS
    (warning,) = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith("train: warning: MLflow tracking is off for this step: "
                              "starting run cnn failed: ")
    assert not tracked.on and not (tmp_path / tracking.RUN_ID_FILE).exists()


# MLflow's first schema revision (mlflow/store/db_migrations/versions/451aebb31d03_add_metric_step.py):
# what MLflow's schema check finds in a database an older MLflow left, before `mlflow db upgrade`.
OLDEST_SCHEMA = "451aebb31d03"


@pytest.fixture
def black_hole() -> str:
    """A server that takes connections and never answers (its backlog accepts them; nothing reads):
    a read time-out, not a refusal."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def store_under_a_file(tmp_path: Path) -> str:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return f"sqlite:///{blocker}/mlflow/mlflow.db"


def store_of_an_older_mlflow(tmp_path: Path, new_database: Path) -> str:
    uri = copy_of(new_database, f"sqlite:///{tmp_path / 'old' / 'mlflow.db'}")
    with sqlite3.connect(uri.removeprefix("sqlite:///")) as connection:
        connection.execute("UPDATE alembic_version SET version_num = ?", (OLDEST_SCHEMA,))
    return uri


@pytest.mark.parametrize("failing", ["a path that cannot be created", "a schema older than MLflow's",
                                     "a black-holed host"])
def test_a_store_that_fails_to_open_costs_each_step_one_warning_and_nothing_else(
    failing, tmp_path, capsys, monkeypatch, black_hole, new_database
):
    """The pipeline's preparation, a chief's training, selection's registration and the rollout's
    aliases, each its own process on a store that cannot open: one warning each, and each goes on."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")  # a user's own value wins over ours
    uri = {"a path that cannot be created": lambda: store_under_a_file(tmp_path),
           "a schema older than MLflow's": lambda: store_of_an_older_mlflow(tmp_path, new_database),
           "a black-holed host": lambda: black_hole}[failing]()
    env = {names.TRACKING_URI_ENV: uri, names.EXPERIMENT_ENV: MODEL, names.PIPELINE_RUN_ENV: "run-1"}
    local_tracking.prepare(env)
    trained = tracking.Tracking.from_environment("train", env)
    assert tracking.begin_training(trained, "cnn", tmp_path, {"variant": "cnn"}) is None
    publish(env, tmp_path, 1)
    tracking.follow_rollout(tracking.Tracking.from_environment("rollout", env), MODEL,
                            (tmp_path / "releases" / MODEL).as_uri(), 1, None)
    warnings = capsys.readouterr().err.strip().splitlines()
    assert [line.split(":")[0] for line in warnings] == ["pipeline", "train", "select", "rollout"], warnings
    for line in warnings:
        assert ": warning: MLflow tracking is off for this step: " in line, line
    if failing != "a black-holed host":  # MLflow opens a database when its client is made
        assert all("opening the tracking store failed: " in line for line in warnings), warnings
    assert (tmp_path / "models" / MODEL / "1").is_dir() and not (tmp_path / tracking.RUN_ID_FILE).exists()


def test_without_a_store_nothing_is_tracked_or_imported_from_it(tmp_path, capsys):
    tracked = tracking.Tracking.from_environment("train", {})
    assert not tracked.on
    assert tracking.begin_training(tracked, "cnn", tmp_path, {}) is None
    assert capsys.readouterr().err == ""


def test_the_local_engine_tracks_where_mlflow_users_expect(tmp_path):
    config = load_config(None, {"storageRoot": str(tmp_path)})
    embedded = local_tracking.environment(config, "run-1", environ={})
    assert embedded[names.TRACKING_URI_ENV] == f"sqlite:///{tmp_path.resolve()}/mlflow/mlflow.db"
    assert embedded[names.ARTIFACT_ROOT_ENV] == str(tmp_path.resolve() / "mlflow" / "artifacts")
    assert embedded[names.EXPERIMENT_ENV] == MODEL and embedded[names.PIPELINE_RUN_ENV] == "run-1"
    configured = load_config(None, {"storageRoot": str(tmp_path),
                                    "tracking": {"uri": "http://mlflow.example:5000", "experiment": "x"}})
    chosen = local_tracking.environment(configured, "run-1", environ={})
    assert chosen[names.TRACKING_URI_ENV] == "http://mlflow.example:5000"
    assert chosen[names.EXPERIMENT_ENV] == "x"
    assert names.ARTIFACT_ROOT_ENV not in chosen  # the server's artifact root
    users = local_tracking.environment(configured, "run-1",
                                       environ={names.TRACKING_URI_ENV: "http://mine:5000"})
    assert users[names.TRACKING_URI_ENV] == "http://mine:5000"
    off = load_config(None, {"tracking": {"enabled": False}})
    assert local_tracking.environment(off, "run-1", environ={names.TRACKING_URI_ENV: "http://mine:5000"}) == {
        names.TRACKING_URI_ENV: ""}


@pytest.mark.parametrize("uri, problem", [
    ("ftp://mlflow.example", "is not http:// or https:// or sqlite:// or file://"),
    ("http://", "names no host"),
    ("sqlite://mlflow.db", "a SQLite store is sqlite:///<path>"),
])
def test_a_wrong_tracking_uri_is_an_error_naming_the_key(uri, problem):
    key = r"^pipeline\.tracking\.uri: must be an MLflow tracking URI: "
    with pytest.raises(ConfigError, match=key + f".*{re.escape(problem)}"):
        load_config(None, {"tracking": {"uri": uri}})
