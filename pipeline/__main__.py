"""The pipeline's command line.

    python -m pipeline run [--config FILE] [--data-source SRC] [--fallback-source SRC]
        [--variants V...] [--workers N] [--epochs N] [--steps-per-epoch N]
        [--batch-size-per-replica B] [--retries R] [--storage-root DIR] [--parallelism P]
        [--min-improvement M] [--strategy sync|parameter-server] [--parameter-servers N]
        [--rollout promote|rollback] [--serve]
    python -m pipeline promote [--config FILE] [--storage-root DIR]
    python -m pipeline rollback [--config FILE] [--storage-root DIR] [--to-version N]
    python -m pipeline render --out DIR [--config FILE] [--argo-version v4.1.2] [--prometheus-url URL] \
        [--tracking-uri URL]

`run` is the local engine (processes on this machine); `render` writes the Argo WorkflowTemplate and
Workflow that run the same steps on Kubernetes (--prometheus-url: where KEDA reads the predictor's
load in that cluster, for serving.autoscaling.metric inflight or rps; default: where the stacks'
monitoring serves it; --tracking-uri: the MLflow tracking server its pods record into, default
pipeline.tracking.uri when that is a server's, else none). Flags override the config file's
`pipeline` keys.
`run --rollout` decides the canary regardless of its evidence (for tests and demos). `promote` and
`rollback` settle the local canary by hand, as the rollout step would; without a canary, `rollback`
serves the committed version before the served one (or --to-version), deleting nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from common import cli
from common.cluster_target import DEFAULT_ARGO_VERSION, DEFAULT_PROMETHEUS_URL, ClusterTarget
from common.tracking_names import tracking_uri_problem
from pipeline import argo, local_canary, local_tracking
from pipeline.config import ConfigError, PipelineConfig, load_config
from pipeline.local import StepFailed, install_stop_handlers, run_pipeline
from pipeline.local_canary import Forced, RolloutRefused
from serving.client import ServerError
from serving.process import ServerFailed
from trainer.model_repository import RolloutStateError

# Flag -> config key: the flags are spelled like the trainer's, the keys like the stack config's.
OVERRIDES = {
    "data_source": "dataSource", "fallback_source": "fallbackDataSource", "variants": "variants",
    "workers": "workers", "epochs": "epochs", "steps_per_epoch": "stepsPerEpoch",
    "batch_size_per_replica": "batchSizePerReplica", "storage_root": "storageRoot",
    "parallelism": "parallelism", "retries": "retries",
    "strategy": "strategy", "parameter_servers": "parameterServers",
}
# Flag -> key of the `pipeline.promotion` section.
PROMOTION_OVERRIDES = {"min_improvement": "minImprovement"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="pipeline", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run every step as local processes")
    run.add_argument("--config", type=Path, help="YAML with 'pipeline' and 'serving' sections")
    run.add_argument("--data-source")
    run.add_argument("--fallback-source", help="used only when the data source is unreachable")
    run.add_argument("--variants", nargs="+")
    # Numbers stay text here so that the config parser judges them, naming the config key.
    for flag in ("--workers", "--epochs", "--steps-per-epoch", "--batch-size-per-replica",
                 "--parallelism", "--retries", "--parameter-servers"):
        run.add_argument(flag, type=int)
    run.add_argument("--strategy", help="sync or parameter-server, for every variant")
    run.add_argument("--storage-root", help="where data, checkpoints, exports, models and logs go")
    run.add_argument("--min-improvement", type=float,
                     help="publish only if the winner's validation accuracy beats the served version's "
                          "by this (0-1; pipeline.promotion.minImprovement)")
    run.add_argument("--rollout", choices=[forced.value for forced in Forced],
                     help="decide the canary this way whatever its evidence (tests, demos)")
    run.add_argument("--serve", action="store_true", help="keep serving in the foreground until Ctrl-C")
    promote = commands.add_parser("promote", help="give the local canary all traffic")
    rollback = commands.add_parser("rollback", help="drop the local canary, or serve an earlier version")
    for settle in (promote, rollback):
        settle.add_argument("--config", type=Path)
        settle.add_argument("--storage-root", help="the local engine's directory (pipeline.storageRoot)")
    rollback.add_argument("--to-version", type=cli.positive_int,
                          help="without a canary: the version to serve (default: the one before)")
    render = commands.add_parser("render", help="write the Argo WorkflowTemplate and Workflow")
    render.add_argument("--config", type=Path)
    render.add_argument("--out", type=Path, required=True)
    render.add_argument("--argo-version", type=argo_version, default=DEFAULT_ARGO_VERSION,
                        help="the Argo Workflows release to render for (v3.x or v4.x)")
    render.add_argument("--prometheus-url", type=cli.http_url, default=DEFAULT_PROMETHEUS_URL,
                        help="the cluster's Prometheus, where KEDA reads the predictor's load "
                             "(serving.autoscaling.metric inflight or rps; default: the stacks')")
    render.add_argument("--tracking-uri", type=cli.http_url,
                        help="the MLflow tracking server the workflow's pods record into (default: "
                             "pipeline.tracking.uri when it is an http(s) server's; else none)")
    return parser.parse_args(argv)


def argo_version(text: str) -> str:
    if not argo.SUPPORTED_ARGO_VERSION.match(text):
        raise argparse.ArgumentTypeError(f"must be an Argo Workflows release v3.x.y or v4.x.y, got {text}")
    return text


def overrides(args: argparse.Namespace) -> dict:
    found = {key: getattr(args, flag) for flag, key in OVERRIDES.items()
             if getattr(args, flag, None) is not None}
    promotion = {key: getattr(args, flag) for flag, key in PROMOTION_OVERRIDES.items()
                 if getattr(args, flag, None) is not None}
    if promotion:
        found["promotion"] = promotion
    return found


def cluster_tracking_uri(config: PipelineConfig) -> str | None:
    """pipeline.tracking.uri when pods could reach it (a server's), else None."""
    uri = config.tracking.uri
    return uri if uri and tracking_uri_problem(uri, server_only=True) is None else None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        config = load_config(args.config, overrides(args) if args.command != "render" else None)
    except ConfigError as error:
        raise cli.UsageError(f"config: {error}") from None
    if args.command == "render":
        target = ClusterTarget(argo_version=args.argo_version, prometheus_url=args.prometheus_url,
                               tracking_uri=args.tracking_uri or cluster_tracking_uri(config))
        written = argo.write(config, args.out, target)
        for path in written:
            print(f"render: wrote {path}")
        return
    if args.command in ("promote", "rollback"):
        try:
            tracked = local_tracking.of_what_was_recorded(config, args.command)
            print(local_canary.by_hand(local_canary.model_base(config), args.command == "promote",
                                       getattr(args, "to_version", None), tracked))
        except (RolloutRefused, RolloutStateError) as error:
            raise cli.UsageError(f"{args.command}: {error}") from None
        return
    install_stop_handlers()
    try:
        run_pipeline(config, serve_forever=args.serve,
                     forced_rollout=Forced(args.rollout) if args.rollout else None)
    except KeyboardInterrupt:
        print("pipeline: interrupted; every child process is stopped", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    cli.run("pipeline", main, expected=(StepFailed, ServerFailed, ServerError))
