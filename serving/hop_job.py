"""A hop's one-work requests for one lane (one sentence each: what a GPU server sees most) as one job: what the engine
process queues, so that the batcher's cost is paid per hop and per batch, not per request.

The batcher and its queue see one job (one item per bucket its works fall in, one delivery per batch) whatever the
number of requests in it; the requests still end one by one. Request k is work k, so a batch answers every request
it ran, together (:meth:`HopJob.deliver` hands the owner their positions and the batch's outputs for them, maybe a
slice of one array). A request fails alone when its own deadline passes, and can be cancelled alone
(:meth:`HopJob.cancel`); its work then leaves the queue when the next batch is cut (:meth:`HopJob.prune`, asked by
the queue), so it never reaches the model. The per-request state is a byte per request and the deadlines, read with
one vectorized check where a deadline may have passed. A request of several works (a pair's, a request of many
sentences) stays a :class:`~bertzoo.serving.job.Job` of its own: its works already are one item per bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .engine import Work
from .errors import DeadlineExceeded


class HopOwner(Protocol):
    def answered(self, job: HopJob, positions: Sequence[int], outputs: Sequence, started: float,
                 ended: float) -> None:
        """Requests at ``positions`` are answered by a batch that ran from ``started`` to ``ended`` (perf_counter):
        ``outputs`` holds each one's output (a list, or an array whose rows they are)."""

    def failed(self, job: HopJob, positions: Sequence[int], error: Exception) -> None:
        """Requests at ``positions`` failed with ``error`` (a deadline passed)."""

    def settled(self, job: HopJob) -> None:
        """No request of ``job`` is waited for any more; ``job.error`` (if set) fails every one still live."""


_NO_DEADLINE = float("inf")


class HopJob:
    """Requests ``job_ids`` (one hop's, for one lane), request k's one work ``works[k]``; ``deadlines``: each
    request's (event-loop time; inf: none); ``tag``: the owner's handle (the engine process: the front end and
    lane)."""

    parts = True
    # What most hops never change, read from the class until they do (a hop's job is made per hop: fewer stores).
    done = cancelled = dirty = False  # dirty: a request ended unanswered, so its queued work must leave (prune)
    error: BaseException | None = None
    future = None
    queued = 0

    def __init__(self, job_ids: list[int], works: list[Work], deadlines: list[float], owner: HopOwner,
                 tag: object = None) -> None:
        if len(works) != len(job_ids):
            raise ValueError(f"a hop's job has one work a request: {len(works)} works for {len(job_ids)} requests")
        self.job_ids = job_ids
        self.works = works
        self.owner = owner
        self.on_settled = owner.settled
        self.tag = tag
        size = len(job_ids)
        self.weight = self.open = size  # requests waiting in the queue (BucketQueue.dropped), and live
        self.buckets: set[int] = set()
        # Not answered, failed or cancelled yet: a bytearray, whose items a hop's few positions set faster than a
        # numpy array's (``live``: a numpy view of it, for the vectorized checks).
        self._live = bytearray(b"\x01") * size
        self.deadlines = deadlines
        if size == 1:
            self._earliest = self._latest = deadlines[0]
        else:
            self._earliest, self._latest = min(deadlines), max(deadlines)  # of the live requests: bounds

    # ------------------------------------------------------------------ what the batcher asks every job

    def expired(self, now: float) -> bool:
        """Every live request's deadline has passed (the batcher then fails the job: what is left of it)."""
        return now >= self._latest

    def abandoned(self) -> bool:
        return self.done

    @property
    def live(self) -> np.ndarray:
        return np.frombuffer(self._live, dtype=bool)

    def live_positions(self) -> np.ndarray:
        return np.flatnonzero(self.live)

    def deliver(self, indices: Sequence[int], outputs: Sequence, rows: list, first: int, started: float,
                ended: float) -> bool:
        """A batch's outputs for the works at ``indices`` (``outputs[first:first + len(indices)]``, maybe a slice of
        one array; ``rows``: the same as a list): their requests are answered now. Whether no request is left to
        wait for."""
        if self.done:
            return False
        outputs = outputs[first:first + len(indices)]
        positions = indices
        if self.dirty:  # some ended while this batch ran: their outputs are dropped
            live = self._live
            keep = [bool(live[i]) for i in indices]
            positions = [i for i, k in zip(indices, keep, strict=True) if k]
            outputs = (outputs[np.array(keep)] if isinstance(outputs, np.ndarray) else
                       [o for o, k in zip(outputs, keep, strict=True) if k])
        if positions:
            self._end(positions)
            self.owner.answered(self, positions, outputs, started, ended)
        return self.open == 0

    # ------------------------------------------------------------------ requests ending one by one

    def prune(self, indices: Sequence[int], now: float) -> tuple[list[bool] | None, int]:
        """Which of the works at ``indices`` still belong to a live request (None: all of them), after failing the
        live requests whose deadline has passed; and how many that failed."""
        expired = 0
        if now >= self._earliest:
            expired = self._expire(now)
        if not self.dirty:
            return None, expired
        live = self._live
        keep = [bool(live[i]) for i in indices]
        return (None if all(keep) else keep), expired

    def _expire(self, now: float) -> int:
        deadlines = np.asarray(self.deadlines)
        positions = np.flatnonzero(self.live & (deadlines <= now))
        if positions.size:
            self._end(positions.tolist())
            self.dirty = True
            if self.open == 0:  # nothing left: its other items leave the queue as a cancelled job's do
                self.done = self.cancelled = True
            self.owner.failed(self, positions.tolist(),
                              DeadlineExceeded("the deadline passed while the request was queued"))
        left = deadlines[self.live]
        self._earliest = float(left.min()) if left.size else _NO_DEADLINE
        return int(positions.size)

    def cancel(self, position: int) -> bool:
        """Nobody waits for the request at ``position`` any more; whether it was still live."""
        if not self._live[position]:
            return False
        self._end([position])
        self.dirty = True
        return True

    def _end(self, positions: Sequence[int]) -> None:
        live = self._live
        for position in positions:
            live[position] = 0
        self.open -= len(positions)
        if self.open == 0:
            self._latest = _NO_DEADLINE  # nothing left to expire
