"""The whole workflow as a user submits it, every pod run for real: a Workflow of the stack's
WorkflowTemplate (nothing of ours substituted), Argo's executor in each step pod, ingest from the
mirror, a TrainJob whose two trainer pods find each other by JobSet's hostnames (one of them killed after
the first epoch, the set resumed), selection, the InferenceService's predictor Ready through its probes,
predictions through its Service checked against the images' labels, the tracking server's runs and
`champion`; then a second run whose ingest is memoized. The first run is conftest's `first_run`."""

from __future__ import annotations

import re

import numpy as np
from e2e_runs import (
    CHECKED_IMAGES,
    MIN_ACCURACY,
    check_served_classes,
    disagreements,
    output,
    predictor_url,
    run_workflow,
    tags_of,
    tracking_get,
    trainer_pods,
)
from e2e_stack import NAMESPACE

from cluster_steps.inference_service import model_version
from common import tracking_names
from common.cluster_names import INFERENCE_SERVICE
from engines.trainjob import NODE_CONTAINER, RESTART_ATTEMPT_LABEL
from tools.e2e import holdout_pngs
from trainer.fashion_mnist import CLASS_NAMES

RESUMED = re.compile(r"resuming from backup at epoch (\d+)/(\d+)")
EPOCH_METRIC = "epoch_seconds"  # trainer.train.EpochTracking logs it at every epoch's end


def resumed_at(api, pods: dict[int, dict]) -> re.Match | None:
    return RESUMED.search(api.core.read_namespaced_pod_log(pods[0]["metadata"]["name"], NAMESPACE,
                                                           container=NODE_CONTAINER))


def test_a_trainer_killed_after_its_first_epoch_resumes_from_its_backup(cluster, first_run, say):
    """A worker SIGKILLed after the first epoch; JobSet restarted the set, and its two new pods resumed
    from the backup on the real node and ended Succeeded together."""
    killer = first_run.killer
    assert killer.error is None and killer.killed, killer.error or "no trainer pod was killed"
    say(f"worker 0 ended {killer.when}: pod {killer.killed}'s trainer was SIGKILLed then")
    pods = trainer_pods(cluster.api)
    assert sorted(pods) == [0, 1], [pod["metadata"]["name"] for pod in pods.values()]
    for pod in pods.values():
        assert pod["spec"]["nodeName"] == cluster.real_node.name
        assert pod["status"]["phase"] == "Succeeded", (pod["metadata"]["name"], pod["status"])
        assert pod["metadata"]["labels"][RESTART_ATTEMPT_LABEL] == "1", pod["metadata"]["labels"]
    resumed = resumed_at(cluster.api, pods)
    assert resumed and int(resumed[1]) > 1, "worker 0 of the restarted set did not resume from the backup"
    say(f"JobSet restarted the set once; worker 0 {resumed[0]}")


def test_the_served_model_answers_the_labels_of_images_it_never_saw(cluster, first_run, say, tmp_path):
    """The published version, Ready through the kubelet's probe, through its Service: each served class
    is the class of its highest probability, and the accuracy on holdout images well above chance."""
    model = cluster.config.pipeline.model_name
    pngs = holdout_pngs(tmp_path, CHECKED_IMAGES)
    found = check_served_classes(predictor_url(cluster.api, model), model, pngs)
    say(f"served version {output(first_run.workflow, 'serve', 'version')}: {found}")


def test_the_served_version_is_the_champion_and_the_registrys_latest_for_the_run(cluster, first_run, say):
    """What the InferenceService serves, what the serve step deployed, the tracking server's `champion`
    and the registry's latest version (trained in this run) are one version."""
    api, workflow, model = cluster.api, first_run.workflow, cluster.config.pipeline.model_name
    isvc = api.get(f"{INFERENCE_SERVICE.group}/{INFERENCE_SERVICE.version}", INFERENCE_SERVICE.kind, model,
                   NAMESPACE)
    served, deployed = model_version(isvc), output(workflow, "serve", "version")
    champion = tracking_get(api, workflow, "registered-models/alias", name=model,
                            alias=tracking_names.CHAMPION)["model_version"]
    versions = tracking_get(api, workflow, "model-versions/search", filter=f"name = '{model}'")
    latest = max(versions["model_versions"], key=lambda version: int(version["version"]))
    trainings = training_runs(api, workflow, champion["run_id"])
    say(f"served version {served}; deployed {deployed}; {tracking_names.CHAMPION}: registry version "
        f"{champion['version']} (ours {tags_of(champion).get(tracking_names.VERSION_TAG)}); latest: "
        f"{latest['version']}; trained in run(s) {tags_of(latest).get(tracking_names.TRAINING_RUNS_TAG)}")
    assert served == deployed, (served, deployed)
    assert champion["version"] == latest["version"], (champion, latest)
    assert tags_of(champion)[tracking_names.VERSION_TAG] == served, champion
    assert set(trainings) <= set(tags_of(latest)[tracking_names.TRAINING_RUNS_TAG].split(",")), (
        trainings, latest)


