"""The batcher's waiting items: one first-in-first-out queue per bucket, and the counts the batcher decides by.

Pure bookkeeping, no event loop and no threads: :class:`~bertzoo.serving.batcher.Batcher` calls it from its event
loop only. An item is one :class:`~bertzoo.serving.engine.Work` of a job, queued under the bucket of its longest
sequence; a batch is cut from one bucket, oldest items first (:meth:`BucketQueue.take`).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

from .job import Job


class QueuedItem:
    __slots__ = ("job", "index", "bucket", "order", "enqueued", "rows")

    def __init__(self, job: Job, index: int, bucket: int, order: int, enqueued: float, rows: int) -> None:
        self.job = job
        self.index = index  # position in job.works
        self.bucket = bucket
        self.order = order  # arrival order: the oldest item picks the next batch's bucket
        self.enqueued = enqueued  # event-loop time, for the queue delay
        self.rows = rows


class BucketQueue:
    """Waiting items by bucket (``bucket_for``: a work's longest sequence -> its bucket), with the jobs and rows
    waiting: ``jobs`` counts requests with an item still queued (what ``max_queue`` bounds)."""

    def __init__(self, bucket_for: Callable[[int], int]) -> None:
        self._bucket_for = bucket_for
        self._queues: dict[int, deque[QueuedItem]] = {}
        self._bucket_rows: dict[int, int] = {}
        self._arrivals = itertools.count()
        self.jobs = 0
        self.rows = 0

    def add(self, job: Job, now: float) -> None:
        """Queue each of ``job``'s works as an item, at event-loop time ``now``."""
        if not job.works:
            raise ValueError("a request needs at least one item")
        queues, bucket_rows = self._queues, self._bucket_rows
        for index, work in enumerate(job.works):
            bucket = self._bucket_for(work.longest)
            rows = len(work.rows)
            queue = queues.get(bucket)
            if queue is None:
                queue = queues[bucket] = deque()
            queue.append(QueuedItem(job, index, bucket, next(self._arrivals), now, rows))
            bucket_rows[bucket] = bucket_rows.get(bucket, 0) + rows
            self.rows += rows
            job.buckets.add(bucket)
        self.jobs += 1

    def forget(self, job: Job) -> bool:
        """Take ``job``'s waiting items out; whether it had any."""
        if job.queued == 0:
            return False
        for bucket in job.buckets:
            queue = self._queues[bucket]
            kept = [item for item in queue if item.job is not job]
            for item in queue:
                if item.job is job:
                    self._unqueue(item)
            queue.clear()  # in place: take() may be iterating over this very deque
            queue.extend(kept)
        return True

    def _unqueue(self, item: QueuedItem) -> None:
        self._bucket_rows[item.bucket] -= item.rows
        self.rows -= item.rows
        item.job.queued -= 1
        if item.job.queued == 0:
            self.jobs -= 1

    def waiting_jobs(self) -> list[Job]:
        """Every job with an item waiting, each once, oldest first."""
        return list(dict.fromkeys(item.job for queue in self._queues.values() for item in queue))

    def oldest(self) -> QueuedItem:
        """The item that has waited longest (the queue must not be empty)."""
        return min((q[0] for q in self._queues.values() if q), key=lambda item: item.order)

    def is_full(self, bucket: int, max_rows: int, max_tokens: int) -> bool:
        """Whether ``bucket`` holds a whole batch: ``max_rows`` sequences, or ``max_tokens`` padded tokens."""
        rows = self._bucket_rows.get(bucket, 0)
        return rows >= max_rows or rows * bucket >= max_tokens

    def take(self, bucket: int, now: float, max_rows: int, max_tokens: int) -> tuple[list[QueuedItem], list[Job]]:
        """A batch from ``bucket``: its items, oldest first, while the batch stays within ``max_rows`` sequences and
        ``max_tokens`` padded tokens (an item is never split: a first item larger than that is taken alone). On the
        way, a job nobody waits for any more leaves the queue, cancelled, and one past its deadline leaves it too and
        is returned (the caller fails it): neither reaches the model."""
        queue = self._queues[bucket]
        taken: list[QueuedItem] = []
        expired: list[Job] = []
        rows = 0
        while queue:
            item = queue[0]
            job = item.job
            if job.abandoned():  # its future cancelled, the callback that tells the batcher not run yet
                job.done = job.cancelled = True
                self.forget(job)  # takes this item too
                continue
            if job.expired(now):
                expired.append(job)
                self.forget(job)
                continue
            if taken and (rows + item.rows > max_rows or (rows + item.rows) * bucket > max_tokens):
                break
            queue.popleft()
            self._unqueue(item)
            taken.append(item)
            rows += item.rows
        return taken, expired
