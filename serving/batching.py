"""Dynamic batching: concurrent requests are merged into one model call.

One model call at a time, in a worker thread so the event loop keeps accepting. A request that finds
the model idle opens a batch at once with everything already queued (up to `max_batch_size`
instances); the requests that arrive while the model is busy queue, and make up the next batch as
soon as it is free. So batching costs nothing when there is nothing to batch, and batches grow with
the load, as TF Serving's and Triton's schedulers do with a zero batch timeout / queue delay.
`max_wait_seconds` > 0 also holds a batch open that long for more requests before it runs
(a latency floor, traded for fuller batches).

It can neither hang nor grow without bound: at most `max_queued` instances are admitted and not yet
answered (past that, `submit` raises QueueFull at once); an exception in one batch fails that
batch's requests and the loop goes on; results are matched to requests strictly; a request whose
caller went away (its future cancelled) is left out of the model call and blocks nobody.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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
        # One thread of its own for the model calls: they run one at a time anyway, and the default
        # executor's contextvars copy and thread pool bookkeeping are paid per batch for nothing.
        self._model_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="batch-worker")

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

    def _take_queued(self, batch: list[_Pending], size: int) -> int:
        """Adds to `batch` the live requests already queued while it holds under `max_batch_size`
        instances (as `_collect` does, the last one may take it past); returns the batch's size."""
        while size < self.max_batch_size and not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.future.done():
                batch.append(pending)
                size += pending.size
        return size

    async def _collect(self) -> list[_Pending]:
        batch = [await self._next_live(None)]
        size = self._take_queued(batch, batch[0].size)
        if self.max_wait_seconds <= 0:
            return batch
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
        results = await asyncio.get_running_loop().run_in_executor(
            self._model_thread, self.run, [p.request for p in batch])
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
