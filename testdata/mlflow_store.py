"""Makes testdata/mlflow-2.17.2/mlflow.db: a tracking store as an older MLflow left it (its schema,
a finished run with a parameter and a metric's steps, a registered version under an alias), which the
tests migrate with the tracking server's own migration and read with today's MLflow.

    python testdata/mlflow_store.py testdata/mlflow-2.17.2

with that MLflow's python, an environment of its own (`uv venv -p 3.11 /tmp/old && uv pip install
--python /tmp/old/bin/python mlflow-skinny==2.17.2 'sqlalchemy<2.1' alembic`); it refuses another.

Only MLflow's client is used: what the store holds is what that version wrote.
"""

from __future__ import annotations

import sys
from pathlib import Path

MLFLOW_VERSION = "2.17.2"
STORE = Path(__file__).parent / f"mlflow-{MLFLOW_VERSION}" / "mlflow.db"
EXPERIMENT = "fmnist"
RUN_NAME = "train-cnn"
PARAM = ("epochs", "3")
METRIC = "val_accuracy"
METRIC_STEPS = {1: 0.71, 2: 0.80, 3: 0.84}
MODEL = "fmnist"
ALIAS = "champion"


def make(directory: Path) -> None:
    import mlflow
    from mlflow import MlflowClient

    if mlflow.__version__ != MLFLOW_VERSION:
        sys.exit(f"this is MLflow {mlflow.__version__}; the store is made by {MLFLOW_VERSION}")
    directory.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{directory.resolve() / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location="mlflow-artifacts:/1")
    run_id = client.create_run(experiment, run_name=RUN_NAME).info.run_id
    client.log_param(run_id, *PARAM)
    for step, value in METRIC_STEPS.items():
        client.log_metric(run_id, METRIC, value, step=step)
    client.set_terminated(run_id, "FINISHED")
    client.create_registered_model(MODEL)
    version = client.create_model_version(MODEL, source=f"runs:/{run_id}/model", run_id=run_id)
    client.set_registered_model_alias(MODEL, ALIAS, version.version)


if __name__ == "__main__":
    make(Path(sys.argv[1]))
