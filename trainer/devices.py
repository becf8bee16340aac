"""The devices a worker trains on: the GPUs TensorFlow sees, checked against the GPUs its pod was
given, and whether they run mixed precision.

A pod given GPUs (its `nvidia.com/gpu` limit, which the cluster render passes as `--gpus N`) whose
TensorFlow sees fewer must not train on the CPU: it would hold the GPUs idle for hours and say
nothing. `require_gpus` fails at once, in one line naming what is missing: a TensorFlow built without
CUDA, the CUDA libraries (the wheels of `tensorflow[and-cuda]`, which only the GPU trainer image
holds), or the NVIDIA driver's own library, which comes from the node (GKE mounts its driver's
libraries into GPU pods at /usr/local/nvidia/lib64, which the GPU image puts on LD_LIBRARY_PATH).
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.metadata
import os

import tensorflow as tf
from packaging.requirements import Requirement

DRIVER_LIBRARY = "libcuda.so.1"  # the NVIDIA driver's user-space library: the node's, never the image's
LIBRARY_PATH = "LD_LIBRARY_PATH"
GKE_DRIVER_LIBRARIES = "/usr/local/nvidia/lib64"  # where GKE mounts them (trainer-gpu/Dockerfile)
CUDA_EXTRA = "and-cuda"  # TensorFlow's extra that installs the CUDA and cuDNN wheels
# Tensor Cores, which make float16 matrix products fast, came with compute capability 7.0 (Volta;
# a T4 is 7.5, an L4 8.9); older GPUs run float16 no faster than float32.
MIXED_PRECISION_MIN_CAPABILITY = (7, 0)
MIXED_POLICY, FULL_POLICY = "mixed_float16", "float32"
MIXED_PRECISION_CHOICES = ("auto", "on", "off")


class GpuUnavailable(RuntimeError):
    """The pod was given GPUs that TensorFlow does not see; the message says what is missing."""


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str  # TensorFlow's, e.g. /physical_device:GPU:0
    model: str  # e.g. Tesla T4
    compute_capability: tuple[int, int]

    def __str__(self) -> str:
        major, minor = self.compute_capability
        device = self.name.removeprefix("/physical_device:")
        return f"{device} {self.model} (compute capability {major}.{minor})"


def visible_gpus() -> list[Gpu]:
    """The GPUs TensorFlow sees (every one of them, unless CUDA_VISIBLE_DEVICES hides some)."""
    found = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        found.append(Gpu(device.name, details.get("device_name", "unknown GPU"),
                         tuple(details.get("compute_capability", (0, 0)))))
    return found


def missing_cuda_wheels() -> list[str]:
    """The distributions of `tensorflow[and-cuda]` that are not installed, from TensorFlow's metadata."""
    wanted = [Requirement(text) for text in importlib.metadata.requires("tensorflow") or ()]
    missing = []
    for requirement in wanted:
        marker = requirement.marker
        if marker is None or not marker.evaluate({"extra": CUDA_EXTRA}) or marker.evaluate({"extra": ""}):
            continue
        try:
            importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement.name)
    return missing


def driver_loads() -> bool:
    try:
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError:
        return False
    return True


def why_no_gpu() -> str:
    """What keeps TensorFlow from the GPUs, as far as this process can tell."""
    reasons = []
    if not tf.sysconfig.get_build_info().get("is_cuda_build"):
        reasons.append("this TensorFlow is built without CUDA")
    elif missing := missing_cuda_wheels():
        reasons.append(f"the CUDA libraries of tensorflow[{CUDA_EXTRA}] are not installed (no {missing[0]}): "
                       "the CPU trainer image?")
    if not driver_loads():
        path = os.environ.get(LIBRARY_PATH, "")
        reasons.append(f"the NVIDIA driver's {DRIVER_LIBRARY} does not load with {LIBRARY_PATH}={path!r} "
                       f"(no driver on the node, or its directory, on GKE {GKE_DRIVER_LIBRARIES}, not on "
                       "the path)")
    if not reasons:
        reasons.append("the driver and the CUDA libraries load, so see TensorFlow's log above "
                       "(a driver too old for this TensorFlow's CUDA?)")
    return "; ".join(reasons)


def require_gpus(given: int, seen: list[Gpu]) -> None:
    """Refuses to go on with fewer GPUs than the pod was given (`given`, 0 when none)."""
    if len(seen) >= given:
        return
    gpus = f"{given} GPU{'s' if given > 1 else ''}"
    if seen:
        raise GpuUnavailable(f"given {gpus} (--gpus {given}), TensorFlow sees {len(seen)} "
                             f"({', '.join(map(str, seen))}); refusing to train on fewer")
    raise GpuUnavailable(f"given {gpus} (--gpus {given}), TensorFlow sees none: {why_no_gpu()}; "
                         "refusing to train on the CPU")


def describe(gpus: list[Gpu]) -> str:
    if not gpus:
        return "the CPU (no GPU visible)"
    return f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''}: {', '.join(map(str, gpus))}"


def mixed_precision_supported(gpus: list[Gpu]) -> bool:
    """True when there are GPUs and every one of them has Tensor Cores."""
    return bool(gpus) and all(gpu.compute_capability >= MIXED_PRECISION_MIN_CAPABILITY for gpu in gpus)
