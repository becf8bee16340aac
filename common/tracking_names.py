"""The names experiment tracking shares across the project, with the standard library alone: the
trainer and the rollout steps log to MLflow (trainer.tracking), the pipeline's config and the local
engine choose the store, and the stacks' engines and steps carry it to the pods in their environment.

MLflow's own variables are MLflow's: MLFLOW_TRACKING_URI picks the store, MLFLOW_EXPERIMENT_NAME the
experiment. Ours say what MLflow cannot know: which pipeline run a step belongs to (a UI filter on
its tag finds one run's training, selection and versions), and, for a store on local disk, where a
new experiment keeps its artifacts (MLflow's default is ./mlruns, beside whatever directory the
process started in).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
PIPELINE_RUN_ENV = "DIST_ML_PIPELINE_RUN"
ARTIFACT_ROOT_ENV = "DIST_ML_MLFLOW_ARTIFACTS"

# Under a storage root (the local engine's, or the volume a cluster's tracking server mounts).
EMBEDDED_DIR = "mlflow"
EMBEDDED_DATABASE = "mlflow.db"
EMBEDDED_ARTIFACTS = "artifacts"

# Tags on runs and model versions; aliases on the registered model, following the rollout.
PIPELINE_RUN_TAG = "dist_ml.pipeline_run"
STEP_TAG = "dist_ml.step"  # train or select
VARIANT_TAG = "dist_ml.variant"
RESTARTED_FROM_TAG = "dist_ml.restarted_from"  # a training that began again at epoch 1: the run it ended
DECISION_TAG = "dist_ml.decision"  # on selection's run: why it published or kept the served version
VERSION_TAG = "dist_ml.version"  # our model repository's version number, on an MLflow model version
URI_TAG = "dist_ml.uri"  # where that version is in our model repository
TRAINING_RUNS_TAG = "dist_ml.training_runs"  # the MLflow runs a published version was trained in
# MLflow's UI opens an experiment of this kind on its runs (model training), not on GenAI traces.
EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
CHAMPION = "champion"  # the stable version: what serving answers with
CHALLENGER = "challenger"  # a canary beside it, until promoted or rolled back
RUN_ID_KEY = "mlflow_run_id"  # a training run's id in its export's metrics.json, for selection's links

# The tracking server the stacks run (infra/tracking.py): its Service in the pipeline's namespace.
SERVER_NAME = "mlflow"
SERVER_PORT = 5000

SERVER_SCHEMES = ("http", "https")
LOCAL_SCHEMES = ("sqlite", "file", "postgresql", "mysql")
DATABASE_URI = re.compile(r"^(sqlite|postgresql|mysql)(\+\w+)?$")


def tracking_uri_problem(uri: str, server_only: bool = False) -> str | None:
    """What is wrong with `uri` as MLflow's tracking URI, or None: a server's http(s) address with a
    host, or (unless `server_only`, as for pods, which reach no one's local disk) a database or a
    directory MLflow opens itself."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in SERVER_SCHEMES:
        return None if parts.hostname else f"{uri!r} names no host"
    allowed = SERVER_SCHEMES if server_only else SERVER_SCHEMES + LOCAL_SCHEMES
    local = DATABASE_URI.match(scheme) or scheme == "file"
    if server_only or not local:
        return f"{uri!r} is not {' or '.join(f'{name}://' for name in allowed)}"
    if scheme.startswith("sqlite") and not uri.split(":", 1)[1].startswith("///"):
        return f"{uri!r}: a SQLite store is sqlite:///<path>"
    return None


def embedded_uri(storage_root: str) -> str:
    """The local engine's own store: SQLite under its storage root."""
    return f"sqlite:///{Path(storage_root, EMBEDDED_DIR, EMBEDDED_DATABASE).resolve()}"


def embedded_artifacts(storage_root: str) -> str:
    """Where the embedded store's experiments keep their artifacts."""
    return str(Path(storage_root, EMBEDDED_DIR, EMBEDDED_ARTIFACTS).resolve())


def server_uri(namespace: str) -> str:
    """The stacks' tracking server, as the pipeline's pods reach it."""
    return f"http://{SERVER_NAME}.{namespace}.svc:{SERVER_PORT}"
