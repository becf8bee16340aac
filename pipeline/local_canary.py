"""The local engine's canary: which versions serve, the traffic that tests the canary, the decision
and what it changes.

A run that publishes version M while N is served starts the server with N stable and M the canary
at `rollout.canaryPercent` (trainer.model_repository's rollout state). With no version before M, a
canaryPercent of 0, or no version published by this run, there is no canary. The rollout step then
sends the held-out test images through the server, as Flagger's load tester does, until the canary
has answered `rollout.minRequests` requests or `rollout.maxWait` has passed, reads the server's
/metrics, and decides with serving.canary: promote (M becomes stable) or roll back (N stays; M
stays on disk). Each decision, automatic or by hand (`python -m pipeline promote|rollback`), is
appended to the model's history file with its numbers.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import json
import time
from pathlib import Path
from typing import Callable, Sequence

import requests
from PIL import Image

from pipeline.config import PipelineConfig
from pipeline.definition import Layout
from serving import client
from serving.canary import Decision, Evidence, Policy, decide, evidence_by_version
from trainer import model_repository, tracking
from trainer.atomic import write_whole
from trainer.fashion_mnist import load_split
from trainer.model_repository import RolloutState

HISTORY_FILE = "rollout-history.json"  # beside rollout.json: every decision, oldest first
# Requests sent between two reads of /metrics: a read costs about as much as a request.
REQUESTS_PER_CHECK = 20
TRAFFIC_IMAGES = 200  # distinct test images the traffic cycles through
METRICS_TIMEOUT_SECONDS = 10


class RolloutRefused(RuntimeError):
    """Nothing to promote or roll back, or a version that is not there; says which."""


class Forced(enum.Enum):
    """A decision made regardless of the evidence (tests, demos): `--rollout rollback`."""
    PROMOTE = "promote"
    ROLLBACK = "rollback"


def policy(config: PipelineConfig) -> Policy:
    rollout = config.rollout
    return Policy(rollout.min_requests, rollout.max_error_rate_increase, rollout.max_latency_ratio)


def model_base(config: PipelineConfig) -> Path:
    return Path(Layout(config.storage_root).models) / config.model_name


def release_repository(base: Path) -> str:
    """Where selection registered the versions served from `base` (`<root>/models/<name>`): their
    releases, `<root>/releases/<name>`, as a file URI (trainer.select.track)."""
    return (Path(Layout(str(base.parent.parent)).releases) / base.name).resolve().as_uri()


def starting_state(base: Path, published: int | None, canary_percent: int) -> RolloutState | None:
    """What the server starts with: `published` (a version this run just committed) as the canary
    beside the version served before it; no canary without one of those or at 0 percent. None when
    nothing is published at all."""
    if published is None:  # the served version alone: a canary an interrupted run left is not resumed
        served = model_repository.served_version(base.parent, base.name)
        return RolloutState(served) if served is not None else None
    current = model_repository.read_rollout(base)
    if current is not None:
        before = current.stable
    else:
        older = [v for v in model_repository.committed_versions(base) if v < published]
        before = older[-1] if older else None
    if before is None or canary_percent == 0:
        return RolloutState(published)
    return RolloutState(before, published, canary_percent)


def traffic_images(data_dir: Path, count: int = TRAFFIC_IMAGES) -> list[bytes]:
    """The first `count` held-out test images as PNG bytes, what a client would send."""
    images = []
    for pixels in load_split(data_dir, "test").images[:count]:
        buffer = io.BytesIO()
        Image.fromarray(pixels.squeeze()).save(buffer, format="PNG")
        images.append(buffer.getvalue())
    return images


def read_evidence(url: str, session: requests.Session) -> dict[str, Evidence]:
    """The server's evidence per version; a server that does not answer is a client.ServerError."""
    try:
        response = session.get(f"{url.rstrip('/')}/metrics", timeout=METRICS_TIMEOUT_SECONDS)
        response.raise_for_status()
    except requests.RequestException as error:
        raise client.ServerError(f"{url}/metrics: {error}") from None
    return evidence_by_version(response.text)


@dataclasses.dataclass(frozen=True)
class Observed:
    stable: Evidence
    canary: Evidence
    seconds: float