def training_runs(api, workflow: dict, selection_run: str) -> list[str]:
    """The training runs of the workflow's pipeline run (its tag, on the selection's run too)."""
    run = tracking_get(api, workflow, "runs/get", run_id=selection_run)["run"]
    pipeline_run = tags_of(run)[tracking_names.PIPELINE_RUN_TAG]
    found = tracking_get(api, workflow, "runs/search", body={
        "experiment_ids": [run["info"]["experiment_id"]],
        "filter": f"tags.`{tracking_names.PIPELINE_RUN_TAG}` = '{pipeline_run}' "
                  f"and tags.`{tracking_names.STEP_TAG}` = 'train'"}).get("runs", [])
    return [training["info"]["run_id"] for training in found]


def test_the_resumed_training_is_one_run_with_each_epoch_logged_once(cluster, first_run, say):
    """The killed set resumed its MLflow run: one training run of the variant in this pipeline run, each
    epoch logged once (the epoch it resumed from on), not a second run beside it."""
    api, workflow = cluster.api, first_run.workflow
    champion = tracking_get(api, workflow, "registered-models/alias", name=cluster.config.pipeline.model_name,
                            alias=tracking_names.CHAMPION)["model_version"]
    (trained,) = tags_of(champion)[tracking_names.TRAINING_RUNS_TAG].split(",")
    run = tracking_get(api, workflow, "runs/get", run_id=trained)["run"]
    say(f"tracking: {tracking_names.CHAMPION} trained in run {run['info']['run_name']} "
        f"({run['info']['status']})")
    assert run["info"]["status"] == "FINISHED", run["info"]
    assert training_runs(api, workflow, champion["run_id"]) == [trained]
    assert tracking_names.RESTARTED_FROM_TAG not in tags_of(run), tags_of(run)
    history = tracking_get(api, workflow, "metrics/get-history", run_id=trained, metric_key=EPOCH_METRIC)
    steps = sorted(point["step"] for point in history["metrics"])
    resumed = resumed_at(api, trainer_pods(api))
    assert resumed, "worker 0 of the restarted set did not resume from the backup"
    resumed_from, epochs = int(resumed[1]), int(resumed[2])
    assert len(steps) == len(set(steps)) and set(range(resumed_from, epochs + 1)) <= set(steps), steps
    say(f"tracking: run {trained} resumed, {EPOCH_METRIC} logged at epochs {steps}")


def test_a_second_run_memoizes_its_ingest(cluster, first_run, say):
    """The template memoizes ingest: a second run of it finds the first's data."""
    again = run_workflow(cluster.api, say)
    ingest = [node for node in again["status"]["nodes"].values() if node.get("displayName") == "ingest"]
    assert any((node.get("memoizationStatus") or {}).get("hit") for node in ingest), ingest


def test_the_served_class_check_names_the_predicted_and_expected_classes():
    """check_served_classes' judge, on answers of the likeliest class, then of the least likely (what a
    signature with tf.argmin for tf.argmax would serve)."""
    rows = np.full((5, len(CLASS_NAMES)), 0.01)
    rows[range(5), range(5)] = 0.91

    def answers(pick) -> list[dict]:
        return [{"class_name": CLASS_NAMES[int(pick(row))], "probabilities": list(row)} for row in rows]

    assert disagreements(answers(np.argmax), np.arange(5)) == ([], 1.0)
    wrong, accuracy = disagreements(answers(np.argmin), np.arange(5))
    assert accuracy == 0.0 < MIN_ACCURACY and len(wrong) == 5
    assert wrong[0] == ("image 0: predicted 'Trouser', expected 'T-shirt/top', but its highest "
                        "probability (0.910) is 'T-shirt/top'")
