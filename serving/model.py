"""The published Fashion-MNIST model as a KServe model: both protocols, dynamic batching, and the
versions under a base path (TF Serving's layout, REPO/<model name> of the model repository or a
release's /mnt/models), switched to while serving: the newest committed version, or the stable
version and a canary that the base path's rollout state names (serving.versions)."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import gc
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Sequence

import numpy as np
import tensorflow as tf
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

from serving.batching import DynamicBatcher
from serving.inputs import Batch, decoded, parse_v1, parse_v2, request_protocol
from serving.kserve_overrides import DirectPredict
from serving.metrics import BATCH_SIZE, MODEL_VERSION, QUEUE_FULL, note_answered_by
from serving.request_log import RequestLogger
from serving.versions import VersionSet, load_state, wanted_state
from trainer.fashion_mnist import NUM_CLASSES
from trainer.serving_contract import PIXELS_SIGNATURE, SERVING_SIGNATURE

VERSION_HEADER = "x-model-version"
OUTPUTS = ("probabilities", "class_id", "class_name")
# Set on a request's error by the batch that failed it: the version its failure is counted against.
FAILED_VERSION_ATTRIBUTE = "model_version"
# Images admitted and not yet answered before requests get a 503: 32 full batches, under a second of
# work on two cores (docs/results/serving-benchmark.md), so a request admitted is answered well
# within a client's usual timeout, and one that would wait longer is told at once to retry.
DEFAULT_MAX_QUEUED_IMAGES = 1024
# TensorFlow dtype names -> Open Inference Protocol datatypes, for the v2 model metadata.
V2_DATATYPES = {"string": "BYTES", "float32": "FP32", "float64": "FP64", "float16": "FP16",
                "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
                "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
                "bool": "BOOL"}
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

    def input_types(self) -> list[dict]:
        """The signatures' inputs as v2 metadata: encoded images, then pixels."""
        return [tensor_metadata(name, spec) for function in (self.serve_image_bytes, self.serve_pixels)
                for name, spec in sorted(function.structured_input_signature[1].items())]

    def output_types(self) -> list[dict]:
        outputs = self.serve_image_bytes.structured_outputs
        return [tensor_metadata(name, outputs[name]) for name in OUTPUTS]


def tensor_metadata(name: str, spec: tf.TensorSpec) -> dict:
    """{"name", "datatype", "shape"} of the v2 metadata; an unknown dimension is -1."""
    return {"name": name, "datatype": V2_DATATYPES.get(spec.dtype.name, spec.dtype.name.upper()),
            "shape": [-1 if size is None else size for size in spec.shape.as_list()]}


def load_version(base_path: Path, number: int) -> LoadedVersion:
    loaded = tf.saved_model.load(str(base_path / str(number)))
    return LoadedVersion(number, loaded.signatures[SERVING_SIGNATURE],
                         loaded.signatures[PIXELS_SIGNATURE])


def freeze_long_lived_objects() -> None:
    """Collects once, then keeps everything alive now (TensorFlow and the loaded model) out of later
    collections: a full collection over them holds the GIL long enough to stall every request in
    flight (docs/results/serving-benchmark.md). Loading a newer version pays for one such
    collection, once."""
    gc.unfreeze()  # the previous version's cycles become collectable
    gc.collect()
    gc.freeze()


@dataclasses.dataclass(frozen=True)
class Prediction:
    version: int
    outputs: dict[str, np.ndarray]


