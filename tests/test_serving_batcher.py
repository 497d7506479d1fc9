"""The dynamic batcher on its own, with a scripted batch runner instead of a model: which items share a batch, when
batches start, and what happens to cancelled, expired, failing and excess requests."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bertzoo.serving.batcher import Batcher
from bertzoo.serving.config import BatchSettings
from bertzoo.serving.engine import Work
from bertzoo.serving.errors import BackendFailure, DeadlineExceeded, QueueFull, Unavailable
from bertzoo.serving.metrics import Metrics
from bertzoo.tokenization import Encoding

BUCKETS = (16, 32, 64)


def bucket_for(length: int) -> int:
    return next(b for b in BUCKETS if length <= b)


def sentence(length: int, marker: int = 7) -> Work:
    return Work("sentiment", (Encoding([marker] * length, [0] * length),))


class Runner:
    """Records each batch (the markers of its works and the padded shape); can hold the worker or fail a batch."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[int], tuple[int, int]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_marker: int | None = None

    def __call__(self, works, inputs) -> list:
        self.gate.wait(10)
        markers = [w.rows[0].input_ids[0] for w in works]
        self.batches.append((markers, inputs["input_ids"].shape))
        if self.fail_marker in markers:
            raise RuntimeError("backend exploded")
        return [m * 10 for m in markers]


def run(coroutine_fn, runner: Runner, **settings):
    """Run ``coroutine_fn(batcher)`` with a started batcher, closing it after."""

    async def main():
        batcher = Batcher(runner, bucket_for, pad_id=0, settings=BatchSettings(**settings), metrics=Metrics())
        batcher.start()
        try:
            return await coroutine_fn(batcher)
        finally:
            runner.gate.set()
            await batcher.close(timeout=5)

    return asyncio.run(main())


async def until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("pad_to, width", [("longest", 8), ("bucket", 16)])
def test_requests_waiting_behind_a_running_batch_share_the_next_one(pad_to, width):
    runner = Runner()

    async def scenario(batcher: Batcher):
        runner.gate.clear()
        first = batcher.submit([sentence(5, marker=1)])
        await until(lambda: batcher._in_flight == 1)
        waiting = [batcher.submit([sentence(3 + i, marker=10 + i)]) for i in range(6)]
        runner.gate.set()
        return await first.future, [await job.future for job in waiting]

    first, waiting = run(scenario, runner, pad_to=pad_to)
    assert first == [10] and waiting == [[(10 + i) * 10] for i in range(6)]
    assert [b[0] for b in runner.batches] == [[1], list(range(10, 16))]
    # Lengths 3..8 in bucket 16: padded to the longest (8, a multiple of 8) or to the bucket.
    assert runner.batches[1][1] == (6, width)


def test_an_idle_engine_starts_a_lone_request_within_submit():
    """No event-loop turn between a lone request's arrival and its batch reaching the worker."""
    runner = Runner()

    async def scenario(batcher: Batcher):
        job = batcher.submit([sentence(5, marker=1)])
        started = batcher._in_flight
        return started, await job.future

    assert run(scenario, runner) == (1, [10])


def test_batches_respect_size_and_token_limits_and_keep_an_oversized_item_whole():
    runner = Runner()

    async def scenario(batcher: Batcher):
        runner.gate.clear()
        blocker = batcher.submit([sentence(4, marker=1)])
        await until(lambda: batcher._in_flight == 1)
        jobs = [batcher.submit([sentence(30, marker=20 + i)]) for i in range(5)]  # bucket 32: 2 fit in 64 tokens
        big = batcher.submit([Work("qa", tuple(Encoding([9] * 60, [0] * 60) for _ in range(3)))])  # 192 tokens
        runner.gate.set()
        await asyncio.gather(blocker.future, *(j.future for j in jobs), big.future)

    run(scenario, runner, max_batch_size=3, max_batch_tokens=64)
    assert [b[0] for b in runner.batches] == [[1], [20, 21], [22, 23], [24], [9]]
    assert runner.batches[-1][1] == (3, 64)


def test_the_oldest_waiting_item_picks_the_bucket():
    runner = Runner()

    async def scenario(batcher: Batcher):
        runner.gate.clear()
        blocker = batcher.submit([sentence(4, marker=1)])
        await until(lambda: batcher._in_flight == 1)
        long_job = batcher.submit([sentence(50, marker=2)])
        short_jobs = [batcher.submit([sentence(4, marker=3)]) for _ in range(3)]
        runner.gate.set()
        await asyncio.gather(blocker.future, long_job.future, *(j.future for j in short_jobs))

    run(scenario, runner)
    assert [b[0] for b in runner.batches] == [[1], [2], [3, 3, 3]]


