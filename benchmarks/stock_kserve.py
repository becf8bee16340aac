"""Stock KServe, the serving benchmark's baseline: a plain `kserve.Model` as KServe's custom-model
documentation writes one (https://kserve.github.io/website/0.10/modelserving/v1beta1/custom/custom_model/:
a synchronous `predict` that base64-decodes the request's image, opens it with PIL and calls the
model), one model call per request, no batching, on the ModelServer settings of serving.server.

    python -m benchmarks.stock_kserve --model-dir REPO/fmnist/N [--model-name fmnist] [--http-port 8080]
        [--port-file FILE]

It decodes as our server does for the benchmark's images (28x28 grey PNGs, PIL into the pixels
signature), so the comparison is of the serving path, not of the decoder.
"""

from __future__ import annotations

import argparse
import base64
import io
from pathlib import Path
from typing import Sequence

import numpy as np
import tensorflow as tf
from kserve import Model, ModelServer
from PIL import Image

from serving.kserve_overrides import reporting_bound_ports
from serving.port_file import PORT_FILE_FLAG, PORT_FILE_HELP, announcing
from trainer.fashion_mnist import IMAGE_SIZE
from trainer.serving_contract import PIXELS_SIGNATURE


def pixels_of(instance: dict) -> np.ndarray:
    """One v1 instance, `{"image_bytes": {"b64": ...}}`, as [28, 28, 1] float32 pixels."""
    image = Image.open(io.BytesIO(base64.b64decode(instance["image_bytes"]["b64"]))).convert("L")
    if image.size != (IMAGE_SIZE, IMAGE_SIZE):
        image = image.resize((IMAGE_SIZE, IMAGE_SIZE))
    return np.asarray(image, dtype=np.float32)[..., np.newaxis]


class StockModel(Model):
    def __init__(self, name: str, model_dir: Path):
        super().__init__(name)
        self.model_dir = model_dir
        self.serve = None
        self.load()

    def load(self) -> bool:
        self.serve = tf.saved_model.load(str(self.model_dir)).signatures[PIXELS_SIGNATURE]
        self.ready = True
        return self.ready

    def predict(self, payload: dict, headers: dict[str, str] | None = None) -> dict:
        pixels = np.stack([pixels_of(instance) for instance in payload["instances"]])
        outputs = self.serve(pixels=tf.constant(pixels))
        return {"predictions": [
            {"class_id": int(class_id), "class_name": name.decode(), "probabilities": p.tolist()}
            for class_id, name, p in zip(outputs["class_id"].numpy(), outputs["class_name"].numpy(),
                                         outputs["probabilities"].numpy())
        ]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.stock_kserve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="one SavedModel version")
    parser.add_argument("--model-name", default="fmnist")
    parser.add_argument("--http-port", type=int, default=8080, help="0: any free port")
    parser.add_argument(PORT_FILE_FLAG, type=Path, help=PORT_FILE_HELP)
    args = parser.parse_args(argv)
    # serving.server's ModelServer settings: one worker, no gRPC, no per-request latency log lines.
    server = ModelServer(http_port=args.http_port, enable_grpc=False, workers=1, enable_latency_logging=False)
    reporting_bound_ports(server, announcing("benchmarks.stock_kserve", args.port_file))
    server.start([StockModel(args.model_name, args.model_dir)])


if __name__ == "__main__":
    main()
