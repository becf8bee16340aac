"""Benchmark: the model server against the in-process ceiling and a naive per-request server.

    python -m benchmarks.serve_throughput [--model-repo REPO] [--seconds S]

On the same PNG images (one per request, v1 `image_bytes`): (a) the ceiling, batched calls of the
SavedModel's serving_default in this process; (b) our server (dynamic batching, up to 32 instances,
5 ms wait) at concurrency 1, 5 and 32; (c) the naive baseline, the same server with batches of
one, so one model call per request. Targets: at concurrency 32, (b) >= 60% of (a) and >= 3x (c);
at concurrency 5, no errors and p99 <= 5x p50. Then (d), not a target: the server at concurrency
32 with several images per request, which shows how much of the gap to (a) is the cost of a request
rather than of batching. Without --model-repo, a small model is trained on the sample first
(throughput does not depend on how well it was trained).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tensorflow as tf
from PIL import Image

from serving.loadtest import Report, run_load
from serving.process import model_server
from trainer import fashion_mnist, model_repository
from trainer.ingest import ingest

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO_ROOT / "datasets" / "fashion-mnist-sample"
MODEL = "fmnist"
CEILING_BATCH = 32
CONCURRENCIES = (1, 5, 32)
IMAGES_PER_REQUEST = 8


def train_small_model(work: Path) -> Path:
    ingest(str(SAMPLE_DIR), work / "data")
    subprocess.run([sys.executable, "-m", "trainer.train", "--model", "cnn", "--data-dir", work / "data",
                    "--checkpoint-dir", work / "checkpoints", "--export-dir", work / "export",
                    "--epochs", "1"], check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    model_repository.publish(work / "export", work / "models", MODEL)
    return work / "models"


def test_images(count: int = 100) -> list[bytes]:
    test = fashion_mnist.read_split(SAMPLE_DIR, "test")
    encoded = []
    for pixels in test.images[:count]:
        buffer = io.BytesIO()
        Image.fromarray(pixels[..., 0]).save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    return encoded


def ceiling(repo: Path, images: list[bytes], seconds: float) -> float:
    """Images per second of batched in-process calls of serving_default."""
    version = model_repository.latest_version(repo, MODEL)
    serve = tf.saved_model.load(str(repo / MODEL / str(version))).signatures["serving_default"]
    batch = tf.constant((images * CEILING_BATCH)[:CEILING_BATCH])
    serve(image_bytes=batch)  # trace and warm up
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        serve(image_bytes=batch)
        done += CEILING_BATCH
    return done / (time.perf_counter() - started)


def measure(url: str, images: list[bytes], concurrency: int, seconds: float,
            images_per_request: int = 1) -> Report:
    run_load(url, images, concurrency, total_requests=2 * concurrency,
             images_per_request=images_per_request)  # warm up
    return run_load(url, images, concurrency, duration=seconds, images_per_request=images_per_request)


def row(name: str, report: Report) -> str:
    return (f"{name:<32} {report.requests_per_second:>9.1f} {report.images_per_second:>9.1f} "
            f"{report.percentile(50) * 1000:>9.1f} {report.percentile(99) * 1000:>9.1f} "
            f"{report.error_rate:>7.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repo", type=Path)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    try:
        repo = args.model_repo or train_small_model(work)
        images = test_images()
        ceiling_rate = ceiling(repo, images, args.seconds)
        print(f"bench-serve: {len(images)} PNG images, one per request, v1 image_bytes; "
              f"{os.cpu_count()} CPUs shared by server and load generator")
        print(f"(a) ceiling, in-process batches of {CEILING_BATCH}: {ceiling_rate:.1f} images/s")
        print(f"{'':<32} {'req/s':>9} {'images/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'errors':>7}")
        ours = {}
        with model_server(repo, MODEL, work / "server.log", "--max-batch-size", 32) as (url, _):
            for concurrency in CONCURRENCIES:
                ours[concurrency] = measure(url, images, concurrency, args.seconds)
                print(row(f"(b) server, concurrency {concurrency}", ours[concurrency]))
            several = measure(url, images, 32, args.seconds, IMAGES_PER_REQUEST)
        with model_server(repo, MODEL, work / "naive.log", "--max-batch-size", 1) as (url, _):
            naive = measure(url, images, 32, args.seconds)
            print(row("(c) naive, concurrency 32", naive))
        print(row(f"(d) server, 32, {IMAGES_PER_REQUEST} images/request", several))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    at_32, at_5 = ours[32], ours[5]
    print(f"concurrency 32: {at_32.requests_per_second / ceiling_rate:.0%} of the ceiling (target >= 60%), "
          f"{at_32.requests_per_second / naive.requests_per_second:.1f}x the naive server (target >= 3x)")
    print(f"concurrency 5: errors {at_5.error_rate:.2%} (target 0), p99/p50 "
          f"{at_5.percentile(99) / at_5.percentile(50):.1f} (target <= 5)")
    print(f"{IMAGES_PER_REQUEST} images per request: {several.images_per_second / ceiling_rate:.0%} "
          f"of the ceiling")


if __name__ == "__main__":
    main()
