"""The dynamic batcher, on its own event loop."""

from __future__ import annotations

import asyncio
import time

from serving.batching import DynamicBatcher


def doubling(calls: list[list[int]]):
    def run(requests):
        calls.append(list(requests))
        time.sleep(0.01)
        return [r * 2 for r in requests]
    return run


def test_concurrent_requests_share_model_calls_and_get_their_own_results():
    calls: list[list[int]] = []
    sizes: list[int] = []
    batcher = DynamicBatcher(doubling(calls), size_of=lambda r: 1, max_batch_size=8, max_wait_seconds=0.05,
                             observe_batch=sizes.append)

    async def main():
        return await asyncio.gather(*[batcher.submit(i) for i in range(20)])

    assert asyncio.run(main()) == [i * 2 for i in range(20)]
    assert len(calls) < 20 and max(len(c) for c in calls) == 8
    assert sizes == [len(c) for c in calls]


def test_a_lone_request_waits_at_most_max_wait():
    batcher = DynamicBatcher(doubling([]), size_of=lambda r: 1, max_batch_size=64, max_wait_seconds=0.02)

    async def main():
        started = time.perf_counter()
        result = await batcher.submit(21)
        return result, time.perf_counter() - started

    result, seconds = asyncio.run(main())
    assert result == 42 and seconds < 0.5


def test_a_model_error_reaches_every_request_of_the_batch_and_the_next_batch_works():
    failing = {"on": True}

    def run(requests):
        if failing["on"]:
            raise RuntimeError("model broke")
        return list(requests)

    batcher = DynamicBatcher(run, size_of=lambda r: 1, max_batch_size=4, max_wait_seconds=0.05)

    async def main():
        results = await asyncio.gather(*[batcher.submit(i) for i in range(3)], return_exceptions=True)
        failing["on"] = False
        return results, await batcher.submit(7)

    results, after = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) for r in results) and after == 7


def test_batches_count_instances_not_requests():
    sizes: list[int] = []
    batcher = DynamicBatcher(lambda requests: list(requests), size_of=len, max_batch_size=8,
                             max_wait_seconds=0.05, observe_batch=sizes.append)

    async def main():
        return await asyncio.gather(*[batcher.submit([0] * 5) for _ in range(3)])

    asyncio.run(main())
    assert sizes == [10, 5]