class FashionMnistModel(DirectPredict):
    def __init__(self, name: str, base_path: Path, max_batch_size: int = 32,
                 max_wait_seconds: float = 0.0, poll_seconds: float = 2.0,
                 request_logger: RequestLogger | None = None, log_payloads: bool = False,
                 max_queued_images: int = DEFAULT_MAX_QUEUED_IMAGES):
        """`base_path`: the directory whose committed numbered children are the versions."""
        super().__init__(name, return_response_headers=True)
        self.base_path, self.poll_seconds = base_path, poll_seconds
        self.request_logger, self.log_payloads = request_logger, log_payloads
        self.versions: VersionSet[LoadedVersion] | None = None
        self.batcher = DynamicBatcher(self._decode_and_run, len, max_batch_size, max_wait_seconds,
                                      observe_batch=BATCH_SIZE.observe, max_queued=max_queued_images,
                                      on_queue_full=QUEUE_FULL.inc)
        self._stop = threading.Event()

    # --- versions -------------------------------------------------------------------------------

    def load(self) -> bool:
        if not self.refresh():
            raise FileNotFoundError(f"{self.base_path}: no published version")
        self.ready = True
        threading.Thread(target=self._watch, name="version-watcher", daemon=True).start()
        return self.ready

    @property
    def current(self) -> LoadedVersion | None:
        """The stable version: the one a request answered outside a canary's share gets."""
        return self.versions.stable if self.versions is not None else None

    def refresh(self) -> bool:
        """Serves what the base path asks for (its rollout state, else its newest committed version)
        when that changed, loading only versions not loaded yet; True if a version is loaded. A
        version without its commit marker is still being written, or was abandoned: not seen."""
        wanted = wanted_state(self.base_path)
        if wanted is not None and (self.versions is None or wanted != self.versions.state):
            # Requests keep using the old versions until this one assignment swaps them over.
            self.versions = load_state(wanted, self.versions,
                                       lambda number: load_version(self.base_path, number))
            freeze_long_lived_objects()
            MODEL_VERSION.labels(self.name).set(wanted.stable)
            canary = (f", canary version {wanted.canary} for {wanted.canary_percent}% of requests"
                      if wanted.canary is not None else "")
            logger.info("serving %s version %d%s", self.name, wanted.stable, canary)
        return self.versions is not None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.refresh()
            except Exception:  # a half-broken new version must not stop the old one serving
                logger.exception("could not serve what %s asks for; still serving %s",
                                 self.base_path, self.versions.state)

    def stop(self) -> None:
        self._stop.set()

    # --- inference ------------------------------------------------------------------------------

    def get_input_types(self) -> list[dict]:
        """v2 metadata: the served version's signature inputs (name, datatype, shape)."""
        return self.current.input_types() if self.current is not None else []

    def get_output_types(self) -> list[dict]:
        return self.current.output_types() if self.current is not None else []

    def _decode_and_run(self, batches: Sequence[Batch]) -> list[Prediction | Exception]:
        """In the batch worker: each request's images checked and decoded (its InvalidInput is its
        own result, a 400), then the model calls for the requests that passed."""
        results: list[Batch | Prediction | Exception] = []
        for batch in batches:
            try:
                results.append(decoded(batch))
            except InvalidInput as error:
                results.append(error)
        ready = [i for i, result in enumerate(results) if isinstance(result, Batch)]
        for i, prediction in zip(ready, self._run_batches([results[i] for i in ready]), strict=True):
            results[i] = prediction
        return results

    def _run_batches(self, batches: Sequence[Batch]) -> list[Prediction | Exception]:
        """One model call per kind of input for all waiting requests, split back per request. When a
        merged call fails, each of its requests is run alone, so that one bad request fails only
        itself."""
        version = self.versions.choose()
        results: list[Prediction | Exception | None] = [None] * len(batches)
        for kind in ("encoded", "pixels"):
            members = [i for i, b in enumerate(batches) if getattr(b, kind) is not None]
            if not members:
                continue
            try:
                split = predict_merged(version, [batches[i] for i in members])
            except Exception:
                split = [run_alone(version, batches[i]) for i in members]
            for i, result in zip(members, split, strict=True):
                results[i] = result
        for result in results:
            if isinstance(result, Exception):
                setattr(result, FAILED_VERSION_ATTRIBUTE, version.number)
        return results

    async def predict(self, payload: dict | InferRequest, headers: dict[str, str] | None = None,
                      response_headers: dict[str, str] | None = None) -> dict | InferResponse:
        started = time.perf_counter()
        is_v2 = isinstance(payload, InferRequest)
        batch = parse_v2(payload) if is_v2 else parse_v1(payload)
        try:
            prediction = await self.batcher.submit(batch)
        except Exception as error:
            note_answered_by(getattr(error, FAILED_VERSION_ATTRIBUTE, None))
            raise
        if response_headers is not None:
            response_headers[VERSION_HEADER] = str(prediction.version)
        if self.request_logger is None and not is_v2:  # no one reads its id: no uuid4 (a syscall)
            return v1_response(prediction)
        request_id = ((payload.id if is_v2 else None) or (headers or {}).get("x-request-id")
                      or str(uuid.uuid4()))
        if self.request_logger is not None:
            self.request_logger.log(self._log_entry(request_id, request_protocol(payload), batch, prediction,
                                                    time.perf_counter() - started))
        if is_v2:
            return v2_response(request_id, self.name, prediction, payload)
        return v1_response(prediction)

    def _log_entry(self, request_id: str, protocol: str, batch: Batch, prediction: Prediction,
                   seconds: float) -> dict:
        outputs = prediction.outputs
        entry = {
            "id": request_id,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "model": self.name,
            "model_version": prediction.version,
            "protocol": protocol,
            "latency_ms": round(seconds * 1000, 3),
            "instances": len(batch),
            "input_bytes": (sum(map(len, batch.encoded)) if batch.encoded is not None
                            else int(batch.pixels.size)),
            "response": {"predictions": [
                {"class_id": int(i), "class_name": n.decode(), "confidence": float(p.max())}
                for i, n, p in zip(outputs["class_id"], outputs["class_name"], outputs["probabilities"])
            ]},
        }
        if self.log_payloads:
            entry["payload"] = ([base64.b64encode(x).decode() for x in batch.encoded]
                                if batch.encoded is not None else batch.pixels[..., 0].tolist())
        return entry


