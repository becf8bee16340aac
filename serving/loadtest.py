"""A bounded load test of the model server, like `hey` (which the original designs use).

    python -m serving.loadtest --url URL --concurrency C (--duration S | --requests N)
        [--images DIR] [--images-per-request K] [--protocol v1|v2|v2-binary|grpc]
        [--grpc-address HOST:PORT] [--model-name fmnist] [--plot FILE.png] [--max-error-rate R]

C concurrent workers send K images per request (default 1), round robin over DIR's PNG and JPEG
files (default: a few generated images), to the given URL (or, with grpc, --grpc-address) only,
until S seconds or N requests. Prints requests per second, latency p50/p90/p99/max, counts by
status (gRPC's OK counts as 200, other gRPC codes by name) and a latency histogram; exits non-zero
when the error rate exceeds --max-error-rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import itertools
import time
from collections import Counter
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Sequence

import aiohttp
import grpc
import numpy as np
from PIL import Image

from common import cli
from serving.client import (
    DEFAULT_GRPC_ADDRESS,
    DEFAULT_URL,
    PROTOCOLS,
    grpc_address,
    grpc_request,
    http_request,
)
from serving.grpc_messages import model_infer

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
HISTOGRAM_BINS = 10
HISTOGRAM_WIDTH = 40
REQUEST_TIMEOUT_SECONDS = 30
GRPC_OK = 200  # a gRPC call that succeeded counts as an HTTP 200 in the report


class TooManyErrors(RuntimeError):
    """The error rate exceeded --max-error-rate."""


@dataclasses.dataclass
class Report:
    seconds: float
    latencies: list[float]  # of every request, successful or not, in seconds
    statuses: Counter  # HTTP status, or the exception's name when there was no response
    images_per_request: int = 1

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def error_rate(self) -> float:
        return 1 - self.statuses.get(200, 0) / self.requests if self.requests else 0.0

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def images_per_second(self) -> float:
        return self.requests_per_second * self.images_per_request

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else 0.0

    def summary(self) -> str:
        throughput = f"{self.requests_per_second:.1f} requests/s"
        if self.images_per_request > 1:
            throughput += f", {self.images_per_second:.1f} images/s ({self.images_per_request} per request)"
        lines = [
            f"requests: {self.requests} in {self.seconds:.2f}s, {throughput}",
            "latency: " + ", ".join(f"p{q} {self.percentile(q) * 1000:.1f} ms" for q in (50, 90, 99))
            + f", max {max(self.latencies, default=0) * 1000:.1f} ms",
            "status: " + ", ".join(f"{status}: {count}" for status, count in sorted(
                self.statuses.items(), key=lambda item: str(item[0]))),
            f"error rate: {self.error_rate:.2%}",
            "latency histogram (ms):",
        ]
        if self.latencies:
            counts, edges = np.histogram(np.array(self.latencies) * 1000, bins=HISTOGRAM_BINS)
            for count, low, high in zip(counts, edges, edges[1:]):
                bar = "#" * round(HISTOGRAM_WIDTH * count / counts.max())
                lines.append(f"  {low:8.1f} - {high:8.1f} | {bar} {count}")
        return "\n".join(lines)

    def plot(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(8, 4.5))
        axes.hist(np.array(self.latencies) * 1000, bins=50, color="tab:blue")
        for q, style in ((50, "-"), (90, "--"), (99, ":")):
            axes.axvline(self.percentile(q) * 1000, color="black", linestyle=style, label=f"p{q}")
        axes.set_xlabel("latency (ms)")
        axes.set_ylabel("requests")
        axes.set_title(f"{self.requests} requests, {self.requests_per_second:.1f}/s, "
                       f"errors {self.error_rate:.1%}")
        axes.legend()
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)


def generated_images(count: int = 8) -> list[bytes]:
    """Grey PNGs of simple shapes, for when no image directory is given."""
    images = []
    for index in range(count):
        pixels = np.zeros((28, 28), np.uint8)
        pixels[4 + index:24, 6:22 - index] = 40 + 25 * index
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        images.append(buffer.getvalue())
    return images


def read_images(directory: Path) -> list[bytes]:
    paths = sorted(p for p in directory.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise cli.UsageError(f"{directory}: holds no PNG or JPEG files")
    return [path.read_bytes() for path in paths]


def run_load(url: str, images: Sequence[bytes], concurrency: int, protocol: str = "v1",
             model_name: str = "fmnist", duration: float | None = None,
             total_requests: int | None = None, images_per_request: int = 1) -> Report:
    """Sends requests from `concurrency` workers until `duration` seconds or `total_requests`.
    `url` is the server's HTTP base URL, or with protocol "grpc" its gRPC HOST:PORT."""
    if duration is None and total_requests is None:
        raise ValueError("a load test needs a duration or a number of requests")
    groups = request_images(images, images_per_request)
    if protocol == "grpc":
        calls = [grpc_request(images_to_send, model_name) for images_to_send in groups]
        return asyncio.run(_load(grpc_sender(url, calls), concurrency, duration, total_requests,
                                 images_per_request))
    targets = [request_target(url, images_to_send, protocol, model_name) for images_to_send in groups]
    return asyncio.run(_load(http_sender(targets, concurrency), concurrency, duration, total_requests,
                             images_per_request))