def send_traffic(url: str, model_name: str, state: RolloutState, images: Sequence[bytes],
                 min_requests: int, max_wait_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> Observed:
    """Single-image v1 requests, one after another, until the canary has answered `min_requests`
    since this started or `max_wait_seconds` have passed; what each version answered meanwhile.
    A request's failure is the server's evidence (its metrics count it), not this loop's."""
    session = requests.Session()
    started = clock()
    before = read_evidence(url, session)
    stable_label, canary_label = str(state.stable), str(state.canary)
    sent = 0
    while True:
        for _ in range(REQUESTS_PER_CHECK):
            if clock() - started >= max_wait_seconds:
                break
            try:
                client.predict([images[sent % len(images)]], url=url, model_name=model_name,
                               session=session)
            except client.ServerError:
                pass
            sent += 1
        now = read_evidence(url, session)
        canary = now.get(canary_label, Evidence()).since(before.get(canary_label, Evidence()))
        if canary.requests >= min_requests or clock() - started >= max_wait_seconds:
            stable = now.get(stable_label, Evidence()).since(before.get(stable_label, Evidence()))
            return Observed(stable, canary, clock() - started)


def forced_decision(decision: Decision, forced: Forced | None) -> Decision:
    if forced is None:
        return decision
    return Decision(forced is Forced.PROMOTE, f"forced {forced.value} (the evidence said "
                                              f"{'promote' if decision.promote else 'roll back'}: "
                                              f"{decision.reason})",
                    decision.stable, decision.canary)


def serve_state(base: Path, state: RolloutState, tracked: tracking.Tracking) -> None:
    """Writes what is served, which the server's version watcher follows, and moves MLflow's aliases
    to it (`champion` the stable version, `challenger` the canary)."""
    model_repository.write_rollout(base, state)
    tracking.follow_rollout(tracked, base.name, release_repository(base), state.stable, state.canary)


def settle(base: Path, state: RolloutState, promote: bool, tracked: tracking.Tracking = tracking.OFF
           ) -> RolloutState:
    """Promotes the canary (it becomes the stable version) or rolls it back (the stable one stays
    alone); the canary's files stay either way."""
    settled = RolloutState(state.canary if promote else state.stable)
    serve_state(base, settled, tracked)
    return settled


def record(base: Path, entry: dict) -> None:
    """Appends `entry`, timestamped, to the history (rewritten whole: a reader never sees half)."""
    path = base / HISTORY_FILE
    history = json.loads(path.read_text()) if path.exists() else []
    history.append({"time": datetime.datetime.now(datetime.timezone.utc).isoformat(), **entry})
    write_whole(path, json.dumps(history, indent=2) + "\n")


def summary(decision: Decision, state: RolloutState) -> str:
    """The one line a decision prints: what happened, why, and the numbers."""
    verb = (f"promoted version {state.canary}" if decision.promote
            else f"rolled back version {state.canary}, version {state.stable} stays")
    stable, canary = decision.stable, decision.canary
    return (f"{verb}: {decision.reason} [canary {canary.requests} requests, {canary.errors} errors, "
            f"mean {canary.mean_latency_seconds * 1000:.1f} ms; stable {stable.requests} requests, "
            f"{stable.errors} errors, mean {stable.mean_latency_seconds * 1000:.1f} ms]")


def run_canary(config: PipelineConfig, url: str, data_dir: Path, forced: Forced | None = None,
               tracked: tracking.Tracking = tracking.OFF) -> tuple[Decision, RolloutState] | None:
    """The rollout step: when the served state has a canary, test it, decide, settle and record;
    None when there is no canary."""
    base = model_base(config)
    state = model_repository.read_rollout(base)
    if state is None or state.canary is None:
        return None
    observed = send_traffic(url, config.model_name, state, traffic_images(data_dir),
                            config.rollout.min_requests, config.rollout.max_wait_seconds)
    decision = forced_decision(decide(observed.stable, observed.canary, policy(config)), forced)
    settle(base, state, decision.promote, tracked)
    record(base, {"by": "rollout step", "stable": state.stable, "canary": state.canary,
                  "canary_percent": state.canary_percent, "seconds": round(observed.seconds, 1),
                  **decision.as_record()})
    return decision, state


def by_hand(base: Path, promote: bool, to_version: int | None = None,
            tracked: tracking.Tracking = tracking.OFF) -> str:
    """`python -m pipeline promote|rollback`: settles the canary as the rollout step would. Without a
    canary, `rollback` makes `to_version` (default: the committed version before the stable one) the
    stable version. Returns the line to print."""
    state = model_repository.read_rollout(base)
    committed = model_repository.committed_versions(base)
    if state is not None and state.canary is not None:
        if to_version is not None:
            raise RolloutRefused(f"version {state.canary} is a canary: settle it first (promote or "
                                 f"rollback without --to-version)")
        settled = settle(base, state, promote, tracked)
        verb = "promoted" if promote else "rolled back"
        line = (f"{verb} version {state.canary} by hand; version {settled.stable} is served")
        record(base, {"by": "hand", "stable": state.stable, "canary": state.canary,
                      "decision": "promote" if promote else "rollback"})
        return line
    if promote:
        raise RolloutRefused(f"{base}: no canary to promote")
    stable = state.stable if state is not None else (committed[-1] if committed else None)
    if stable is None:
        raise RolloutRefused(f"{base}: no version is published")
    target = to_version if to_version is not None else max((v for v in committed if v < stable),
                                                           default=None)
    if target is None:
        raise RolloutRefused(f"no version before {stable} to roll back to")
    if target not in committed:
        raise RolloutRefused(f"version {target} is not a committed version under {base} "
                             f"({', '.join(map(str, committed))})")
    serve_state(base, RolloutState(target), tracked)
    record(base, {"by": "hand", "stable": stable, "canary": None, "decision": "rollback",
                  "to": target})
    return f"rolled back from version {stable} to version {target} by hand; {stable} stays on disk"