def test_with_its_one_instance_busy_the_next_batch_is_cut_ahead_from_what_waits():
    """A GPU's setting: while the instance runs a batch, the next one is cut and padded from what waits at the end of
    that turn (not a full batch), and the instance takes it as it finishes; what comes later goes to the batch after
    it."""
    runner = Runner()

    async def scenario(batcher: Batcher):
        runner.gate.clear()
        blocker = batcher.submit([sentence(4, marker=1)])
        await until(lambda: batcher._in_flight == 1)
        early = [batcher.submit([sentence(4, marker=2)]) for _ in range(2)]  # 2 of max_batch_size 4
        await until(lambda: batcher._in_flight == 2)
        assert batcher._queue.rows == 0  # cut and padded, waiting for the worker
        late = batcher.submit([sentence(4, marker=3)])
        await asyncio.sleep(0.01)
        assert batcher._in_flight == 2 and batcher._queue.rows == 1  # one batch ahead, no more
        runner.gate.set()
        await asyncio.gather(blocker.future, *(j.future for j in early), late.future)

    run(scenario, runner, max_batch_size=4)
    assert [b[0] for b in runner.batches] == [[1], [2, 2], [3]]


def two_instances(first, second) -> Batcher:
    """A batcher with ``first`` on its own worker and ``second`` as a second instance (call from the event loop)."""
    from bertzoo.serving.workers import model_worker

    return Batcher(first, bucket_for, pad_id=0, settings=BatchSettings(), metrics=Metrics(),
                   more_instances=[(second, model_worker("main", 1))])


def test_with_every_instance_busy_the_next_batch_is_cut_ahead_and_run_by_the_first_to_finish():
    """With two instances, one waiting item is cut into a batch at once while both run; only one batch is cut ahead,
    and it runs when either instance finishes."""
    first, second = Runner(), Runner()

    async def main():
        batcher = two_instances(first, second)
        batcher.start()
        try:
            first.gate.clear()
            second.gate.clear()
            held = []
            for marker in (1, 2):  # one batch each, on the first and then the second instance
                held.append(batcher.submit([sentence(5, marker=marker)]))
                await until(lambda n=marker: batcher._in_flight == n)
            ahead = batcher.submit([sentence(5, marker=3)])
            await until(lambda: batcher._in_flight == 3)
            assert batcher._queue.rows == 0  # cut and padded ahead, with both instances busy
            later = [batcher.submit([sentence(5, marker=4)]) for _ in range(2)]
            await asyncio.sleep(0.05)
            assert batcher._in_flight == 3 and batcher._queue.rows == 2  # one batch ahead, no more
            second.gate.set()  # the second instance finishes first and takes the batch cut ahead
            assert await asyncio.wait_for(ahead.future, 5) == [30]
            assert not held[0].future.done()
            first.gate.set()
            await asyncio.gather(*(j.future for j in held + later))
        finally:
            first.gate.set()
            second.gate.set()
            await batcher.close(timeout=5)

    asyncio.run(main())
    assert [b[0] for b in first.batches][0] == [1] and [b[0] for b in second.batches][:2] == [[2], [3]]
    assert sorted(m for runner in (first, second) for b in runner.batches[1:] for m in b[0]) == [3, 4, 4]


def test_at_low_load_the_instance_that_finished_last_runs_the_next_batch():
    """One request at a time: every batch runs on the same instance (whose weights the last batch left in the
    caches), not on each instance in turn."""
    first, second = Runner(), Runner()

    async def main():
        batcher = two_instances(first, second)
        batcher.start()
        try:
            for marker in (1, 2, 3):
                await asyncio.wait_for(batcher.submit([sentence(5, marker=marker)]).future, 5)
                await until(lambda: batcher._in_flight == 0)
        finally:
            await batcher.close(timeout=5)

    asyncio.run(main())
    assert [b[0] for b in first.batches] == [[1], [2], [3]] and second.batches == []


def test_an_idle_model_waits_up_to_the_queue_delay_for_a_fuller_batch():
    runner = Runner()

    async def scenario(batcher: Batcher):
        started = time.monotonic()
        first = batcher.submit([sentence(4, marker=1)])
        await asyncio.sleep(0.02)
        second = batcher.submit([sentence(4, marker=2)])
        await asyncio.gather(first.future, second.future)
        return time.monotonic() - started

    elapsed = run(scenario, runner, max_queue_delay_ms=150)
    assert [b[0] for b in runner.batches] == [[1, 2]]
    assert elapsed >= 0.14


