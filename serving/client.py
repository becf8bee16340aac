"""A client for the model server (and any KServe or TF Serving endpoint of the same model).

    python -m serving.client predict IMAGE... [--url http://127.0.0.1:8080] [--protocol v1|v2]
        [--model-name fmnist]

Prints the class and confidence of each image; on failure, exits non-zero with the server's error.
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Sequence

import requests

from common import cli

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_SECONDS = 30


class ServerError(RuntimeError):
    """The server answered with an error, or not at all."""


def inference_request(images: Sequence[bytes], protocol: str, model_name: str) -> tuple[str, dict]:
    """The path and JSON body that classify encoded `images` with `protocol`."""
    encoded = [base64.b64encode(image).decode() for image in images]
    if protocol == "v1":
        return (f"/v1/models/{model_name}:predict",
                {"instances": [{"image_bytes": {"b64": text}} for text in encoded]})
    return (f"/v2/models/{model_name}/infer",
            {"inputs": [{"name": "image_bytes", "shape": [len(encoded)], "datatype": "BYTES",
                         "data": encoded}]})


def predictions(body: dict, protocol: str) -> list[tuple[str, float]]:
    """(class name, confidence) per instance of a v1 or v2 response body."""
    if protocol == "v1":
        return [(p["class_name"], max(p["probabilities"])) for p in body["predictions"]]
    outputs = {output["name"]: output["data"] for output in body["outputs"]}
    names = outputs["class_name"]
    probabilities = outputs["probabilities"]
    width = len(probabilities) // len(names)
    return [(name, max(probabilities[i * width:(i + 1) * width])) for i, name in enumerate(names)]


def predict(images: Sequence[bytes], url: str = DEFAULT_URL, protocol: str = "v1",
            model_name: str = "fmnist", session: requests.Session | None = None) -> list[tuple[str, float]]:
    path, body = inference_request(images, protocol, model_name)
    try:
        response = (session or requests).post(url.rstrip("/") + path, json=body, timeout=TIMEOUT_SECONDS)
    except requests.RequestException as error:
        raise ServerError(f"{url}: {error}") from None
    if response.status_code != 200:
        try:
            message = response.json().get("error", response.text)
        except ValueError:
            message = response.text
        raise ServerError(f"{response.status_code} from {url}: {message}")
    return predictions(response.json(), protocol)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="serving.client", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    predict_command = commands.add_parser("predict", help="classify image files")
    predict_command.add_argument("images", type=Path, nargs="+")
    predict_command.add_argument("--url", type=cli.http_url, default=DEFAULT_URL)
    predict_command.add_argument("--protocol", choices=("v1", "v2"), default="v1")
    predict_command.add_argument("--model-name", default="fmnist")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        images = [path.read_bytes() for path in args.images]
    except OSError as error:
        raise cli.UsageError(f"{error.filename}: {error.strerror}") from None
    for path, (class_name, confidence) in zip(args.images, predict(images, args.url, args.protocol,
                                                                   args.model_name)):
        print(f"{path}: {class_name} ({confidence:.1%})")


if __name__ == "__main__":
    cli.run("serving.client", main, expected=(ServerError,))
