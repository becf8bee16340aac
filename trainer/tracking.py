"""Experiment tracking in MLflow: each variant's training is one run, selection one more, each published
version a version of the registered model, whose aliases follow the rollout (`champion` the stable
version, `challenger` a canary). MLflow records and links; the model repository stays what serving
reads.

The store is MLflow's own MLFLOW_TRACKING_URI (the local engine sets its embedded SQLite store unless
the user set one; the stacks set their tracking server's); unset, nothing is tracked. The runs of one
pipeline run share a tag (common.tracking_names.PIPELINE_RUN_TAG), which a UI filter finds.

Tracking never stops training: the first call that fails is one warning line on stderr naming what it
was doing, and after it this process tracks nothing more (metrics.json holds the figures either way).
MLflow's client retries a failing request for minutes by default; here it fails within
REQUEST_TIMEOUT_SECONDS, once.

MLflow is imported by a process that tracks, when it starts to: its import takes seconds, which a
command line or an untracked step would otherwise pay for nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence, TypeVar
from urllib.parse import urlsplit

from common import tracking_names as names

if TYPE_CHECKING:
    from mlflow import MlflowClient

# MLflow reads these when it first makes a request; a user's own values win.
REQUEST_TIMEOUT_SECONDS = 10
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                   "MLFLOW_HTTP_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_SECONDS)}
DEFAULT_EXPERIMENT = "dist-ml"  # without MLFLOW_EXPERIMENT_NAME (the engines set the config's)
# MLflow's own INFO lines (a new store's tables, each migration) would be every step's noise.
QUIET_LOGGERS = ("mlflow", "alembic")
RUN_ID_FILE = "mlflow-run-id"  # in a variant's checkpoint directory while its training is unfinished
FINISHED, RUNNING, FAILED, KILLED = "FINISHED", "RUNNING", "FAILED", "KILLED"

Result = TypeVar("Result")


def is_mlflow_error(error: Exception, *codes: str) -> bool:
    """An MlflowException with one of `codes` (its error_code), without importing MLflow to ask."""
    return getattr(error, "error_code", None) in codes


class Tracking:
    """One process's link to MLflow, or to nothing (`client` None). Every call goes through `attempt`."""

    def __init__(self, who: str, client: MlflowClient | None, environ: Mapping[str, str] = os.environ):
        self.who = who
        self.client = client
        self.pipeline_run = environ.get(names.PIPELINE_RUN_ENV)
        self.experiment_name = environ.get(names.EXPERIMENT_ENV)
        self.artifact_root = environ.get(names.ARTIFACT_ROOT_ENV)
        self._experiment_id: str | None = None

    @classmethod
    def from_environment(cls, who: str, environ: Mapping[str, str] = os.environ) -> Tracking:
        tracked = cls(who, None, environ)
        if uri := environ.get(names.TRACKING_URI_ENV):
            tracked.client = tracked.open(uri)
        return tracked

    def open(self, uri: str) -> MlflowClient | None:
        """MLflow's client of the store at `uri`, or None (the one warning). For a database MLflow opens
        the store right here: it creates the tables of a new one and refuses one whose schema is older
        than the installed MLflow, a path it cannot create fails, and each is a failing store too."""
        for key, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(key, value)
        for logger in QUIET_LOGGERS:
            logging.getLogger(logger).setLevel(logging.WARNING)
        from mlflow import MlflowClient  # noqa: PLC0415  (the module's docstring says why here)
        try:
            return MlflowClient(tracking_uri=uri)
        except Exception as error:  # noqa: BLE001  (any failure of the store: tracking must not stop training)
            self.warn("opening the tracking store", error)
            return None

    @property
    def on(self) -> bool:
        return self.client is not None

    def attempt(self, what: str, call: Callable[[], Result]) -> Result | None:
        """`call()`, or None when tracking is off or the call fails: then one warning, and off."""
        if self.client is None:
            return None
        try:
            return call()
        except Exception as error:  # noqa: BLE001  (any failure of the store: tracking must not stop training)
            self.warn(what, error)
            self.client = None
            return None

    def warn(self, what: str, error: Exception) -> None:
        """The one line a failing store costs the step."""
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        print(f"{self.who}: warning: MLflow tracking is off for this step: {what} failed: "
              f"{type(error).__name__}: {first_line}", file=sys.stderr, flush=True)

    # Experiment and runs -----------------------------------------------------------------------------

    def experiment_id(self) -> str:
        """The experiment (MLFLOW_EXPERIMENT_NAME, else DEFAULT_EXPERIMENT), created on first use with
        the artifact root the engine chose; a parallel step creating it first is no error."""
        if self._experiment_id is None:
            name = self.experiment_name or DEFAULT_EXPERIMENT
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                try:
                    self._experiment_id = self.client.create_experiment(
                        name, self.artifact_root, tags={names.EXPERIMENT_KIND_TAG: names.MODEL_TRAINING_KIND})
                except Exception:  # noqa: BLE001  (created meanwhile by another step: look again)
                    experiment = self.client.get_experiment_by_name(name)
                    if experiment is None:
                        raise
            if experiment is not None:
                self._experiment_id = experiment.experiment_id
        return self._experiment_id

    def tags(self, step: str, extra: Mapping[str, str] = {}) -> dict[str, str]:
        tags = {names.STEP_TAG: step, **extra}
        if self.pipeline_run:
            tags[names.PIPELINE_RUN_TAG] = self.pipeline_run
        return tags

    def start_run(self, run_name: str, tags: Mapping[str, str]) -> str | None:
        return self.attempt(f"starting run {run_name}", lambda: self.client.create_run(
            self.experiment_id(), run_name=run_name, tags=dict(tags)).info.run_id)

    def step_run(self, run_name: str, tags: Mapping[str, str]) -> str | None:
        """The run of this pipeline run's step: the one an earlier attempt started (Argo retrying the
        step), running again, else a new one. Without a pipeline run to tell attempts apart, a new one."""
        if self.pipeline_run and self.on:
            query = (f"tags.`{names.STEP_TAG}` = '{tags[names.STEP_TAG]}' and "
                     f"tags.`{names.PIPELINE_RUN_TAG}` = '{self.pipeline_run}'")
            found = self.attempt(f"looking for run {run_name}", lambda: self.client.search_runs(
                [self.experiment_id()], filter_string=query, max_results=1))
            if found:
                return self.resume_run(found[0].info.run_id)
        return self.start_run(run_name, tags)

    def resume_run(self, run_id: str) -> str | None:
        """The run `run_id` marked running again; None when the store no longer has it."""
        def resume() -> str | None:
            try:
                self.client.get_run(run_id)
            except Exception as error:  # noqa: BLE001
                if not is_mlflow_error(error, "RESOURCE_DOES_NOT_EXIST"):
                    raise
                return None
            self.client.update_run(run_id, status=RUNNING)
            return run_id
        return self.attempt(f"resuming run {run_id}", resume)

    def log_params(self, run_id: str, params: Mapping[str, object]) -> None:
        if not self.on:
            return
        from mlflow.entities import Param  # noqa: PLC0415
        self.attempt("logging parameters", lambda: self.client.log_batch(
            run_id, params=[Param(key, str(value)) for key, value in params.items()]))

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        if not self.on:
            return
        from mlflow.entities import Metric  # noqa: PLC0415
        now = int(time.time() * 1000)
        self.attempt("logging metrics", lambda: self.client.log_batch(
            run_id, metrics=[Metric(key, float(value), now, step) for key, value in metrics.items()]))

    def log_artifacts(self, run_id: str, paths: Sequence[Path]) -> None:
        for path in paths:
            if path.exists():
                self.attempt(f"uploading {path.name}",
                             lambda path=path: self.client.log_artifact(run_id, str(path)))

    def log_dict(self, run_id: str, value: dict, file_name: str) -> None:
        self.attempt(f"uploading {file_name}", lambda: self.client.log_dict(run_id, value, file_name))

    def finish(self, run_id: str, status: str = FINISHED) -> None:
        self.attempt("ending the run", lambda: self.client.set_terminated(run_id, status))


