"""The published Fashion-MNIST model as a KServe model: both protocols, dynamic batching, and the
newest version of the model repository, switched to while serving."""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from pathlib import Path
from typing import Sequence

import numpy as np
import tensorflow as tf
from kserve import Model
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

from serving.batching import DynamicBatcher
from serving.inputs import Batch, parse_v1, parse_v2
from trainer import model_repository

VERSION_HEADER = "x-model-version"
OUTPUTS = ("probabilities", "class_id", "class_name")
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoadedVersion:
    number: int
    serve_image_bytes: tf.types.experimental.ConcreteFunction
    serve_pixels: tf.types.experimental.ConcreteFunction

    def predict(self, batch: Batch) -> dict[str, np.ndarray]:
        if batch.encoded is not None:
            outputs = self.serve_image_bytes(image_bytes=tf.constant(batch.encoded))
        else:
            outputs = self.serve_pixels(pixels=tf.constant(batch.pixels))
        return {name: outputs[name].numpy() for name in OUTPUTS}


def load_version(repo: Path, model_name: str, number: int) -> LoadedVersion:
    loaded = tf.saved_model.load(str(repo / model_name / str(number)))
    return LoadedVersion(number, loaded.signatures["serving_default"], loaded.signatures["pixels"])


@dataclasses.dataclass(frozen=True)
class Prediction:
    version: int
    outputs: dict[str, np.ndarray]


class FashionMnistModel(Model):
    def __init__(self, name: str, repo: Path, max_batch_size: int = 32, max_wait_seconds: float = 0.005,
                 poll_seconds: float = 2.0):
        super().__init__(name, return_response_headers=True)
        self.repo, self.poll_seconds = repo, poll_seconds
        self.current: LoadedVersion | None = None
        self.batcher = DynamicBatcher(self._run_batches, len, max_batch_size, max_wait_seconds)
        self._stop = threading.Event()

    # --- versions -------------------------------------------------------------------------------

    def load(self) -> bool:
        if not self.refresh():
            raise FileNotFoundError(f"{self.repo / self.name}: no published version")
        self.ready = True
        threading.Thread(target=self._watch, name="version-watcher", daemon=True).start()
        return self.ready

    def refresh(self) -> bool:
        """Loads the newest version if it is newer than the one served; True if one is loaded."""
        latest = model_repository.latest_version(self.repo, self.name)
        if latest is not None and (self.current is None or latest > self.current.number):
            # Requests keep using the old version until this one assignment swaps them over.
            self.current = load_version(self.repo, self.name, latest)
            logger.info("serving %s version %d", self.name, latest)
        return self.current is not None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.refresh()
            except Exception:  # a half-broken new version must not stop the old one serving
                logger.exception("could not load a new version of %s; still serving %d",
                                 self.name, self.current.number)

    def stop(self) -> None:
        self._stop.set()

    # --- inference ------------------------------------------------------------------------------

    def _run_batches(self, batches: Sequence[Batch]) -> list[Prediction]:
        """One model call per kind of input for all waiting requests, split back per request."""
        version = self.current
        results: list[Prediction | None] = [None] * len(batches)
        for kind in ("encoded", "pixels"):
            members = [i for i, b in enumerate(batches) if getattr(b, kind) is not None]
            if not members:
                continue
            merged = (Batch(encoded=[x for i in members for x in batches[i].encoded]) if kind == "encoded"
                      else Batch(pixels=np.concatenate([batches[i].pixels for i in members])))
            outputs = version.predict(merged)
            start = 0
            for i in members:
                end = start + len(batches[i])
                results[i] = Prediction(version.number, {k: v[start:end] for k, v in outputs.items()})
                start = end
        return results

    async def predict(self, payload: dict | InferRequest, headers: dict[str, str] | None = None,
                      response_headers: dict[str, str] | None = None) -> dict | InferResponse:
        is_v2 = isinstance(payload, InferRequest)
        prediction = await self.batcher.submit(parse_v2(payload) if is_v2 else parse_v1(payload))
        if response_headers is not None:
            response_headers[VERSION_HEADER] = str(prediction.version)
        if is_v2:
            return v2_response(payload, self.name, prediction)
        return v1_response(prediction)


def v1_response(prediction: Prediction) -> dict:
    outputs = prediction.outputs
    return {"predictions": [
        {"class_id": int(class_id), "class_name": name.decode(), "probabilities": probabilities.tolist()}
        for class_id, name, probabilities in zip(outputs["class_id"], outputs["class_name"],
                                                 outputs["probabilities"])
    ], "model_version": prediction.version}


def v2_response(request: InferRequest, model_name: str, prediction: Prediction) -> InferResponse:
    outputs = prediction.outputs
    count = len(outputs["class_id"])
    infer_outputs = [
        InferOutput("probabilities", [count, 10], "FP32", outputs["probabilities"].tolist()),
        InferOutput("class_id", [count], "INT32", outputs["class_id"].tolist()),
        InferOutput("class_name", [count], "BYTES", [name.decode() for name in outputs["class_name"]]),
    ]
    return InferResponse(response_id=request.id or str(uuid.uuid4()), model_name=model_name,
                         model_version=str(prediction.version), infer_outputs=infer_outputs)
