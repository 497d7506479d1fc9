"""The batcher's waiting items on their own: what a batch takes, and what leaves the queue on the way."""

from bertzoo.serving.bucket_queue import BucketQueue
from bertzoo.serving.engine import Work, padded_width
from bertzoo.serving.job import Job
from bertzoo.tokenization import Encoding


def job(*lengths: int, deadline: float | None = None) -> Job:
    rows = tuple(Encoding(list(range(n)), [0] * n) for n in lengths)
    return Job([Work("sentiment", (row,)) for row in rows], deadline, lambda _: None)


def test_a_batch_takes_the_oldest_items_of_one_bucket_within_its_limits():
    queue = BucketQueue(padded_width)
    first, second, other = job(5, 6), job(7), job(20)
    for j in (first, second, other):
        queue.add(j, now=0.0)
    assert (queue.jobs, queue.rows) == (3, 4)
    assert queue.oldest().job is first and queue.is_full(8, max_rows=3, max_tokens=10_000)
    taken, expired = queue.take(8, now=1.0, max_rows=2, max_tokens=10_000)
    assert [(i.job, list(i.indices)) for i in taken] == [(first, [0, 1])] and expired == []
    assert (queue.jobs, queue.rows) == (2, 2)  # `first` has nothing left waiting
    taken, _ = queue.take(8, now=1.0, max_rows=2, max_tokens=8)  # 8 tokens: one row of bucket 8
    assert [i.job for i in taken] == [second]
    assert queue.oldest().job is other and queue.waiting_jobs() == [other]


def test_cancelled_and_expired_jobs_leave_every_bucket_and_never_reach_a_batch():
    queue = BucketQueue(padded_width)
    late, gone, kept = job(3, 30, deadline=5.0), job(4), job(6, deadline=50.0)
    for j in (late, gone, kept):
        queue.add(j, now=0.0)
    gone.done = True  # nobody waits for it any more
    taken, expired = queue.take(8, now=10.0, max_rows=64, max_tokens=10_000)
    assert [i.job for i in taken] == [kept] and expired == [late]
    assert gone.cancelled and late.queued == 0  # its item in bucket 32 left too
    assert (queue.jobs, queue.rows) == (0, 0) and queue.waiting_jobs() == []
    assert not queue.forget(late)  # nothing of it waits


def test_a_requests_works_of_one_bucket_queue_as_one_item_and_a_full_batch_takes_those_that_fit():
    queue = BucketQueue(padded_width)
    many, pair_job, last = job(5, 20, 6, 7, 3), job(4), job(2)
    for j in (many, pair_job, last):
        queue.add(j, now=0.0)
    assert many.queued == 2 and (queue.jobs, queue.rows) == (3, 7)  # bucket 8: works 0, 2, 3, 4; bucket 24: work 1
    taken, _ = queue.take(8, now=1.0, max_rows=3, max_tokens=10_000)
    assert [(i.job, list(i.indices), i.rows) for i in taken] == [(many, [0, 2, 3], 3)]
    assert many.queued == 2 and (queue.jobs, queue.rows) == (3, 4)  # work 4 still waits, first in its bucket
    taken, _ = queue.take(8, now=1.0, max_rows=3, max_tokens=10_000)
    assert [(i.job, list(i.indices)) for i in taken] == [(many, [4]), (pair_job, [0]), (last, [0])]
    assert many.queued == 1 and (queue.jobs, queue.rows) == (1, 1)
    taken, _ = queue.take(24, now=1.0, max_rows=3, max_tokens=24)  # one row of bucket 24
    assert [(i.job, list(i.indices)) for i in taken] == [(many, [1])] and (queue.jobs, queue.rows) == (0, 0)


def test_a_work_larger_than_a_batch_is_taken_alone_and_a_split_item_leaves_with_its_job():
    queue = BucketQueue(padded_width)
    windows = Job([Work("qa", tuple(Encoding([1] * 8, [0] * 8) for _ in range(5)))], None, lambda _: None)
    sentences = job(8, 8, 8, 8)
    queue.add(windows, now=0.0)
    queue.add(sentences, now=0.0)
    taken, _ = queue.take(8, now=1.0, max_rows=2, max_tokens=10_000)
    assert [(i.job, i.rows) for i in taken] == [(windows, 5)]  # 5 windows share one pass: never split
    taken, _ = queue.take(8, now=1.0, max_rows=2, max_tokens=10_000)
    assert [(i.job, list(i.indices)) for i in taken] == [(sentences, [0, 1])]
    assert queue.forget(sentences) and (queue.jobs, queue.rows) == (0, 0) and queue.waiting_jobs() == []