def request_images(images: Sequence[bytes], per_request: int) -> list[list[bytes]]:
    """One group of `per_request` images per request body, starting at each image in turn."""
    return [[images[(start + offset) % len(images)] for offset in range(per_request)]
            for start in range(len(images))]


def request_target(url: str, images: Sequence[bytes], protocol: str,
                   model_name: str) -> tuple[str, bytes, dict]:
    path, body, headers = http_request(images, protocol, model_name)
    return url.rstrip("/") + path, body, headers


# Sends request `ticket` and returns its status: an HTTP status, a gRPC code's name, or the
# exception's name when there was no answer. Used as `async with sender as send:`.
Send = Callable[[int], Awaitable[int | str]]


@contextlib.asynccontextmanager
async def http_sender(targets: Sequence[tuple[str, bytes, dict]], concurrency: int) -> AsyncIterator[Send]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def send(ticket: int) -> int | str:
            target, body, headers = targets[ticket % len(targets)]
            try:
                async with session.post(target, data=body, headers=headers) as response:
                    await response.read()
                    return response.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                return type(error).__name__

        yield send


@contextlib.asynccontextmanager
async def grpc_sender(address: str, calls: Sequence[object]) -> AsyncIterator[Send]:
    """One HTTP/2 channel for all workers, each call a stream on it, as gRPC clients do."""
    async with grpc.aio.insecure_channel(address) as channel:
        infer = model_infer(channel)

        async def send(ticket: int) -> int | str:
            try:
                await infer(calls[ticket % len(calls)], timeout=REQUEST_TIMEOUT_SECONDS)
                return GRPC_OK
            except grpc.aio.AioRpcError as error:
                return error.code().name

        yield send


async def _load(sender: contextlib.AbstractAsyncContextManager[Send], concurrency: int,
                duration: float | None, total_requests: int | None, images_per_request: int) -> Report:
    # One event loop and bodies encoded once: a thread per worker with `requests` cost the load
    # generator so much CPU per request that on a small machine it, not the server, set the pace
    # (docs/results/serving-benchmark.md).
    tickets = itertools.count()
    latencies: list[float] = []
    statuses: Counter = Counter()

    async with sender as send:
        started = time.perf_counter()
        deadline = started + duration if duration is not None else float("inf")

        async def worker() -> None:
            while time.perf_counter() < deadline:
                ticket = next(tickets)
                if total_requests is not None and ticket >= total_requests:
                    return
                sent = time.perf_counter()
                status = await send(ticket)
                latencies.append(time.perf_counter() - sent)
                statuses[status] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return Report(seconds, latencies, statuses, images_per_request)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="serving.loadtest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", type=cli.http_url, default=DEFAULT_URL, help="the server's base URL")
    parser.add_argument("--concurrency", type=cli.positive_int, required=True)
    bound = parser.add_mutually_exclusive_group(required=True)
    bound.add_argument("--duration", type=cli.positive_float, help="seconds")
    bound.add_argument("--requests", type=cli.positive_int)
    parser.add_argument("--images", type=Path, help="a directory of PNG or JPEG files")
    parser.add_argument("--images-per-request", type=cli.positive_int, default=1,
                        help="instances in each request body")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="v1")
    parser.add_argument("--grpc-address", type=grpc_address, default=DEFAULT_GRPC_ADDRESS,
                        help="the server's gRPC HOST:PORT, for --protocol grpc")
    parser.add_argument("--model-name", default="fmnist")
    parser.add_argument("--plot", type=Path, help="also draw the latency histogram as a PNG")
    parser.add_argument("--max-error-rate", type=cli.fraction, default=0.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    images = read_images(args.images) if args.images else generated_images()
    report = run_load(args.grpc_address if args.protocol == "grpc" else args.url, images,
                      args.concurrency, args.protocol, args.model_name, args.duration, args.requests,
                      args.images_per_request)
    print(report.summary(), flush=True)
    if args.plot:
        report.plot(args.plot)
        print(f"latency histogram: {args.plot}")
    if report.error_rate > args.max_error_rate:
        raise TooManyErrors(f"error rate {report.error_rate:.2%} is over --max-error-rate "
                            f"{args.max_error_rate:.2%}")


if __name__ == "__main__":
    cli.run("serving.loadtest", main, expected=(TooManyErrors,))
