"""The local engine's experiment tracking: which MLflow store its steps record into (trainer.tracking
records), and that store made ready before they start.

MLflow's own MLFLOW_TRACKING_URI, when the user set it, wins; then `pipeline.tracking.uri`; else the
embedded store, SQLite and an artifact directory under the storage root (no server to start;
`make mlflow-ui` opens MLflow's UI on it). `pipeline.tracking.enabled: false` records nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from common.tracking_names import (
    ARTIFACT_ROOT_ENV,
    EXPERIMENT_ENV,
    PIPELINE_RUN_ENV,
    TRACKING_URI_ENV,
    embedded_artifacts,
    embedded_uri,
)
from pipeline.config import PipelineConfig
from trainer import tracking


def environment(config: PipelineConfig, pipeline_run: str, environ: Mapping[str, str] = os.environ
                ) -> dict[str, str]:
    """The variables the steps of one run track with (an empty MLFLOW_TRACKING_URI: not at all)."""
    if not config.tracking.enabled:
        return {TRACKING_URI_ENV: ""}
    embedded = embedded_uri(config.storage_root)
    uri = environ.get(TRACKING_URI_ENV) or config.tracking.uri or embedded
    env = {TRACKING_URI_ENV: uri, EXPERIMENT_ENV: environ.get(EXPERIMENT_ENV) or config.experiment,
           PIPELINE_RUN_ENV: pipeline_run}
    if uri == embedded:
        env[ARTIFACT_ROOT_ENV] = embedded_artifacts(config.storage_root)
    return env


def of_what_was_recorded(config: PipelineConfig, command: str) -> tracking.Tracking:
    """`promote` and `rollback` by hand: the store the runs under the storage root were tracked in, or
    none when the embedded one was never made there (nothing registered: no alias to move, and no
    reason to create a database)."""
    env = environment(config, command)
    uri = env[TRACKING_URI_ENV]
    if uri == embedded_uri(config.storage_root) and not Path(uri.removeprefix("sqlite:///")).is_file():
        return tracking.OFF
    return tracking.Tracking.from_environment(command, env)


def prepare(env: Mapping[str, str]) -> tracking.Tracking:
    """The store's tables and the experiment, made once here: the steps that start together would
    otherwise race to create them. A store that fails is the one warning, and the run goes on."""
    if env.get(ARTIFACT_ROOT_ENV):
        Path(env[ARTIFACT_ROOT_ENV]).mkdir(parents=True, exist_ok=True)
    tracked = tracking.Tracking.from_environment("pipeline", env)
    tracked.attempt("opening the tracking store", tracked.experiment_id)
    return tracked