def predict_merged(version: LoadedVersion, batches: Sequence[Batch]) -> list[Prediction]:
    """One model call for batches of one kind, its outputs split back per batch."""
    merged = (Batch(encoded=[x for b in batches for x in b.encoded]) if batches[0].encoded is not None
              else Batch(pixels=np.concatenate([b.pixels for b in batches])))
    outputs = version.predict(merged)
    if any(len(v) != len(merged) for v in outputs.values()):
        raise RuntimeError(f"the model returned {[len(v) for v in outputs.values()]} rows for "
                           f"{len(merged)} instances")
    results, start = [], 0
    for batch in batches:
        end = start + len(batch)
        results.append(Prediction(version.number, {k: v[start:end] for k, v in outputs.items()}))
        start = end
    return results


def run_alone(version: LoadedVersion, batch: Batch) -> Prediction | Exception:
    """One request's model call; its error as the result. Encoded images that passed the checks
    but that the graph's decoder refuses are the input's fault (a 400); anything else is ours."""
    try:
        return predict_merged(version, [batch])[0]
    except tf.errors.InvalidArgumentError as error:
        if batch.encoded is not None:
            return InvalidInput(f"an image could not be decoded: {error.message.splitlines()[0]}")
        return error
    except Exception as error:
        return error


def v1_response(prediction: Prediction) -> dict:
    outputs = prediction.outputs
    return {"predictions": [
        {"class_id": int(class_id), "class_name": name.decode(), "probabilities": probabilities.tolist()}
        for class_id, name, probabilities in zip(outputs["class_id"], outputs["class_name"],
                                                 outputs["probabilities"])
    ], "model_version": prediction.version}


def v2_response(request_id: str, model_name: str, prediction: Prediction,
                request: InferRequest | None = None) -> InferResponse:
    """Outputs as flat lists, which gRPC's typed contents require (JSON allows them too); in binary
    (HTTP's binary extension, gRPC's raw_output_contents) when `request` asks for it or was sent so,
    and only the outputs it names, if it names any."""
    outputs = prediction.outputs
    count = len(outputs["class_id"])
    infer_outputs = [
        InferOutput("probabilities", [count, NUM_CLASSES], "FP32",
                    outputs["probabilities"].reshape(-1).tolist()),
        InferOutput("class_id", [count], "INT32", outputs["class_id"].tolist()),
        InferOutput("class_name", [count], "BYTES", [name.decode() for name in outputs["class_name"]]),
    ]
    return InferResponse(response_id=request_id, model_name=model_name,
                         model_version=str(prediction.version), infer_outputs=infer_outputs,
                         use_binary_outputs=request is not None and request.use_binary_outputs,
                         requested_outputs=request.request_outputs if request is not None else None)
