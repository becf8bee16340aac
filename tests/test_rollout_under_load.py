"""A rollout under load (issue 24, item 2, the local part): 8 concurrent clients keep sending while
the local engine (pipeline.local_canary) starts a canary, promotes it, then starts a newer one and
rolls it back. Every request must get a 200 from one of the versions: switching versions in place
drops nothing.

The load is serving.loadtest's requests (the same bodies, client and timeout) from one event loop in
a background thread, stopped once the sequence is over; unlike loadtest's report it keeps, per
response, the status and the version that answered (the x-model-version header, checked against the
`model_version` the body names, v1 and v2 alike)."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from pipeline.config import parse_config
from pipeline.local_canary import Forced, model_base, run_canary, starting_state, traffic_images
from serving import loadtest
from serving.model import VERSION_HEADER
from serving.process import model_server
from trainer import atomic, model_repository
from trainer.model_repository import RolloutState

pytestmark = pytest.mark.slow

MODEL = "fmnist"
CONCURRENCY = 8
PROTOCOLS = ("v1", "v2")  # alternated request by request; both name the version in their body
POLL_SECONDS = 0.2  # the server's version watcher
CANARY_PERCENT = 50
MIN_CANARY_REQUESTS = 20
LOAD_SECONDS = 60  # the load's hard bound, whatever happens
MAX_REQUESTS = 40_000
SWITCH_SECONDS = 30  # for the server to serve only the settled version
SETTLED_RESPONSES = 40  # consecutive answers from one version that show the switch is over
LOG_TAIL_CHARS = 3000


class Load:
    """CONCURRENCY workers sending until `stop()`, LOAD_SECONDS or MAX_REQUESTS; each response's
    (time, status, version), the status an exception's name when there was no answer."""

    def __init__(self, url: str, images: list[bytes]):
        self.targets = [(protocol, *loadtest.request_target(url, [image], protocol, MODEL))
                        for image in images for protocol in PROTOCOLS]
        self.records: list[tuple[float, int | str, str | None]] = []
        self.failures: list[str] = []  # what each non-200 or mismatched answer said, for the report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="load", daemon=True)
        self.seconds = 0.0

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(LOAD_SECONDS + loadtest.REQUEST_TIMEOUT_SECONDS)
        assert not self._thread.is_alive(), "the load did not stop"

    def versions_since(self, index: int) -> list[str | None]:
        return [version for _, _, version in self.records[index:]]

    async def _run(self) -> None:
        tickets = itertools.count()
        started = time.monotonic()
        deadline = started + LOAD_SECONDS
        connector = aiohttp.TCPConnector(limit=CONCURRENCY)
        timeout = aiohttp.ClientTimeout(total=loadtest.REQUEST_TIMEOUT_SECONDS)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def worker() -> None:
                while not self._stop.is_set() and time.monotonic() < deadline:
                    ticket = next(tickets)
                    if ticket >= MAX_REQUESTS:
                        return
                    self.records.append(await self._send(session, *self.targets[ticket % len(self.targets)]))

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        self.seconds = time.monotonic() - started

    async def _send(self, session: aiohttp.ClientSession, protocol: str, target: str, body: bytes,
                    headers: dict) -> tuple[float, int | str, str | None]:
        try:
            async with session.post(target, data=body, headers=headers) as response:
                text = await response.text()
                status, version = response.status, response.headers.get(VERSION_HEADER)
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            self.failures.append(f"{protocol}: {type(error).__name__}: {error}")
            return time.monotonic(), type(error).__name__, None
        if status != 200:
            self.failures.append(f"{protocol}: {status}: {text[:300]}")
        elif str(json.loads(text).get("model_version")) != version:
            self.failures.append(f"{protocol}: header version {version}, body {text[:200]}")
            status = "version mismatch"
        return time.monotonic(), status, version


def log_tail(log: Path) -> str:
    return log.read_text()[-LOG_TAIL_CHARS:] if log.exists() else "(no server log)"


