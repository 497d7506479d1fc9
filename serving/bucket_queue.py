"""The batcher's waiting items: one first-in-first-out queue per bucket, and the counts the batcher decides by.

Pure bookkeeping, no event loop and no threads: :class:`~bertzoo.serving.batcher.Batcher` calls it from its event
loop only. An item is a job's works (:class:`~bertzoo.serving.engine.Work`) whose longest sequence falls in one
bucket, queued together under that bucket: a request of 32 sentences is an item or a few, not 32, and so is a hop's
requests made one job (:class:`~bertzoo.serving.hop_job.HopJob`), so what the queue does per item it does per request
or per hop. A batch is cut from one bucket, oldest items first (:meth:`BucketQueue.take`), and where an item's works
would overflow the batch it takes those that fit and leaves the rest queued (a work itself, the sequences that share
one encoder pass, is never split). ``jobs`` counts requests (what ``max_queue`` bounds): a hop's job counts its
requests still waiting, and the works of one of them that ended (cancelled, expired) leave the queue when the next
batch is cut from their bucket.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence

from .job import Job

FIRST_WORK, ONE_ROW = (0,), (1,)  # a one-work item's indices, and a one-row work's row counts


class QueuedItem:
    __slots__ = ("job", "indices", "row_counts", "bucket", "order", "enqueued", "rows")

    def __init__(self, job: Job, indices: Sequence[int], row_counts: Sequence[int], bucket: int, order: int,
                 enqueued: float, rows: int) -> None:
        self.job = job
        self.indices = indices  # positions in job.works, in order
        self.row_counts = row_counts  # each of those works' sequences
        self.bucket = bucket
        self.order = order  # arrival order: the oldest item picks the next batch's bucket
        self.enqueued = enqueued  # event-loop time, for the queue delay
        self.rows = rows  # sum(row_counts)

    def split(self, rows: int) -> QueuedItem:
        """The first of this item's works that together have at most ``rows`` sequences (at least one work), taken
        out of it as an item of their own; this item keeps the rest."""
        counts, taken, k = self.row_counts, 0, 0
        while k < len(counts) and (k == 0 or taken + counts[k] <= rows):
            taken += counts[k]
            k += 1
        head = QueuedItem(self.job, self.indices[:k], counts[:k], self.bucket, self.order, self.enqueued, taken)
        self.indices, self.row_counts, self.rows = self.indices[k:], counts[k:], self.rows - taken
        return head


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
        """Queue ``job``'s works, one item per bucket they fall in, at event-loop time ``now``."""
        works = job.works
        if len(works) == 1:  # most requests a GPU server sees: no grouping to do
            work = works[0]
            rows = len(work.rows)
            self._append(job, FIRST_WORK, ONE_ROW if rows == 1 else (rows,), self._bucket_for(work.longest), rows, now)
            job.queued = 1
        elif not works:
            raise ValueError("a request needs at least one item")
        else:
            by_bucket: dict[int, tuple[list[int], list[int]]] = {}
            bucket_for = self._bucket_for
            for index, work in enumerate(works):
                bucket = bucket_for(work.longest)
                group = by_bucket.get(bucket)
                if group is None:
                    group = by_bucket[bucket] = ([], [])
                group[0].append(index)
                group[1].append(len(work.rows))
            for bucket, (indices, row_counts) in by_bucket.items():
                self._append(job, indices, row_counts, bucket, sum(row_counts), now)
            job.queued = len(by_bucket)
        self.jobs += job.weight

    def _append(self, job: Job, indices: Sequence[int], row_counts: Sequence[int], bucket: int, rows: int,
                now: float) -> None:
        queue = self._queues.get(bucket)
        if queue is None:
            queue = self._queues[bucket] = deque()
        queue.append(QueuedItem(job, indices, row_counts, bucket, next(self._arrivals), now, rows))
        self._bucket_rows[bucket] = self._bucket_rows.get(bucket, 0) + rows
        self.rows += rows
        job.buckets.add(bucket)

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
            self.jobs -= item.job.weight

    def dropped(self, job: Job, requests: int) -> None:
        """``requests`` of a hop's job ended (cancelled, expired) with its works maybe still queued: they no longer
        count as waiting (its works leave the queue when a batch is cut: :meth:`take` asks the job which count)."""
        if job.queued:
            job.weight -= requests
            self.jobs -= requests

    def _prune(self, item: QueuedItem, now: float) -> bool:
        """Drop the works of a hop's requests that ended from ``item``; whether any of it is left."""
        job = item.job
        keep, expired = job.prune(item.indices, now)  # fails the requests whose deadline passed, as a job does
        if expired:
            self.dropped(job, expired)
        if keep is None:
            return True
        indices = [i for i, kept in zip(item.indices, keep, strict=True) if kept]
        counts = [c for c, kept in zip(item.row_counts, keep, strict=True) if kept]
        rows = sum(counts)
        self._bucket_rows[item.bucket] -= item.rows - rows
        self.rows -= item.rows - rows
        item.indices, item.row_counts, item.rows = indices, counts, rows
        return bool(indices)

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
        ``max_tokens`` padded tokens; of an item that would overflow it, the works that fit (a first work larger than
        that is taken alone). On the way, a job nobody waits for any more leaves the queue, cancelled, and one past
        its deadline leaves it too and is returned (the caller fails it): neither reaches the model."""
        queue = self._queues[bucket]
        taken: list[QueuedItem] = []
        expired: list[Job] = []
        rows = 0
        limit = min(max_rows, max_tokens // bucket)  # sequences of this bucket a batch holds
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
            if job.parts and not self._prune(item, now):  # every request of it in this item ended
                queue.popleft()
                self._unqueue(item)
                continue
            if rows + item.rows <= limit or (not taken and len(item.indices) == 1):
                queue.popleft()
                self._unqueue(item)
                taken.append(item)
                rows += item.rows
                continue
            if taken and rows + item.row_counts[0] > limit:
                break
            head = item.split(limit - rows)  # the works that fit; the rest wait for the next batch
            self._bucket_rows[bucket] -= head.rows
            self.rows -= head.rows
            taken.append(head)
            break
        return taken, expired
