"""Benchmark: how many requests in flight one predictor replica holds with its p99 under the latency
objective, and the scaling targets that follow.

    python -m benchmarks.serve_capacity [--model-repo runs/demo/models] [--config FILE]
        [--seconds 8] [--runs 3] [--concurrency 1 2 4 ...] [--plot FILE.png]

Our server with the config's serving flags serves the newest version in --model-repo (default: what
`make demo` publishes) on one CPU core (the predictor's default CPU limit, `serving.resources`: the
server's process is pinned to core 0, the load generator to the others), and serving.loadtest holds
each concurrency for --seconds, one PNG from the sample's test split per request (v1), --runs times
(the levels in turn, so that a burst of other work on the machine spoils one run of a level, not
all), each level's figures the median of its runs. The capacity is the highest concurrency at which
it and every lower one kept p99 <= serving.autoscaling.latencyObjectiveMs with no error; the targets
are CAPACITY_HEADROOM (70%) of it: requests in flight (inflight), and the requests per second it
served there (rps). Prints one line per run and concurrency, the medians and the figure; --plot draws
p50, p99 and throughput against concurrency with the objective.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from benchmarks.serve_throughput import test_images
from pipeline.config import CAPACITY_HEADROOM, PipelineConfig, load_config
from pipeline.definition import serving_flags
from serving.loadtest import Report, run_load
from serving.process import running_server

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_MODELS = REPO_ROOT / "runs" / "demo" / "models"
CONCURRENCY = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
SERVER_CORE = 0  # one core: the predictor's default CPU limit


@dataclasses.dataclass(frozen=True)
class Level:
    concurrency: int
    reports: list[Report]  # one per run

    @property
    def p50_ms(self) -> float:
        return statistics.median(report.percentile(50) for report in self.reports) * 1000

    @property
    def p99_ms(self) -> float:
        return statistics.median(report.percentile(99) for report in self.reports) * 1000

    @property
    def requests_per_second(self) -> float:
        return statistics.median(report.requests_per_second for report in self.reports)

    @property
    def error_rate(self) -> float:
        return max(report.error_rate for report in self.reports)


@dataclasses.dataclass(frozen=True)
class Capacity:
    objective_ms: float
    levels: list[Level]

    @property
    def held(self) -> Level | None:
        """The highest level at which it and every lower one kept p99 under the objective, no errors."""
        held = None
        for level in self.levels:
            if level.p99_ms > self.objective_ms or level.error_rate > 0:
                break
            held = level
        return held

    def targets(self) -> dict[str, int]:
        held = self.held
        if held is None:
            return {}
        return {"inflight": max(1, math.floor(held.concurrency * CAPACITY_HEADROOM)),
                "rps": max(1, math.floor(held.requests_per_second * CAPACITY_HEADROOM))}


@contextlib.contextmanager
def on_one_core(core: int) -> Iterator[None]:
    """Processes started in the block run on `core` alone (they inherit it); afterwards this process
    runs on the other cores, so that the load generator does not take the server's."""
    every = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, (every - {core}) or every)


def measure(url: str, images: list[bytes], model_name: str, levels: Sequence[int], seconds: float,
            runs: int, objective_ms: float) -> Capacity:
    run_load(url, images, 1, model_name=model_name, duration=2.0)  # warm up: the first batches trace
    reports: dict[int, list[Report]] = {concurrency: [] for concurrency in levels}
    for run in range(1, runs + 1):
        for concurrency in levels:
            report = run_load(url, images, concurrency, model_name=model_name, duration=seconds)
            reports[concurrency].append(report)
            print(f"run {run}  c={concurrency:3d}  {report.requests_per_second:7.1f} requests/s  "
                  f"p50 {report.percentile(50) * 1000:7.1f} ms  p99 {report.percentile(99) * 1000:7.1f} ms  "
                  f"errors {report.error_rate:.1%}", flush=True)
    measured = [Level(concurrency, reports[concurrency]) for concurrency in levels]
    for level in measured:
        print(f"median  c={level.concurrency:3d}  {level.requests_per_second:7.1f} requests/s  "
              f"p50 {level.p50_ms:7.1f} ms  p99 {level.p99_ms:7.1f} ms  errors {level.error_rate:.1%}")
    return Capacity(objective_ms, measured)


def plot(capacity: Capacity, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = capacity.levels
    concurrency = [level.concurrency for level in levels]
    figure, latency = plt.subplots(figsize=(8, 4.5))
    latency.plot(concurrency, [level.p50_ms for level in levels], "o-", label="p50")
    latency.plot(concurrency, [level.p99_ms for level in levels], "s-", label="p99")
    latency.axhline(capacity.objective_ms, color="red", linestyle="--",
                    label=f"objective (p99 {capacity.objective_ms:g} ms)")
    if capacity.held is not None:
        latency.axvline(capacity.held.concurrency, color="grey", linestyle=":",
                        label=f"capacity: {capacity.held.concurrency} in flight")
    latency.set_xlabel("requests in flight (concurrent clients)")
    latency.set_ylabel("latency (ms)")
    throughput = latency.twinx()
    throughput.plot(concurrency, [level.requests_per_second for level in levels], "^-", color="green",
                    label="requests/s")
    throughput.set_ylabel("requests/s", color="green")
    handles = latency.get_legend_handles_labels()[0] + throughput.get_legend_handles_labels()[0]
    latency.legend(handles=handles, loc="upper left", fontsize="small")
    latency.set_title(title, fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def summary(capacity: Capacity) -> str:
    held = capacity.held
    if held is None:
        return f"capacity: none: p99 exceeds {capacity.objective_ms:g} ms at concurrency 1"
    targets = capacity.targets()
    return (f"capacity: {held.concurrency} requests in flight per replica (p99 {held.p99_ms:.1f} ms <= "
            f"{capacity.objective_ms:g} ms, {held.requests_per_second:.1f} requests/s); targets at "
            f"{CAPACITY_HEADROOM:.0%}: inflight {targets['inflight']}, rps {targets['rps']}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks.serve_capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repo", type=Path, default=DEMO_MODELS)
    parser.add_argument("--config", type=Path, help="a pipeline config file (serving and its objective)")
    parser.add_argument("--seconds", type=float, default=8.0, help="per concurrency and run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=CONCURRENCY)
    parser.add_argument("--plot", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config: PipelineConfig = load_config(args.config)
    if not (args.model_repo / config.model_name).is_dir():
        print(f"benchmarks.serve_capacity: no model {config.model_name} in {args.model_repo}: run "
              "`make demo` first, or pass --model-repo", file=sys.stderr)
        return 2
    objective = config.serving.autoscaling.latency_objective_ms
    print(f"one replica on core {SERVER_CORE}; {args.runs} runs of {args.seconds:g} s per concurrency; "
          f"objective p99 <= "
          f"{objective:g} ms; load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as work, contextlib.ExitStack() as running:
        with on_one_core(SERVER_CORE):
            url, _ = running.enter_context(running_server(
                ["--model-repo", args.model_repo, *serving_flags(config)], config.model_name,
                Path(work) / "server.log"))
        capacity = measure(url, test_images(), config.model_name, args.concurrency, args.seconds, args.runs,
                           objective)
    print(summary(capacity))
    print(f"load average after: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    if args.plot:
        plot(capacity, args.plot, f"one replica (1 core): median of {args.runs} runs of {args.seconds:g} s "
                                  "per point")
        print(f"plot: {args.plot}")
    return 0 if capacity.held is not None else 1


if __name__ == "__main__":
    sys.exit(main())
