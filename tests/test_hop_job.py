"""A hop's requests as one job (serving/hop_job.py) in a real batcher with a scripted runner: they share a batch,
each request is answered, cancelled or expired on its own, and the queue counts requests, not hops."""

from __future__ import annotations

import asyncio

from test_serving_batcher import Runner, run, sentence, until

from bertzoo.serving.batcher import Batcher
from bertzoo.serving.errors import BackendFailure, DeadlineExceeded
from bertzoo.serving.hop_job import HopJob


class Owner:
    """Records what a hop's job tells its owner, as the engine process would answer its front end."""

    def __init__(self) -> None:
        self.answers: list[tuple[list[int], list]] = []
        self.failures: list[tuple[list[int], type]] = []
        self.settles: list[HopJob] = []

    def answered(self, job, positions, outputs, started, ended) -> None:
        assert len(positions) == len(outputs) and started <= ended
        self.answers.append((list(positions), list(outputs)))

    def failed(self, job, positions, error) -> None:
        self.failures.append((list(positions), type(error)))

    def settled(self, job) -> None:
        self.settles.append(job)


def hop(owner: Owner, works, deadlines=None) -> HopJob:
    deadlines = [float("inf")] * len(works) if deadlines is None else deadlines
    return HopJob(list(range(100, 100 + len(works))), works, deadlines, owner)


async def hold(batcher: Batcher, runner: Runner) -> list:
    """Two one-sentence requests that keep the one instance busy and its next batch staged: what comes next waits
    in the queue until the runner's gate opens."""
    runner.gate.clear()
    running = batcher.submit([sentence(4, marker=8)])
    await until(lambda: batcher._in_flight == 1)
    staged = batcher.submit([sentence(4, marker=9)])
    await until(lambda: batcher._in_flight == 2)
    return [running.future, staged.future]


def test_a_hops_requests_share_one_batch_and_count_one_by_one_in_the_queue():
    runner, owner = Runner(), Owner()

    async def scenario(batcher: Batcher):
        held = await hold(batcher, runner)
        job = hop(owner, [sentence(4, marker=m) for m in (1, 2, 3)])
        batcher.add(job)
        assert batcher.waiting == 3 and batcher.room == 1
        runner.gate.set()
        await asyncio.gather(*held)
        await until(lambda: owner.settles)
        assert runner.batches[-1] == ([1, 2, 3], (3, 8))
        assert owner.answers == [([0, 1, 2], [10, 20, 30])] and owner.settles == [job] and job.error is None
        assert batcher.waiting == 0 and not owner.failures

    run(scenario, runner, max_queue=4)


def test_a_cancelled_or_expired_request_leaves_alone_and_its_work_never_runs():
    runner, owner = Runner(), Owner()

    async def scenario(batcher: Batcher):
        held = await hold(batcher, runner)
        soon, never = asyncio.get_running_loop().time() + 0.05, float("inf")
        job = hop(owner, [sentence(4, marker=m) for m in (1, 2, 3, 4)], deadlines=[never, never, soon, never])
        batcher.add(job)
        batcher.cancel_request(job, 1)
        batcher.cancel_request(job, 1)  # twice: counted once
        assert batcher.waiting == 3
        await asyncio.sleep(0.1)  # the third request's deadline passes while it waits
        runner.gate.set()
        await asyncio.gather(*held)
        await until(lambda: owner.settles)
        assert runner.batches[-1] == ([1, 4], (2, 8))
        assert owner.answers == [([0, 3], [10, 40])]
        assert owner.failures == [([2], DeadlineExceeded)]
        assert batcher.waiting == 0

    run(scenario, runner)


def test_a_hop_cancelled_whole_runs_nothing_and_is_not_told():
    runner, owner = Runner(), Owner()

    async def scenario(batcher: Batcher):
        held = await hold(batcher, runner)
        job = hop(owner, [sentence(4, marker=m) for m in (1, 2)])
        batcher.add(job)
        batcher.cancel_request(job, 0)
        batcher.cancel_request(job, 1)
        assert job.done and batcher.waiting == 0
        runner.gate.set()
        await asyncio.gather(*held)
        await asyncio.sleep(0.05)
        assert [markers for markers, _ in runner.batches] == [[8], [9]]
        assert not owner.answers and not owner.failures and not owner.settles

    run(scenario, runner)


def test_a_backend_error_fails_every_request_of_the_hop_still_waiting():
    runner, owner = Runner(), Owner()
    runner.fail_marker = 2

    async def scenario(batcher: Batcher):
        job = hop(owner, [sentence(4, marker=m) for m in (1, 2)])
        batcher.add(job)
        batcher.start_batches()
        await until(lambda: owner.settles)
        assert isinstance(job.error, BackendFailure) and job.live_positions().tolist() == [0, 1]
        assert not owner.answers

    run(scenario, runner)
