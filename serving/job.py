"""A request's items on their way through a batcher, and how their end is told.

A job settles once: with one output per item, or with an error (its deadline passed, the model failed, the server
shut down), or it is cancelled (nobody waits for it any more). The batcher calls the job's ``on_settled`` the moment
it settles, on the event loop; a cancelled job is never told.

Two owners, two ways of waiting: a one-process server's RPC awaits an asyncio future (:func:`awaitable_job`);
the engine process answers its front ends from ``on_settled`` itself, so a hop's requests cost it no future, no
done-callback and no event-loop turn each.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from .engine import Work

Settled = Callable[["Job"], None]


class Job:
    """One request's works. The batcher and its queue also take a :class:`~bertzoo.serving.hop_job.HopJob` (a hop's
    requests as one job) through the same attributes and methods; ``weight`` and ``parts`` say which is which."""

    weight = 1  # requests it counts for in the queue (what ``max_queue`` bounds)
    parts = False  # whether its requests end one by one (a HopJob: the queue asks it which works still count)

    __slots__ = ("works", "deadline", "on_settled", "submitted", "first_start", "last_end", "outputs", "error",
                 "done", "cancelled", "remaining", "queued", "buckets", "future", "tag")

    def __init__(self, works: Sequence[Work], deadline: float | None, on_settled: Settled, tag: object = None) -> None:
        self.works = works
        self.deadline = deadline  # event-loop time
        self.on_settled = on_settled
        self.tag = tag  # the owner's handle on the job (the engine process: its front end and job id)
        self.submitted = 0.0  # time.perf_counter() when queued, for local requests' queue time
        self.first_start: float | None = None  # when the first batch carrying this job started on the worker
        self.last_end: float | None = None
        self.outputs: list = [None] * len(works)
        self.error: BaseException | None = None
        self.done = False  # settled or cancelled: read by the worker threads too, to skip a batch nobody waits for
        self.cancelled = False
        self.remaining = len(works)  # items without an output yet
        self.queued = 0  # its items still in the queue (BucketQueue.add counts them)
        self.buckets: set[int] = set()
        self.future: asyncio.Future | None = None

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def abandoned(self) -> bool:
        """Nobody waits for it: it ended, or its future was cancelled (a local RPC that ended), whose done-callback
        telling the batcher may not have run yet."""
        return self.done or (self.future is not None and self.future.done())

    def deliver(self, indices: Sequence[int], outputs: Sequence, rows: list, first: int, started: float,
                ended: float) -> bool:
        """The outputs of the works at ``indices``: ``rows[first:first + len(indices)]`` of a batch that ran from
        ``started`` to ``ended`` (perf_counter; ``outputs``: the same as the runner gave them, maybe one array);
        whether the job now has every output (the batcher settles it then)."""
        self.first_start = started if self.first_start is None else min(self.first_start, started)
        self.last_end = ended if self.last_end is None else max(self.last_end, ended)
        if self.done:  # cancelled or failed while its batch ran: the outputs are dropped
            return False
        if len(indices) == 1:
            self.outputs[indices[0]] = rows[first]
        else:
            for k, index in enumerate(indices, first):
                self.outputs[index] = rows[k]
        self.remaining -= len(indices)
        return self.remaining == 0


def _settle_future(job: Job) -> None:
    assert job.future is not None
    if job.future.done():
        return
    if job.error is None:
        job.future.set_result(job.outputs)
    else:
        job.future.set_exception(job.error)


def awaitable_job(works: Sequence[Work], deadline: float | None, loop: asyncio.AbstractEventLoop,
                  cancel: Callable[[Job], None]) -> Job:
    """A job whose ``future`` resolves to its outputs (or raises its error); cancelling the future cancels the job
    (``cancel``: the batcher's, which takes its waiting items out of the queue)."""
    job = Job(works, deadline, _settle_future)
    job.submitted = time.perf_counter()
    job.future = loop.create_future()
    job.future.add_done_callback(lambda f: cancel(job) if f.cancelled() else None)
    return job