def only_version(load: Load, version: int, log: Path) -> None:
    """Until the last SETTLED_RESPONSES answers of the load all came from `version`."""
    deadline = time.monotonic() + SWITCH_SECONDS
    while True:
        last = load.versions_since(-SETTLED_RESPONSES)
        if len(last) == SETTLED_RESPONSES and set(last) == {str(version)}:
            return
        assert time.monotonic() < deadline, (f"the server did not settle on version {version}: "
                                             f"{Counter(last)}\n{log_tail(log)}")
        time.sleep(POLL_SECONDS)


def start_canary(root: Path, base: Path) -> RolloutState:
    """What a pipeline run that publishes a version does before serving: the next version, then the
    rollout state with it as the canary beside the version served."""
    published = model_repository.publish(base / "1", root / "models", MODEL)
    state = starting_state(base, published, CANARY_PERCENT)
    model_repository.write_rollout(base, state)
    return state


def test_every_request_is_answered_while_canaries_are_promoted_and_rolled_back(
        two_worker_export: Path, data_dir: Path, tmp_path: Path):
    started = time.monotonic()
    root = tmp_path / "root"
    config = parse_config({"pipeline": {"storageRoot": str(root), "modelName": MODEL, "rollout": {
        "canaryPercent": CANARY_PERCENT, "minRequests": MIN_CANARY_REQUESTS, "maxWait": "20s"}}})
    base = model_base(config)
    shutil.copytree(two_worker_export, base / "1", ignore=shutil.ignore_patterns(atomic.COMMIT_MARKER))
    atomic.commit(base / "1", {"model_name": MODEL, "version": 1})
    model_repository.write_rollout(base, starting_state(base, None, CANARY_PERCENT))
    assert model_repository.read_rollout(base) == RolloutState(1)

    log = tmp_path / "server.log"
    with model_server(root / "models", MODEL, log, "--poll-seconds", POLL_SECONDS) as (url, _):
        load = Load(url, traffic_images(data_dir, 16)).start()
        try:
            only_version(load, 1, log)

            state = start_canary(root, base)
            assert state == RolloutState(1, 2, CANARY_PERCENT)
            decision, _ = run_canary(config, url, data_dir, Forced.PROMOTE)
            assert decision.promote and decision.canary.requests >= MIN_CANARY_REQUESTS, (
                f"{decision}\n{log_tail(log)}")
            assert model_repository.read_rollout(base) == RolloutState(2)
            only_version(load, 2, log)

            state = start_canary(root, base)
            assert state == RolloutState(2, 3, CANARY_PERCENT)
            decision, _ = run_canary(config, url, data_dir, Forced.ROLLBACK)
            assert not decision.promote and decision.canary.requests >= MIN_CANARY_REQUESTS, (
                f"{decision}\n{log_tail(log)}")
            assert model_repository.read_rollout(base) == RolloutState(2)
            only_version(load, 2, log)
        finally:
            load.stop()

    statuses = Counter(status for _, status, _ in load.records)
    by_version = Counter(version for _, status, version in load.records if status == 200)
    print(f"\n{len(load.records)} requests in {load.seconds:.1f}s at {CONCURRENCY} clients; "
          f"statuses {dict(statuses)}; 200s by version {dict(sorted(by_version.items()))}; "
          f"test {time.monotonic() - started:.1f}s")
    assert statuses == {200: len(load.records)}, (
        f"{dict(statuses)}; first failures: {load.failures[:5]}\n{log_tail(log)}")
    assert not load.failures
    assert len(load.records) < MAX_REQUESTS and load.seconds < LOAD_SECONDS, "the load hit its bound"
    assert set(by_version) == {"1", "2", "3"}, dict(by_version)  # each version answered some
    assert model_repository.versions(root / "models", MODEL) == [1, 2, 3]  # nothing deleted
