"""Each image's lock installed as its Dockerfile installs it (`pip install --no-deps -r`, `pip check`)
into a real virtualenv, with only the directories the image copies: the trainer's trains a step, the
server's answers a request for that export. The virtualenvs are built and kept by tools/virtualenvs.py
(`make test` builds them beside the dev install).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO_ROOT, train_args
from PIL import Image

from infra.images import IMAGE_INPUTS
from serving import client
from serving.process import stop, wait_for_ports, wait_until_ready
from tools import virtualenvs

pytestmark = pytest.mark.slow  # builds virtualenvs from the package registry, trains and serves


def image_python(image: str) -> Path:
    """The image's Python: its lock installed as the Dockerfile does, then `pip check`."""
    python = virtualenvs.image_python(image)
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    return python


def image_root(image: str, destination: Path) -> Path:
    """The image's /app: the project's directories its Dockerfile copies, nothing else."""
    for top in IMAGE_INPUTS[image]:
        if (REPO_ROOT / top).is_dir():
            shutil.copytree(REPO_ROOT / top, destination / top, ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def image_env(image: str) -> dict[str, str]:
    """The Dockerfile's ENV, and no PYTHONPATH leaking the checkout in."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    if image == "trainer":
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


@pytest.fixture(scope="module")
def trainer_image_export(data_dir, tmp_path_factory) -> Path:
    """One training step of `cnn` by the trainer image's lock; its export."""
    python, work = image_python("trainer"), tmp_path_factory.mktemp("trainer-image")
    root = image_root("trainer", work / "app")
    result = subprocess.run(
        [str(python), "-m", "trainer.train", *train_args("cnn", data_dir, work, "--epochs", "1",
                                                         "--steps-per-epoch", "1")],
        cwd=root, env=image_env("trainer"), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return work / "export"


def test_the_trainer_image_lock_trains_a_step(trainer_image_export):
    assert (trainer_image_export / "saved_model.pb").is_file()


def png(pixels: bytes) -> bytes:
    out = io.BytesIO()
    Image.frombytes("L", (28, 28), pixels).save(out, format="PNG")
    return out.getvalue()


def test_the_serving_image_lock_answers_a_request_for_the_trainers_export(trainer_image_export, tmp_path):
    python, repo = image_python("serving"), tmp_path / "models"
    shutil.copytree(trainer_image_export, repo / "fmnist" / "1")
    root, log = image_root("serving", tmp_path / "app"), tmp_path / "server.log"
    port_file = tmp_path / "server.ports"
    with log.open("w") as out:
        server = subprocess.Popen([str(python), "-m", "serving.server", "--model-repo", str(repo),
                                   "--model-name", "fmnist", "--http-port", "0", "--no-grpc",
                                   "--port-file", str(port_file)],
                                  cwd=root, env=image_env("serving"), stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{wait_for_ports(port_file, server, log)['http']}"
        wait_until_ready(url, "fmnist", server, log)
        ((label, probability),) = client.predict([png(bytes(range(28)) * 28)], url=url, model_name="fmnist")
        assert isinstance(label, str) and 0.0 <= probability <= 1.0
    finally:
        stop(server)


@pytest.mark.parametrize("step", [
    ["cluster_steps.release", "rollback", "--namespace", "dist-ml", "--model-name", "fmnist"],
    ["cluster_steps.train", "--namespace", "dist-ml",
     "--manifest", '{"kind": "TFJob", "metadata": {"name": "j"}}'],
], ids=["release", "train"])
def test_each_cluster_step_starts_in_the_serving_image_and_says_in_one_line_it_has_no_cluster(step, tmp_path):
    """The workflow runs these in the serving image: its lock holds the kubernetes client they load."""
    python, root = image_python("serving"), image_root("serving", tmp_path / "app")
    env = {**image_env("serving"), "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    result = subprocess.run([str(python), "-m", *step], cwd=root, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "no cluster to reach: not in a pod, and no kubeconfig" in result.stderr
    assert "Traceback" not in result.stderr
