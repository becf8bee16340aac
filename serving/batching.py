"""Dynamic batching: concurrent requests are merged into one model call.

The first waiting request opens a batch; it closes when it holds `max_batch_size` instances or
`max_wait_seconds` have passed, and runs in a worker thread so the event loop keeps accepting.

It can neither hang nor grow without bound: at most `max_queued` instances are admitted and not yet
answered (past that, `submit` raises QueueFull at once); an exception in one batch fails that
batch's requests and the loop goes on; results are matched to requests strictly; a request whose
caller went away (its future cancelled) is left out of the model call and blocks nobody.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Callable, Generic, Sequence, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")
logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The batcher holds `max_queued` instances already: the caller should retry later (a 503)."""

    def __init__(self, queued: int, size: int, max_queued: int):
        super().__init__(f"server busy: {queued} images queued, {size} more would pass the limit of "
                         f"{max_queued}; retry shortly")


class BatchFailed(RuntimeError):
    """The model call of a batch failed, or returned results that do not match its requests
    (a server error, a 500, whatever the cause was: it is not the request's fault)."""


@dataclasses.dataclass
class _Pending(Generic[Request, Result]):
    request: Request
    size: int
    future: asyncio.Future


class DynamicBatcher(Generic[Request, Result]):
    """`run` takes a list of requests and returns one result per request, in order; a result that is
    an exception fails only its own request. `observe_batch` is told the number of instances of each
    model call; `on_queue_full` is called for each request refused with QueueFull."""

    def __init__(self, run: Callable[[Sequence[Request]], list[Result | BaseException]],
                 size_of: Callable[[Request], int], max_batch_size: int, max_wait_seconds: float,
                 observe_batch: Callable[[int], None] = lambda size: None,
                 max_queued: int | None = None, on_queue_full: Callable[[], None] = lambda: None):
        self.run, self.size_of, self.observe_batch = run, size_of, observe_batch
        self.max_batch_size, self.max_wait_seconds = max_batch_size, max_wait_seconds
        self.max_queued, self.on_queue_full = max_queued, on_queue_full
        self.queued = 0  # instances admitted and not yet answered (waiting, collected or running)
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None

    def _admit(self, size: int) -> None:
        # An empty batcher admits any one request, so that one larger than the bound is not refused
        # for ever; otherwise the bound holds.
        if self.max_queued is not None and self.queued > 0 and self.queued + size > self.max_queued:
            self.on_queue_full()
            raise QueueFull(self.queued, size, self.max_queued)
        self.queued += size

    async def submit(self, request: Request) -> Result:
        size = self.size_of(request)
        self._admit(size)
        try:
            if self._queue is None:
                self._queue = asyncio.Queue()
            if self._worker is None or self._worker.done():  # never left without a worker
                self._worker = asyncio.create_task(self._serve())
            pending = _Pending(request, size, asyncio.get_running_loop().create_future())
            self._queue.put_nowait(pending)  # never blocks: admission above bounds the queue
            return await pending.future  # cancelled with the caller: the batch loop skips it
        finally:
            self.queued -= size

    async def _next_live(self, deadline: float | None) -> _Pending:
        """The next queued request whose caller is still waiting (asyncio.TimeoutError at the
        loop time `deadline`)."""
        loop = asyncio.get_running_loop()
        while True:
            if deadline is None:
                pending = await self._queue.get()
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise asyncio.TimeoutError
                pending = await asyncio.wait_for(self._queue.get(), remaining)
            if not pending.future.done():
                return pending

    async def _collect(self) -> list[_Pending]:
        batch = [await self._next_live(None)]
        size = batch[0].size
        deadline = asyncio.get_running_loop().time() + self.max_wait_seconds
        while size < self.max_batch_size:
            try:
                pending = await self._next_live(deadline)
            except asyncio.TimeoutError:
                break
            batch.append(pending)
            size += pending.size
        return batch

    async def _serve(self) -> None:
        while True:
            batch = await self._collect()
            try:
                await self._run_batch(batch)
            except Exception as error:  # the loop must outlive any one batch
                logger.exception("batch of %d requests failed", len(batch))
                fail(batch, BatchFailed(f"model call failed: {error}"))

    async def _run_batch(self, batch: list[_Pending]) -> None:
        batch = [p for p in batch if not p.future.done()]  # callers gone while it was collected
        if not batch:
            return
        self.observe_batch(sum(p.size for p in batch))
        results = await asyncio.to_thread(self.run, [p.request for p in batch])
        if len(results) != len(batch):
            raise BatchFailed(f"the model returned {len(results)} results for {len(batch)} requests")
        for pending, result in zip(batch, results, strict=True):
            if pending.future.done():  # its caller went away while the model ran
                continue
            if isinstance(result, BaseException):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)


def fail(batch: Sequence[_Pending], error: BaseException) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)
