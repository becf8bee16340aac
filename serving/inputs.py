"""Request decoding and validation for both protocols: every problem is an InvalidInput (a 400)
that names the instance and what is wrong, checked before anything reaches the model."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io

import numpy as np
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferRequest
from PIL import Image, UnidentifiedImageError

from trainer.fashion_mnist import IMAGE_SIZE, MAX_PIXEL_VALUE

MAX_INSTANCES = 64
MAX_IMAGE_PIXELS = 4096 * 4096  # width x height of one encoded image
ALLOWED_FORMATS = ("PNG", "JPEG")


@dataclasses.dataclass(frozen=True)
class Batch:
    """What a request asks to classify: encoded images or pixel arrays, never both."""

    encoded: list[bytes] | None = None
    pixels: np.ndarray | None = None  # float32 [N, 28, 28, 1], values 0-255

    def __len__(self) -> int:
        return len(self.encoded) if self.encoded is not None else len(self.pixels)


def check_count(count: int) -> None:
    if count == 0:
        raise InvalidInput("no instances: send at least one")
    if count > MAX_INSTANCES:
        raise InvalidInput(f"{count} instances: at most {MAX_INSTANCES} per request")


def check_image(data: bytes, where: str) -> bytes:
    """Opens the image header and decodes it fully, so that a truncated or fake image is a 400."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in ALLOWED_FORMATS:
                raise InvalidInput(f"{where}: {image.format} images are not accepted; send PNG or JPEG")
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise InvalidInput(f"{where}: image is {width}x{height}, over the limit of "
                                   f"{MAX_IMAGE_PIXELS} pixels")
            image.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise InvalidInput(f"{where}: not a readable PNG or JPEG image ({error})") from None
    return data


def decode_b64(text: object, where: str) -> bytes:
    if not isinstance(text, str):
        raise InvalidInput(f"{where}: 'b64' must be a base64 string")
    try:
        return check_image(base64.b64decode(text, validate=True), where)
    except binascii.Error as error:
        raise InvalidInput(f"{where}: invalid base64 ({error})") from None


def check_pixels(value: object, where: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInput(f"{where}: pixel values must be numbers") from None
    if array.shape == (IMAGE_SIZE, IMAGE_SIZE):
        array = array[..., np.newaxis]
    if array.shape != (IMAGE_SIZE, IMAGE_SIZE, 1):
        raise InvalidInput(f"{where}: pixel array has shape {list(array.shape)}, expected "
                           f"[{IMAGE_SIZE}, {IMAGE_SIZE}] or [{IMAGE_SIZE}, {IMAGE_SIZE}, 1]")
    if not np.isfinite(array).all():
        raise InvalidInput(f"{where}: pixel values must be finite (found NaN or infinity)")
    if array.min() < 0 or array.max() > MAX_PIXEL_VALUE:
        raise InvalidInput(f"{where}: pixel values must be within 0-{MAX_PIXEL_VALUE}")
    return array.astype(np.float32)


def instance_kind(instance: object) -> str:
    if isinstance(instance, dict):
        return "encoded"
    if isinstance(instance, list):
        return "pixels"
    return "unknown"


def encoded_instance(instance: dict, where: str) -> bytes:
    """`{"image_bytes": {"b64": ...}}` (TF Serving's form) or `{"b64": ...}`."""
    if set(instance) == {"image_bytes"} and isinstance(instance["image_bytes"], dict):
        instance = instance["image_bytes"]
    if set(instance) != {"b64"}:
        raise InvalidInput(f"{where}: expected {{\"image_bytes\": {{\"b64\": ...}}}} or "
                           f"{{\"b64\": ...}}, got keys {sorted(instance)}")
    return decode_b64(instance["b64"], where)


def parse_v1(body: object) -> Batch:
    """A v1 body: {"instances": [...]} of encoded images or 28x28(x1) pixel arrays."""
    if not isinstance(body, dict) or "instances" not in body:
        raise InvalidInput('expected a JSON object with "instances"')
    instances = body["instances"]
    if not isinstance(instances, list):
        raise InvalidInput('"instances" must be a list')
    check_count(len(instances))
    kinds = {instance_kind(instance) for instance in instances}
    if "unknown" in kinds:
        raise InvalidInput("each instance must be an object with 'b64' or a 28x28 pixel array")
    if kinds == {"encoded"}:
        return Batch(encoded=[encoded_instance(x, f"instance {i}") for i, x in enumerate(instances)])
    if kinds == {"pixels"}:
        return Batch(pixels=np.stack([check_pixels(x, f"instance {i}") for i, x in enumerate(instances)]))
    raise InvalidInput("mixing encoded images and pixel arrays in one request is not supported")


def parse_v2(request: InferRequest) -> Batch:
    """An Open Inference Protocol request with one input: BYTES of encoded images (base64 text over
    JSON, raw bytes over binary or gRPC), or UINT8 / FP32 pixels of shape [N, 28, 28, 1]."""
    if len(request.inputs) != 1:
        raise InvalidInput(f"expected exactly one input, got {len(request.inputs)}")
    tensor = request.inputs[0]
    if tensor.datatype == "BYTES":
        values = list(np.asarray(tensor.data, dtype=object).reshape(-1))
        check_count(len(values))
        return Batch(encoded=[
            check_image(value, f"element {i}") if isinstance(value, bytes)
            else decode_b64(value, f"element {i}") for i, value in enumerate(values)
        ])
    if tensor.datatype not in ("UINT8", "FP32"):
        raise InvalidInput(f"input {tensor.name!r}: datatype {tensor.datatype} is not accepted; "
                           "use BYTES, UINT8 or FP32")
    if len(tensor.shape) != 4 or list(tensor.shape[1:]) != [IMAGE_SIZE, IMAGE_SIZE, 1]:
        raise InvalidInput(f"input {tensor.name!r}: shape {list(tensor.shape)}, expected "
                           f"[N, {IMAGE_SIZE}, {IMAGE_SIZE}, 1]")
    check_count(tensor.shape[0])
    try:
        pixels = tensor.as_numpy()
    except (ValueError, TypeError) as error:
        raise InvalidInput(f"input {tensor.name!r}: data does not match its shape and datatype "
                           f"({error})") from None
    return Batch(pixels=np.stack([check_pixels(x, f"element {i}") for i, x in enumerate(pixels)]))