def test_cancelled_and_expired_requests_never_reach_the_model():
    """A cancelled request leaves the queue (every bucket of it) before the next batch is cut; one whose deadline
    passes after its batch was cut ahead leaves that batch's rows when the batch's turn comes."""
    runner = Runner()

    async def scenario(batcher: Batcher):
        runner.gate.clear()
        batcher.submit([sentence(4, marker=1)])
        await until(lambda: batcher._in_flight == 1)
        cancelled = batcher.submit([sentence(4, marker=2), sentence(40, marker=2)])
        expired = batcher.submit([sentence(4, marker=3)], timeout=0.01)
        kept = batcher.submit([sentence(4, marker=4)])
        cancelled.future.cancel()
        await asyncio.sleep(0)  # the next batch is cut ahead: the expired and the kept request, nothing left queued
        assert batcher._in_flight == 2 and batcher._queue.jobs == 0 and batcher._queue.rows == 0
        await asyncio.sleep(0.05)
        runner.gate.set()
        with pytest.raises(DeadlineExceeded):
            await expired.future
        return await kept.future

    assert run(scenario, runner) == [40]
    assert [b[0] for b in runner.batches] == [[1], [4]]


def test_a_full_queue_refuses_at_once_and_a_closed_batcher_refuses_everything():
    runner = Runner()

    async def scenario(batcher: Batcher):
        runner.gate.clear()
        running = batcher.submit([sentence(4, marker=1)])
        await until(lambda: batcher._in_flight == 1)
        queued = [batcher.submit([sentence(4, marker=2)]) for _ in range(2)]
        with pytest.raises(QueueFull, match="queue is full"):
            batcher.submit([sentence(4, marker=3)])
        runner.gate.set()
        await asyncio.gather(running.future, *(j.future for j in queued))
        await batcher.close()
        with pytest.raises(Unavailable):
            batcher.submit([sentence(4)])

    run(scenario, runner, max_queue=2)


def test_a_backend_error_fails_only_the_requests_of_its_batch():
    runner = Runner()
    runner.fail_marker = 2

    async def scenario(batcher: Batcher):
        runner.gate.clear()
        blocker = batcher.submit([sentence(4, marker=1)])
        await until(lambda: batcher._in_flight == 1)
        doomed = [batcher.submit([sentence(4, marker=m)]) for m in (2, 5)]  # one batch of bucket 16
        survivor = batcher.submit([sentence(20, marker=6)])  # bucket 32: the next batch
        runner.gate.set()
        for job in doomed:
            with pytest.raises(BackendFailure, match="RuntimeError"):
                await job.future
        return await blocker.future, await survivor.future

    assert run(scenario, runner) == ([10], [60])


def test_close_finishes_queued_requests_before_stopping():
    runner = Runner()

    async def scenario(batcher: Batcher):
        runner.gate.clear()
        jobs = [batcher.submit([sentence(4 + i, marker=i + 1)]) for i in range(3)]
        closing = asyncio.ensure_future(batcher.close(timeout=5))
        await asyncio.sleep(0.02)
        runner.gate.set()
        await closing
        return [j.future.result() for j in jobs]

    assert run(scenario, runner) == [[10], [20], [30]]


def test_two_engine_instances_run_two_batches_side_by_side():
    """With a second instance, a request arriving while the first instance is held runs at once on the second,
    instead of waiting; each instance runs on its own worker thread."""
    from bertzoo.serving.workers import model_worker

    first, second = Runner(), Runner()
    threads: dict[str, set[str]] = {"first": set(), "second": set()}

    def on(runner: Runner, name: str):
        def call(works, inputs):
            threads[name].add(threading.current_thread().name)
            return runner(works, inputs)
        return call

    async def main():
        batcher = Batcher(on(first, "first"), bucket_for, pad_id=0, settings=BatchSettings(), metrics=Metrics(),
                          more_instances=[(on(second, "second"), model_worker("main", 1))])
        batcher.start()
        try:
            first.gate.clear()
            held = batcher.submit([sentence(5, marker=1)])
            await until(lambda: batcher._in_flight == 1)
            quick = batcher.submit([sentence(5, marker=2)])
            assert await asyncio.wait_for(quick.future, 5) == [20]  # while the first instance is still held
            assert not held.future.done()
            first.gate.set()
            assert await held.future == [10]
        finally:
            first.gate.set()
            await batcher.close(timeout=5)

    asyncio.run(main())
    assert [b[0] for b in first.batches] == [[1]] and [b[0] for b in second.batches] == [[2]]
    assert threads["first"].isdisjoint(threads["second"])


def test_a_request_cancelled_in_the_turn_its_batch_is_cut_never_runs():
    """A local request's future is cancelled; the done-callback that tells the batcher runs only a loop turn later.
    A batch cut in between (here: at once, the bucket full) must still leave it out."""
    runner = Runner()

    async def scenario(batcher: Batcher):
        kept, dropped = batcher.submit([sentence(5, marker=1)]), batcher.submit([sentence(5, marker=2)])
        dropped.future.cancel()  # its callback is only scheduled
        kept_too = batcher.submit([sentence(5, marker=3)])  # fills the bucket: the batch is cut now, in this turn
        return await asyncio.wait_for(asyncio.gather(kept.future, kept_too.future), 5)

    assert run(scenario, runner, max_batch_size=2, max_queue_delay_ms=1000) == [[10], [30]]
    assert [markers for markers, _ in runner.batches] == [[1, 3]]
