"""Request decoding and validation for both protocols: every problem is an InvalidInput (a 400)
that names the instance and what is wrong, checked before anything reaches the model. The request's
structure is checked on the event loop (parse_v1, parse_v2); its encoded images in the batch worker
(decoded), so that no image is read on the loop."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import math
import re

import numpy as np
import orjson
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput
from PIL import Image, UnidentifiedImageError

from trainer.fashion_mnist import IMAGE_SIZE, MAX_PIXEL_VALUE

MAX_INSTANCES = 64
MAX_IMAGE_PIXELS = 4096 * 4096  # width x height of one encoded image, read from its header
# All the images of one request together: what one request may make the model decode (~50 MB as RGB).
MAX_REQUEST_PIXELS = 4096 * 4096
ALLOWED_FORMATS = ("PNG", "JPEG")
PIXEL_DATATYPES = ("UINT8", "FP32")
# PIL's own check at ours: it warns past it, and raises DecompressionBombError past twice it (from
# the header, in Image.open); ours refuses everything past it before decoding.
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS


@dataclasses.dataclass(frozen=True)
class Batch:
    """What a request asks to classify: encoded images or pixel arrays, never both."""

    encoded: list[bytes] | None = None  # checked and decoded by `decoded`, in the batch worker
    pixels: np.ndarray | None = None  # float32 [N, 28, 28, 1], values 0-255
    item: str = "instance"  # what the request calls one image, in error messages

    def __len__(self) -> int:
        return len(self.encoded) if self.encoded is not None else len(self.pixels)


def check_count(count: int) -> None:
    if count == 0:
        raise InvalidInput("no instances: send at least one")
    if count > MAX_INSTANCES:
        raise InvalidInput(f"{count} instances: at most {MAX_INSTANCES} per request")


def unreadable(where: str, error: BaseException) -> InvalidInput:
    return InvalidInput(f"{where}: not a readable PNG or JPEG image ({type(error).__name__}: {error})")


def is_model_sized_grey_png(image: Image.Image) -> bool:
    """A PNG of 8-bit grey pixels already at the model's size: PIL decodes it to exactly the pixels
    the graph's own decode gives (PNG is lossless, and the graph's grey -> RGB -> grey and its resize
    to the same size leave 8-bit values unchanged: the model's outputs are identical)."""
    return (image.format == "PNG" and image.mode == "L" and image.size == (IMAGE_SIZE, IMAGE_SIZE)
            and len(image.tile) == 1 and image.tile[0].args == "L")  # 8 bits a pixel, one stream


def checked_image(data: bytes, where: str) -> tuple[int, np.ndarray | None]:
    """(width x height, its [28, 28] float32 pixels or None) of an encoded image: refused from its
    header when over MAX_IMAGE_PIXELS (a small file can declare billions) or not a PNG or JPEG.

    Each image is decoded once: a model-sized grey PNG here, by PIL, then through the pixels
    signature, which is cheaper than the graph's decode and resize (docs/results/serving-benchmark.md);
    any other image only from its header here, then by the graph's decoder, whose errors are the
    input's fault too (a 400, serving.model.run_alone).
    Every decoder error is the input's fault: PIL raises many kinds (OSError, SyntaxError,
    ValueError, struct.error, EOFError, IndexError...) on hostile files, so all are caught."""
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:
        raise InvalidInput(f"{where}: image declares a size over the limit of {MAX_IMAGE_PIXELS} "
                           "pixels") from None
    except UnidentifiedImageError:
        raise InvalidInput(f"{where}: not a readable PNG or JPEG image") from None
    except Exception as error:
        raise unreadable(where, error) from None
    with image:
        if image.format not in ALLOWED_FORMATS:
            raise InvalidInput(f"{where}: {image.format} images are not accepted; send PNG or JPEG")
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:
            raise InvalidInput(f"{where}: image is {width}x{height}, over the limit of "
                               f"{MAX_IMAGE_PIXELS} pixels")
        if not is_model_sized_grey_png(image):
            return width * height, None
        try:
            return width * height, np.asarray(image, dtype=np.float32)
        except Exception as error:
            raise unreadable(where, error) from None


def decoded(batch: Batch) -> Batch:
    """A request's encoded images checked (each, and MAX_REQUEST_PIXELS for all of them together)
    and, when every one is a model-sized grey PNG, decoded to pixels; otherwise left to the graph.
    Runs in the batch worker, off the event loop."""
    if batch.encoded is None:
        return batch
    checked = [checked_image(data, f"{batch.item} {index}") for index, data in enumerate(batch.encoded)]
    total = sum(size for size, _ in checked)
    if total > MAX_REQUEST_PIXELS:
        raise InvalidInput(f"the request's images hold {total} pixels together, over the limit of "
                           f"{MAX_REQUEST_PIXELS}")
    if any(pixels is None for _, pixels in checked):
        return batch
    return Batch(pixels=np.stack([pixels for _, pixels in checked])[..., np.newaxis])


