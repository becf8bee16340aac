"""Dynamic batching: concurrent requests are merged into one model call.

The first waiting request opens a batch; it closes when it holds `max_batch_size` instances or
`max_wait_seconds` have passed, and runs in a worker thread so the event loop keeps accepting.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable, Generic, Sequence, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")


@dataclasses.dataclass
class _Pending(Generic[Request, Result]):
    request: Request
    size: int
    future: asyncio.Future


class DynamicBatcher(Generic[Request, Result]):
    """`run` takes a list of requests and returns one result per request, in order;
    `observe_batch` is told the number of instances of each model call."""

    def __init__(self, run: Callable[[Sequence[Request]], list[Result]], size_of: Callable[[Request], int],
                 max_batch_size: int, max_wait_seconds: float,
                 observe_batch: Callable[[int], None] = lambda size: None):
        self.run, self.size_of, self.observe_batch = run, size_of, observe_batch
        self.max_batch_size, self.max_wait_seconds = max_batch_size, max_wait_seconds
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None

    async def submit(self, request: Request) -> Result:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.create_task(self._serve())
        pending = _Pending(request, self.size_of(request), asyncio.get_running_loop().create_future())
        await self._queue.put(pending)
        return await pending.future

    async def _collect(self) -> list[_Pending]:
        batch = [await self._queue.get()]
        size = batch[0].size
        deadline = asyncio.get_running_loop().time() + self.max_wait_seconds
        while size < self.max_batch_size:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            try:
                pending = await asyncio.wait_for(self._queue.get(), remaining)
            except asyncio.TimeoutError:
                break
            batch.append(pending)
            size += pending.size
        return batch

    async def _serve(self) -> None:
        while True:
            batch = await self._collect()
            self.observe_batch(sum(p.size for p in batch))
            try:
                results = await asyncio.to_thread(self.run, [p.request for p in batch])
            except Exception as error:  # every waiting request gets the model's error
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)
                continue
            for pending, result in zip(batch, results):
                if not pending.future.done():
                    pending.future.set_result(result)
