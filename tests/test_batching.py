"""The dynamic batcher, on its own event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from serving.batching import BatchFailed, DynamicBatcher, QueueFull


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


def test_a_batch_that_raises_fails_only_its_requests_with_a_server_error_and_the_loop_goes_on():
    def run(requests):
        if "boom" in requests:
            raise ValueError("boom")  # a ValueError must not pass as the client's fault
        return list(requests)

    batcher = DynamicBatcher(run, size_of=lambda r: 1, max_batch_size=4, max_wait_seconds=0.01)

    async def main():
        failed = await asyncio.gather(batcher.submit("boom"), batcher.submit("x"), return_exceptions=True)
        return failed, await batcher.submit("next")

    failed, after = asyncio.run(main())
    assert all(isinstance(e, BatchFailed) and not isinstance(e, ValueError) for e in failed)
    assert after == "next"


def test_a_per_request_error_fails_only_that_request():
    batcher = DynamicBatcher(lambda requests: [KeyError(r) if r < 0 else r for r in requests],
                             size_of=lambda r: 1, max_batch_size=4, max_wait_seconds=0.02)

    async def main():
        return await asyncio.gather(*[batcher.submit(r) for r in (1, -1, 2)], return_exceptions=True)

    one, bad, two = asyncio.run(main())
    assert (one, two) == (1, 2) and isinstance(bad, KeyError)


def test_results_that_do_not_match_the_requests_fail_the_batch_not_the_loop():
    answers = {"short": True}

    def run(requests):
        return list(requests)[:-1] if answers["short"] else list(requests)

    batcher = DynamicBatcher(run, size_of=lambda r: 1, max_batch_size=4, max_wait_seconds=0.02)

    async def main():
        results = await asyncio.gather(*[batcher.submit(i) for i in range(3)], return_exceptions=True)
        answers["short"] = False
        return results, await batcher.submit(9)

    results, after = asyncio.run(main())
    assert all(isinstance(r, BatchFailed) and "2 results for 3 requests" in str(r) for r in results)
    assert after == 9


def test_a_full_queue_refuses_at_once_and_counts_it_then_admits_again():
    refused: list[int] = []
    release = threading.Event()

    def run(requests):
        release.wait(5)
        return list(requests)

    batcher = DynamicBatcher(run, size_of=len, max_batch_size=64, max_wait_seconds=0.01, max_queued=4,
                             on_queue_full=lambda: refused.append(1))

    async def main():
        first = asyncio.ensure_future(batcher.submit([1, 2, 3]))
        await asyncio.sleep(0.05)  # the first request is in the model now
        started = time.perf_counter()
        with pytest.raises(QueueFull, match="3 images queued, 2 more would pass the limit of 4"):
            await batcher.submit([4, 5])
        refused_in = time.perf_counter() - started
        release.set()
        return await first, refused_in, await batcher.submit([7, 8, 9, 10, 11])

    first, refused_in, alone = asyncio.run(main())
    assert first == [1, 2, 3] and refused_in < 0.05 and refused == [1]
    assert alone == [7, 8, 9, 10, 11]  # an empty batcher admits one request larger than the bound
    assert batcher.queued == 0


def test_a_cancelled_request_is_left_out_and_does_not_block_the_others():
    calls: list[list[int]] = []
    batcher = DynamicBatcher(doubling(calls), size_of=lambda r: 1, max_batch_size=8, max_wait_seconds=0.1)

    async def main():
        gone = asyncio.ensure_future(batcher.submit(1))
        waiting = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0.01)  # both queued, the batch still collecting
        gone.cancel()  # its client went away
        result = await asyncio.wait_for(waiting, 2)
        return result, gone.cancelled(), await asyncio.wait_for(batcher.submit(3), 2)

    result, cancelled, after = asyncio.run(main())
    assert (result, cancelled, after) == (4, True, 6)
    assert calls == [[2], [3]] and batcher.queued == 0


def test_the_worker_is_restarted_if_it_died():
    batcher = DynamicBatcher(lambda requests: list(requests), size_of=lambda r: 1, max_batch_size=4,
                             max_wait_seconds=0.01)

    async def main():
        assert await batcher.submit(1) == 1
        batcher._worker.cancel()
        await asyncio.sleep(0)
        return await asyncio.wait_for(batcher.submit(2), 2)

    assert asyncio.run(main()) == 2


def test_a_request_that_finds_the_model_idle_runs_at_once_and_those_queued_meanwhile_run_together():
    calls: list[tuple[float, list[int]]] = []

    def run(requests):
        calls.append((time.perf_counter(), list(requests)))
        time.sleep(0.2)  # the model is busy: the next requests queue
        return list(requests)

    batcher = DynamicBatcher(run, size_of=lambda r: 1, max_batch_size=32, max_wait_seconds=0)

    async def main():
        started = time.perf_counter()
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.sleep(0.05)  # the first request is in the model now
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 6)]
        return started, await first, await asyncio.gather(*rest)

    started, first, rest = asyncio.run(main())
    assert (first, rest) == (0, [1, 2, 3, 4, 5])
    assert [requests for _, requests in calls] == [[0], [1, 2, 3, 4, 5]]
    assert calls[0][0] - started < 0.05  # not held open for others: the model was idle


def test_requests_queued_while_the_model_is_busy_are_split_at_the_batch_size():
    calls: list[list[int]] = []
    batcher = DynamicBatcher(doubling(calls), size_of=lambda r: 1, max_batch_size=4, max_wait_seconds=0)

    async def main():
        return await asyncio.gather(*[batcher.submit(i) for i in range(9)])

    assert asyncio.run(main()) == [i * 2 for i in range(9)]
    assert calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