def b64_bytes(text: object, where: str) -> bytes:
    if not isinstance(text, str):
        raise InvalidInput(f"{where}: 'b64' must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:  # ValueError: text that is not ASCII
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
    return b64_bytes(instance["b64"], where)


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


def check_shape(name: str, shape: object) -> list[int]:
    if (not isinstance(shape, (list, tuple))
            or not all(isinstance(size, int) and not isinstance(size, bool) for size in shape)):
        raise InvalidInput(f"input {name!r}: shape must be a list of integers, got {shape!r}")
    if any(size < 0 for size in shape):
        raise InvalidInput(f"input {name!r}: shape {list(shape)} has a negative dimension")
    return list(shape)


def flat_values(name: str, data: object) -> list:
    """The JSON `data` of a tensor, flattened (it may be nested or flat, as the protocol allows)."""
    if isinstance(data, np.ndarray):
        return list(data.reshape(-1))
    if not isinstance(data, list):
        raise InvalidInput(f"input {name!r}: data must be a list, got {type(data).__name__}")
    values, stack = [], [iter(data)]
    while stack:  # iterative: a deeply nested body must not exhaust the stack
        item = next(stack[-1], stack)
        if item is stack:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            values.append(item)
    return values


def tensor_array(tensor, shape: list[int]) -> np.ndarray:
    """The pixel tensor's values as float64 of `shape`, each checked against its datatype."""
    name, datatype = tensor.name, tensor.datatype
    if getattr(tensor, "_raw_data", None) is not None:  # the binary extension: sized by numpy
        try:
            return tensor.as_numpy().astype(np.float64)
        except Exception as error:
            raise InvalidInput(f"input {name!r}: binary data does not match shape {shape} and datatype "
                               f"{datatype} ({error})") from None
    values = flat_values(name, tensor.data)
    if len(values) != math.prod(shape):
        raise InvalidInput(f"input {name!r}: shape {shape} holds {math.prod(shape)} values, data has "
                           f"{len(values)}")
    array = np.asarray(values)
    if array.dtype.kind not in "iuf":  # strings, booleans, objects (integers past 64 bits)
        raise InvalidInput(f"input {name!r}: {datatype} data must be numbers")
    array = array.astype(np.float64)
    if datatype == "UINT8" and not (np.isfinite(array).all() and (array == np.round(array)).all()
                                    and array.min() >= 0 and array.max() <= 255):
        raise InvalidInput(f"input {name!r}: UINT8 data must be integers within 0-255")
    return array.reshape(shape)


def parse_v2(request: InferRequest) -> Batch:
    """An Open Inference Protocol request with one input: BYTES of encoded images (base64 text over
    JSON, raw bytes over binary or gRPC), or UINT8 / FP32 pixels of shape [N, 28, 28, 1]. The shape
    must hold exactly the values sent, and the values must fit their datatype."""
    if len(request.inputs) != 1:
        raise InvalidInput(f"expected exactly one input, got {len(request.inputs)}")
    tensor = request.inputs[0]
    shape = check_shape(tensor.name, tensor.shape)
    if tensor.datatype == "BYTES":
        if getattr(tensor, "_raw_data", None) is not None:
            try:
                values = list(tensor.as_numpy().reshape(-1))
            except Exception as error:
                raise InvalidInput(f"input {tensor.name!r}: binary data does not match shape {shape} "
                                   f"({error})") from None
        else:
            values = flat_values(tensor.name, tensor.data)
        if len(values) != math.prod(shape):
            raise InvalidInput(f"input {tensor.name!r}: shape {shape} holds {math.prod(shape)} values, "
                               f"data has {len(values)}")
        check_count(len(values))
        return Batch(encoded=[value if isinstance(value, bytes) else b64_bytes(value, f"element {i}")
                              for i, value in enumerate(values)], item="element")
    if tensor.datatype not in PIXEL_DATATYPES:
        raise InvalidInput(f"input {tensor.name!r}: datatype {tensor.datatype} is not accepted; "
                           "use BYTES, UINT8 or FP32")
    if len(shape) != 4 or shape[1:] != [IMAGE_SIZE, IMAGE_SIZE, 1]:
        raise InvalidInput(f"input {tensor.name!r}: shape {shape}, expected "
                           f"[N, {IMAGE_SIZE}, {IMAGE_SIZE}, 1]")
    check_count(shape[0])
    pixels = tensor_array(tensor, shape)
    return Batch(pixels=np.stack([check_pixels(x, f"element {i}") for i, x in enumerate(pixels)]))


# --- the binary tensor data extension and gRPC -----------------------------------------------------

DECIMAL = re.compile(r"[0-9]{1,12}")  # a header length of up to a terabyte: any body is shorter
JSON_KINDS = {dict: "object", list: "array", str: "string"}


def optional_of(kind: type, value: object, what: str) -> object:
    """`value` when it is None or a `kind`, else a 400 naming `what`."""
    if value is not None and not isinstance(value, kind):
        raise InvalidInput(f"{what} must be a JSON {JSON_KINDS[kind]}")
    return value


def binary_data_size(parameters: dict, name: object) -> int:
    size = parameters["binary_data_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInput(f"input {name!r}: binary_data_size must be a non-negative integer, got {size!r}")
    return size


def binary_input(tensor: object, body: bytes, start: int) -> tuple[InferInput, int]:
    """One input of a binary request's JSON header, its data read from `body` at `start` when it
    declares `parameters.binary_data_size`; (the input, where the next input's data starts)."""
    if not isinstance(tensor, dict):
        raise InvalidInput("each input must be a JSON object")
    name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
        raise InvalidInput(f"input {name!r}: needs a string name and datatype and a list shape")
    parameters = optional_of(dict, tensor.get("parameters"), f"input {name!r}: parameters")
    infer_input = InferInput(name, shape, datatype, tensor.get("data"), parameters)
    if "data" in tensor:
        return infer_input, start
    if not parameters or "binary_data_size" not in parameters:
        raise InvalidInput(f"input {name!r}: has neither data nor parameters.binary_data_size")
    end = start + binary_data_size(parameters, name)
    if end > len(body):
        raise InvalidInput(f"input {name!r}: binary_data_size runs {end - len(body)} bytes past the body")
    # Where KServe's own InferRequest.from_bytes puts an input's binary data.
    infer_input._raw_data = body[start:end]
    return infer_input, end


def requested_output(output: object) -> RequestedOutput:
    if not isinstance(output, dict) or not isinstance(output.get("name"), str):
        raise InvalidInput("each requested output must be a JSON object with a string name")
    return RequestedOutput(output["name"], optional_of(dict, output.get("parameters"),
                                                       f"output {output['name']!r}: parameters"))


def binary_infer_request(body: bytes, json_length: str | None, model_name: str) -> InferRequest:
    """A v2 request in the binary tensor data extension: a JSON header of `json_length` bytes (the
    Inference-Header-Content-Length header), then each binary input's `binary_data_size` bytes in
    input order; BYTES elements are 4-byte little-endian lengths, each followed by its bytes.

    KServe 0.20's InferRequest.from_bytes reads the same format, but decodes BYTES elements as UTF-8
    text (encoded images are not: a 500) and answers a malformed header or size with a 500; here
    every problem is a 400, and the data is left as bytes for parse_v2 to size and check."""
    if json_length is None:
        raise InvalidInput(f"a body that is not JSON needs the {INFERENCE_CONTENT_LENGTH_HEADER} header "
                           "(the binary tensor data extension)")
    if not DECIMAL.fullmatch(json_length) or int(json_length) > len(body):
        raise InvalidInput(f"{INFERENCE_CONTENT_LENGTH_HEADER} must be the JSON header's length in bytes, "
                           f"at most the body's {len(body)}; got {json_length[:20]!r}")
    try:
        header = orjson.loads(body[:int(json_length)])
    except orjson.JSONDecodeError as error:
        raise InvalidInput(f"the request's JSON header is not valid JSON ({error})") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise InvalidInput('the JSON header must be an object with a list of "inputs"')
    inputs, start = [], int(json_length)
    for tensor in header["inputs"]:
        infer_input, start = binary_input(tensor, body, start)
        inputs.append(infer_input)
    if start != len(body):
        raise InvalidInput(f"{len(body) - start} bytes after the inputs' binary data belong to no input")
    outputs = optional_of(list, header.get("outputs"), '"outputs"')
    return InferRequest(model_name, inputs, request_id=optional_of(str, header.get("id"), '"id"'),
                        parameters=optional_of(dict, header.get("parameters"), '"parameters"'),
                        request_outputs=[requested_output(o) for o in outputs] if outputs else None)


def request_protocol(payload: object) -> str:
    """How a request reached the model: "v1", "v2" (JSON or binary over HTTP) or "grpc"."""
    if not isinstance(payload, InferRequest):
        return "v1"
    return "grpc" if payload.from_grpc else "v2"