OFF = Tracking("untracked", None)


@contextlib.contextmanager
def ends_with_its_step(tracking: Tracking, run_id: str | None) -> Iterator[None]:
    """A run that ends with its step when the step does not finish: KILLED when the process is stopped
    (SIGTERM's SystemExit, Ctrl-C), FAILED when the step raises. A resumed training runs it again."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        if run_id:
            tracking.finish(run_id, KILLED)
        raise
    except Exception:
        if run_id:
            tracking.finish(run_id, FAILED)
        raise


# A variant's training ------------------------------------------------------------------------------

def begin_training(tracking: Tracking, variant: str, checkpoint_dir: Path, params: Mapping[str, object],
                   resumes: bool = True) -> str | None:
    """The run of `variant`'s training: the one its checkpoint directory names when training resumes
    there from a backup (a restarted set, a retried step), else a new one with `params`. A training
    that begins again at epoch 1 where a run was left unfinished ends that run FAILED (unless it ended
    otherwise already) and its new run names it (RESTARTED_FROM_TAG): the epochs are not logged twice
    at the same steps of one run."""
    run_id_file = checkpoint_dir / RUN_ID_FILE
    left = run_id_file.read_text().strip() if run_id_file.is_file() else None
    if left and resumes and (run_id := tracking.resume_run(left)):
        return run_id
    extra = {names.VARIANT_TAG: variant}
    if left and not resumes and tracking.attempt(
            f"ending run {left}", lambda: end_if_running(tracking.client, left, FAILED)):
        extra[names.RESTARTED_FROM_TAG] = left
    run_id = tracking.start_run(variant, tracking.tags("train", extra))
    if run_id is not None:
        tracking.log_params(run_id, params)
        run_id_file.write_text(run_id + "\n")
    return run_id


def end_if_running(client: MlflowClient, run_id: str, status: str) -> bool:
    """Ends `run_id` with `status` unless it has ended (a stop's KILLED stays); False when the store
    no longer has it."""
    try:
        run = client.get_run(run_id)
    except Exception as error:  # noqa: BLE001
        if is_mlflow_error(error, "RESOURCE_DOES_NOT_EXIST"):
            return False
        raise
    if run.info.status == RUNNING:
        client.set_terminated(run_id, status)
    return True


def end_training(tracking: Tracking, run_id: str, checkpoint_dir: Path, metrics: Mapping[str, float],
                 artifacts: Sequence[Path]) -> None:
    """The run's final figures and files; the next training in this directory starts a new run. A run
    whose tracking turned off on the way keeps its id in the directory, so the next training there ends
    it (begin_training) rather than leaving it RUNNING."""
    tracking.log_metrics(run_id, metrics)
    tracking.log_artifacts(run_id, artifacts)
    tracking.finish(run_id)
    if tracking.on:
        (checkpoint_dir / RUN_ID_FILE).unlink(missing_ok=True)


# Selection, the registry and the rollout --------------------------------------------------------------

def repository_of(uri: str) -> str:
    """The model repository a published version's URI is in: the URI without its last part, the version."""
    return uri.rstrip("/").rpartition("/")[0]


def registered_versions(client: MlflowClient, model_name: str, repository: str) -> dict[int, str]:
    """Our version numbers -> MLflow's, for the versions of `model_name` published to `repository`: a
    version is ours by its URI, so another repository's version 1 on the same server is not."""
    found = client.search_model_versions(f"name = '{model_name}'")
    return {int(number): version.version for version in found
            if (number := version.tags.get(names.VERSION_TAG, "")).isdigit()
            and version.tags.get(names.URI_TAG) == f"{repository.rstrip('/')}/{number}"}


def register_version(tracking: Tracking, model_name: str, version: int, uri: str, run_id: str | None,
                     training_runs: Sequence[str], selection_run: str | None = None) -> str | None:
    """Our published `version` as a version of the registered model `model_name` (created if need be),
    its source `uri` in our model repository, linked to the selection's run and the training runs it
    came from; a retried step finds it registered already. MLflow's version number, or None."""
    def register() -> str:
        ours = registered_versions(tracking.client, model_name, repository_of(uri))
        if (existing := ours.get(version)) is not None:
            return existing
        try:
            tracking.client.create_registered_model(model_name)
        except Exception as error:  # noqa: BLE001
            if not is_mlflow_error(error, "RESOURCE_ALREADY_EXISTS"):
                raise
        tags = {names.VERSION_TAG: str(version), names.URI_TAG: uri,
                names.TRAINING_RUNS_TAG: ",".join(training_runs)}
        source, linked = uri, run_id
        if urlsplit(uri).scheme in ("", "file") and urlsplit(tracking.client.tracking_uri).scheme in (
                "http", "https") and selection_run is not None:
            # A tracking server refuses a local path as a source unless it lies in the linked run's
            # artifacts (it would serve it): the selection run stands for it, the tag keeps the path.
            source, linked = f"runs:/{selection_run}/selection.json", selection_run
        return tracking.client.create_model_version(
            model_name, source, run_id=linked, tags=tags,
            description=f"dist-ml version {version} of {model_name}: {uri}").version
    return tracking.attempt(f"registering version {version} of {model_name}", register)


def follow_rollout(tracking: Tracking, model_name: str, repository: str, stable: int,
                   canary: int | None) -> None:
    """The aliases as the rollout of `repository`'s versions stands: `champion` on the stable version,
    `challenger` on the canary (removed when there is none, if it named one of ours). A version
    published while tracking was off has no alias to take."""
    def move() -> None:
        registered = registered_versions(tracking.client, model_name, repository)
        if stable in registered:
            tracking.client.set_registered_model_alias(model_name, names.CHAMPION, registered[stable])
        if canary is not None and canary in registered:
            tracking.client.set_registered_model_alias(model_name, names.CHALLENGER, registered[canary])
        elif tracking.client.get_registered_model(model_name).aliases.get(names.CHALLENGER) in (
                registered.values()):
            try:
                tracking.client.delete_registered_model_alias(model_name, names.CHALLENGER)
            except Exception as error:  # noqa: BLE001
                if not is_mlflow_error(error, "RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise
    tracking.attempt(f"moving model {model_name}'s aliases", move)


def track_selection(tracking: Tracking, selection: dict, runs: Mapping[str, str], source_uri: str | None,
                    artifacts: Sequence[Path]) -> None:
    """Selection as one run: every candidate's validation and test figures, the ensemble's, the
    decision and why; a published version registered, linked to the runs it came from (`runs`: each
    tracked candidate's training run)."""
    run_id = tracking.step_run("select", tracking.tags("select"))
    if run_id is None:
        return
    with ends_with_its_step(tracking, run_id):
        log_selection(tracking, run_id, selection, runs, source_uri, artifacts)
    tracking.finish(run_id)


def log_selection(tracking: Tracking, run_id: str, selection: dict, runs: Mapping[str, str],
                  source_uri: str | None, artifacts: Sequence[Path]) -> None:
    promotion = selection["promotion"]
    tracking.log_params(run_id, {
        "candidates": ",".join(candidate["name"] for candidate in selection["candidates"]),
        "ranking": selection["ranking"], "winner": selection["winner"],
        "promoted": promotion["promoted"], "published_version": selection["version"],
        "validation_examples": selection["validation_examples"], "test_examples": selection["test_examples"],
    })
    tracking.attempt("tagging the decision", lambda: tracking.client.set_tag(
        run_id, names.DECISION_TAG, promotion["reason"]))
    tracking.log_metrics(run_id, {f"{candidate['name']}.{figure}": candidate[figure]
                                  for candidate in selection["candidates"]
                                  for figure in ("validation_accuracy", "validation_loss",
                                                 "test_accuracy", "test_loss")})
    tracking.log_dict(run_id, selection, "selection.json")
    tracking.log_artifacts(run_id, artifacts)
    if selection["version"] is not None and source_uri is not None:
        winner = selection["winner"]
        members = next((c.get("members", []) for c in selection["candidates"] if c["name"] == winner), [])
        came_from = [runs[name] for name in (members or [winner]) if name in runs]
        linked = runs.get(winner, run_id)  # a single variant's training run; an ensemble's selection
        register_version(tracking, selection["model_name"], selection["version"], source_uri, linked,
                         came_from, run_id)
