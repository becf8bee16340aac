"""Benchmark: our model server against stock KServe, the in-process ceiling and a naive server.

    python -m benchmarks.serve_throughput [--model-repo REPO] [--seconds S] [--runs N]

On the same PNG images (v1 `image_bytes`), side by side in each run: (a) the ceiling, batches of 32
in this process (the SavedModel's serving_default on the encoded images, and PIL's decode into its
pixels signature as our server decodes them; the faster of the two); (b) our server (batching that
dispatches at once when the model is idle); (c) stock KServe (benchmarks.stock_kserve: a plain
kserve.Model, one model call per request, on the same ModelServer settings); (d) the naive server
(ours with batches of one). Rows: one image per request at concurrency 1, 5 and 32, 8 images per
request at concurrency 32, and v2 binary (one image, raw bytes) at concurrency 32. Columns:
requests/s, images/s, p50, p99, errors, and the server process's own CPU time (all its threads,
/proc/<pid>/stat) per request, then ratios against stock KServe. Each figure is the median of
--runs runs (the range follows). Targets (issue 14): at concurrency 1, p50 <= 1.1x stock's; CPU per
request <= stock's at every concurrency; at concurrency 32, >= 3x stock's throughput and <= 0.5 ms
of CPU per request; 8 images per request or v2 binary >= 60% of the ceiling's images/s; at
concurrency 5, p99 <= 5x p50; no errors. Without --model-repo, a small model is trained on the
sample first (throughput does not depend on how well it was trained).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf
from PIL import Image

from serving.loadtest import Report, run_load
from serving.process import listening, model_server, wait_until_ready
from trainer import fashion_mnist, model_repository
from trainer.ingest import ingest
from trainer.serving_contract import IMAGE_BYTES_INPUT, PIXELS_INPUT, PIXELS_SIGNATURE, SERVING_SIGNATURE

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = REPO_ROOT / "datasets" / "fashion-mnist-sample"
MODEL = "fmnist"
CEILING_BATCH = 32
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SERVERS = ("ours", "stock", "naive")
SERVER_NAMES = {"ours": "(b) this server", "stock": "(c) stock KServe", "naive": "(d) naive"}


@dataclasses.dataclass(frozen=True)
class Load:
    name: str
    concurrency: int
    images_per_request: int = 1
    protocol: str = "v1"
    servers: tuple[str, ...] = SERVERS


# v2 binary (serving.loadtest's "v2-binary": the images' raw bytes, no base64, no JSON parsing of the
# data): stock KServe's model (benchmarks.stock_kserve) reads v1 JSON only, so it has no cell there.
LOADS = (Load("1 image, c=1", 1), Load("1 image, c=5", 5), Load("1 image, c=32", 32),
         Load("8 images, c=32", 32, images_per_request=8),
         Load("v2 binary, c=32", 32, protocol="v2-binary", servers=("ours", "naive")))
PER_IMAGE_LOADS = ("8 images, c=32", "v2 binary, c=32")  # the 60%-of-the-ceiling target's rows


@dataclasses.dataclass(frozen=True)
class Measured:
    report: Report
    cpu_seconds: float

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000 * self.cpu_seconds / self.report.requests if self.report.requests else 0.0


Run = dict[tuple[str, str], Measured]  # (load name, server) -> what was measured


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


def images_per_second(call: Callable[[], object], seconds: float) -> float:
    call()  # trace and warm up
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        call()
        done += CEILING_BATCH
    return done / (time.perf_counter() - started)


def ceiling_calls(model_dir: Path, images: list[bytes]) -> dict[str, Callable[[], object]]:
    """One in-process batch of CEILING_BATCH images: the graph's decode, and PIL's into the pixels."""
    loaded = tf.saved_model.load(str(model_dir))
    batch = (images * CEILING_BATCH)[:CEILING_BATCH]
    encoded = tf.constant(batch)
    serve_bytes, serve_pixels = loaded.signatures[SERVING_SIGNATURE], loaded.signatures[PIXELS_SIGNATURE]

    def decode_and_call_pixels() -> object:
        pixels = np.stack([np.asarray(Image.open(io.BytesIO(data)), np.float32) for data in batch])
        return serve_pixels(**{PIXELS_INPUT: tf.constant(pixels[..., np.newaxis])})

    return {"serving_default (graph decode)": lambda: serve_bytes(**{IMAGE_BYTES_INPUT: encoded}),
            "PIL decode + pixels signature": decode_and_call_pixels}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, all its threads (fields 14 and 15 of its stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def measure(url: str, pid: int, images: list[bytes], load: Load, seconds: float) -> Measured:
    run_load(url, images, load.concurrency, load.protocol, total_requests=2 * load.concurrency,
             images_per_request=load.images_per_request)  # warm up
    before = cpu_seconds(pid)
    report = run_load(url, images, load.concurrency, load.protocol, duration=seconds,
                      images_per_request=load.images_per_request)
    return Measured(report, cpu_seconds(pid) - before)


@contextlib.contextmanager
def stock_server(model_dir: Path, log: Path) -> Iterator[tuple[str, int]]:
    with listening("benchmarks.stock_kserve", "--model-dir", model_dir, "--model-name", MODEL,
                   "--http-port", 0, log=log) as (ports, process):
        url = f"http://127.0.0.1:{ports['http']}"
        wait_until_ready(url, MODEL, process, log)
        yield url, process.pid


@contextlib.contextmanager
def all_servers(repo: Path, model_dir: Path, work: Path) -> Iterator[dict[str, tuple[str, int]]]:
    """(URL, pid) of each server, all running at once so that each run measures them side by side."""
    with model_server(repo, MODEL, work / "ours.log") as (ours_url, ours), \
            stock_server(model_dir, work / "stock.log") as stock, \
            model_server(repo, MODEL, work / "naive.log", "--max-batch-size", 1) as (naive_url, naive):
        yield {"ours": (ours_url, ours.pid), "stock": stock, "naive": (naive_url, naive.pid)}


def spread(values: list[float], fmt: str) -> str:
    """The median, and the range when the runs differ."""
    median = format(statistics.median(values), fmt)
    low, high = format(min(values), fmt), format(max(values), fmt)
    return median if low == high else f"{median} ({low}-{high})"


def requests_per_second(cell: Measured) -> float:
    return cell.report.requests_per_second


def p50(cell: Measured) -> float:
    return cell.report.percentile(50)


def cpu_per_request(cell: Measured) -> float:
    return cell.cpu_ms_per_request


def ratio(runs: list[Run], load: str, server: str, value: Callable[[Measured], float]) -> float:
    """The median over the runs of `server`'s value over stock KServe's in the same run."""
    return statistics.median(value(run[load, server]) / value(run[load, "stock"]) for run in runs)


def median(runs: list[Run], load: str, server: str, value: Callable[[Measured], float]) -> float:
    return statistics.median(value(run[load, server]) for run in runs)


def table(runs: list[Run], ceilings: list[float]) -> list[str]:
    lines = [f"{'':<15} {'':<17} {'req/s':>17} {'images/s':>17} {'p50 ms':>17} {'p99 ms':>17} "
             f"{'errors':>6} {'CPU ms/req':>17}  vs stock: req/s, p50, CPU/req"]
    for load in LOADS:
        for server in load.servers:
            cells = [run[load.name, server] for run in runs]
            reports = [cell.report for cell in cells]
            ratios = "" if server == "stock" or "stock" not in load.servers else "  ".join(
                f"{ratio(runs, load.name, server, value):.2f}x"
                for value in (requests_per_second, p50, cpu_per_request))
            lines.append(
                f"{load.name:<15} {SERVER_NAMES[server]:<17} "
                f"{spread([r.requests_per_second for r in reports], '.0f'):>17} "
                f"{spread([r.images_per_second for r in reports], '.0f'):>17} "
                f"{spread([r.percentile(50) * 1000 for r in reports], '.2f'):>17} "
                f"{spread([r.percentile(99) * 1000 for r in reports], '.2f'):>17} "
                f"{sum(r.requests - r.statuses.get(200, 0) for r in reports):>6} "
                f"{spread([c.cpu_ms_per_request for c in cells], '.2f'):>17}  {ratios}")
    for load in PER_IMAGE_LOADS:
        shares = [100 * run[load, "ours"].report.images_per_second / ceiling
                  for run, ceiling in zip(runs, ceilings, strict=True)]
        lines.append(f"{load}, this server: {spread(shares, '.0f')}% of the same run's ceiling "
                     "(target >= 60%)")
    return lines


def targets(runs: list[Run]) -> list[str]:
    c1, c5, c32 = (load.name for load in LOADS[:3])
    c5_tail = statistics.median(run[c5, "ours"].report.percentile(99) / p50(run[c5, "ours"])
                                for run in runs)
    return [f"c=1 p50: {ratio(runs, c1, 'ours', p50):.2f}x stock's (target <= 1.1)",
            "CPU per request vs stock: " + ", ".join(
                f"{load.name} {ratio(runs, load.name, 'ours', cpu_per_request):.2f}x" for load in LOADS
                if "stock" in load.servers)
            + " (target <= 1 each)",
            f"c=32 throughput: {ratio(runs, c32, 'ours', requests_per_second):.2f}x stock's (target >= 3, "
            f"stretch 4); CPU {median(runs, c32, 'ours', cpu_per_request):.2f} ms/request (target <= 0.5)",
            f"c=5 p99/p50: {c5_tail:.1f} (target <= 5)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repo", type=Path)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    try:
        repo = args.model_repo or train_small_model(work)
        model_dir = repo / MODEL / str(model_repository.latest_version(repo, MODEL))
        images = test_images()
        in_process = ceiling_calls(model_dir, images)
        runs: list[Run] = []
        ceilings: list[dict[str, float]] = []
        with all_servers(repo, model_dir, work) as servers:
            for number in range(args.runs):
                ceilings.append({name: images_per_second(call, args.seconds)
                                 for name, call in in_process.items()})
                run = {}
                for load in LOADS:  # the servers in turn for each load: side by side under contention
                    for server in load.servers:
                        url, pid = servers[server]
                        run[load.name, server] = measure(url, pid, images, load, args.seconds)
                print(f"run {number + 1} of {args.runs} done", flush=True)
                runs.append(run)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"bench-serve: {len(images)} PNG images (28x28 grey), v1 image_bytes; {os.cpu_count()} CPUs "
          f"shared by the servers and the load generator; {args.runs} runs of {args.seconds:g} s, "
          "median (range)")
    for name in in_process:
        rates = [ceiling[name] for ceiling in ceilings]
        print(f"(a) ceiling, in-process batches of {CEILING_BATCH}, {name}: {spread(rates, '.0f')} images/s")
    print("\n".join(table(runs, [max(ceiling.values()) for ceiling in ceilings])))
    print("\n".join(targets(runs)))


if __name__ == "__main__":
    main()
