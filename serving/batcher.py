"""The dynamic batcher: one queue in front of the encoder, shared by every RPC and task.

A request becomes works (:class:`~bertzoo.serving.engine.Work`: a sentence, a pair, a QA item's windows), each
under the "bucket" of its longest sequence; a job's works of one bucket are queued together, as one item, and a
batch is cut from one bucket at a time. A job is a request (:class:`~bertzoo.serving.job.Job`), or in the engine
process a hop's requests (:class:`~bertzoo.serving.hop_job.HopJob`), which end one by one. The server's bucket is
the width a work will be padded to: with ``pad_to="longest"`` its length rounded up to 8, so no row of a batch
carries more than 7 padding tokens (padding is compute thrown away, and the export's coarse buckets 16 / 32 / 64
would pad short sentences far more); with ``pad_to="bucket"`` the length bucket.

- **Which bucket**: the one holding the oldest waiting item, so no request starves behind a busier bucket.
- **How much**: that bucket's items, oldest first, while the batch stays within ``max_batch_size`` sequences and
  ``max_batch_tokens`` padded tokens (rows x bucket width); of an item that would overflow it, the works that fit.
  A work is never split, so a QA item with more windows than a batch allows runs alone.
- **When**: at once when an engine instance is idle (of several, the one that finished last: its weights are warm;
  ``max_queue_delay_ms`` > 0 lets an idle model wait that long for a fuller batch). While every instance runs a
  batch, the next one is cut and padded ahead from what waits, and the first instance to finish takes it on its own
  worker thread, without waiting for the event loop: an instance that waited for the loop (busy taking in and
  answering requests) to cut its next batch would sit idle meanwhile. With one instance (a GPU's usual setting, where
  a batch costs about the same at 1 row or 32) that wait was as long as the batch itself, and cutting ahead beat
  collecting everything that came until the instance freed (benchmarks/journal/gpu.md, "The next batch cut ahead").

The model runs on worker threads, never on the event loop: one per engine instance (``--instances``; batches run
side by side, one per instance). A server has two batchers ("lanes", served by two
instances of the engine): the main one, and one for long requests (costing more than ``--long-request-tokens``,
e.g. a QA item whose context makes 40 windows), whose worker runs at the lowest CPU priority
(:func:`model_worker`), so a one-sentence request never waits behind a long one's compute: the operating
system hands the cores to the main lane whenever it has work and to the long lane the rest of the time. A long QA
request's windows are separate works (``engine.split_windows``), run a few per batch, so a cancelled request or one
past its deadline stops between batches. Cancelled requests (``cancel``, which an RPC's cancelled
future calls) leave the queue at once, and a request whose deadline has passed is dropped when its turn comes: neither
reaches the model. A request finds the queue full (``max_queue`` requests waiting) -> :class:`QueueFull` at once.
A backend error fails the requests in that batch only. The waiting items themselves are a
:class:`~bertzoo.serving.bucket_queue.BucketQueue`; this module decides when and where they run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .batch import Batch
from .bucket_queue import BucketQueue, QueuedItem
from .config import BatchSettings
from .engine import Work
from .errors import BackendFailure, DeadlineExceeded, QueueFull, Unavailable
from .hop_job import HopJob
from .job import Job, awaitable_job
from .metrics import Metrics
from .workers import model_worker

log = logging.getLogger("bertzoo.serving")

# Runs one batch on the worker thread: (works, padded inputs) -> one output per work (a list, or an array whose rows
# are the works' outputs).
BatchRunner = Callable[[Sequence[Work], dict], Sequence]
# An engine instance: its batch runner and the one-thread worker (model_worker) it runs on.
Instance = tuple[BatchRunner, ThreadPoolExecutor]
# A batch run: the items it ran, their outputs (as the runner gave them, and as a list), and when it started and ended
# (time.perf_counter()).
Computed = tuple[list[QueuedItem], Sequence, list, float, float]


class Batcher:
    def __init__(self, run: BatchRunner, bucket_for: Callable[[int], int], pad_id: int, settings: BatchSettings,
                 metrics: Metrics, lane: str = "main", executor: ThreadPoolExecutor | None = None,
                 more_instances: Sequence[Instance] = ()) -> None:
        """``lane`` ("main" or "long") labels the queue gauges; ``executor``: the one-thread worker to run batches on
        (default: a new :func:`model_worker`); ``more_instances``: further engine instances, each with its own worker,
        to run batches beside the first. The batcher shuts the workers down when it closes."""
        self._run = run
        self._more_instances = list(more_instances)
        self._idle_instances: list[Instance] = []  # instances not running a batch (event loop only)
        # Batches cut ahead while every instance was busy: a worker that finishes a batch takes the next one from
        # here itself, without a round trip through the event loop (deque appends and pops are atomic).
        self._staged: deque[Batch] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._instance_count = 1 + len(self._more_instances)
        self.lane = lane
        self._queue_depth = metrics.queue_depth.labels(lane)
        self._queue_sequences = metrics.queue_sequences.labels(lane)
        self._batch_seconds = metrics.batch_seconds.labels(lane)
        self._batch_size = metrics.batch_size.labels(lane)
        self._batch_tokens = metrics.batch_tokens.labels(lane)
        self._gauges_due = False
        metrics.queue_limit.labels(lane).set(settings.max_queue)
        self._pad_id = pad_id
        self._settings = settings
        self._queue = BucketQueue(bucket_for)
        self._in_flight = 0  # batches handed to the worker and not finished
        self._closing = False
        self._closed = False
        self._wake = asyncio.Event()  # the scheduler task's: a queue delay to time, or a shutdown waiting for idleness
        self._idle = asyncio.Event()
        self._dispatch_due = False  # a dispatch is scheduled for the end of this event-loop turn
        self._executor = executor
        self._scheduler: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start scheduling; call from the event loop the server runs on."""
        if self._executor is None:
            self._executor = model_worker(self.lane)
        self._idle_instances = [*reversed(self._more_instances), (self._run, self._executor)]  # taken from the end
        self._loop = asyncio.get_running_loop()
        self._scheduler = self._loop.create_task(self._schedule(), name="bertzoo-batcher")

    async def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, let queued and running ones finish (up to ``timeout`` seconds), then stop."""
        if self._closed:
            return
        self._closing = True
        self._wake.set()
        if self._scheduler is None:
            self._closed = True
            return
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("batcher (%s lane): %d requests still queued at shutdown; failing them", self.lane,
                        self._queue.jobs)
        for job in self._queue.waiting_jobs():
            self._settle(job, Unavailable("the server shut down", reason="shutdown"))
        while self._staged:
            self._fail(self._staged.popleft(), Unavailable("the server shut down", reason="shutdown"))
        self._scheduler.cancel()
        await asyncio.gather(self._scheduler, return_exceptions=True)
        for executor in [self._executor, *(e for _, e in self._more_instances)]:
            if executor is not None:
                executor.shutdown(wait=True)
        await asyncio.sleep(0)  # deliver what the workers finished while shutting down
        self._closed = True

    # ------------------------------------------------------------------ requests

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the batcher was started on (kept: on Python 3.11 each asyncio.get_running_loop() costs a
        getpid system call, several per request)."""
        if self._loop is None:
            raise RuntimeError("the batcher is not started; call start() from the event loop first")
        return self._loop

    @property
    def waiting(self) -> int:
        """Requests waiting in the queue (what ``max_queue`` bounds)."""
        return self._queue.jobs

    def check_room(self) -> None:
        """Raise what :meth:`submit` would raise now for lack of room: lets a caller refuse before tokenizing."""
        if self._closing:
            raise Unavailable("the server is shutting down", reason="shutdown")
        if self._queue.jobs >= self._settings.max_queue:
            raise QueueFull(f"the server's queue is full ({self._settings.max_queue} requests waiting); retry later")

    def submit(self, works: Sequence[Work], timeout: float | None = None) -> Job:
        """Queue a request's items; await ``job.future`` for their outputs. ``timeout``: seconds the client still
        waits (its deadline), after which the request is dropped instead of run."""
        self.check_room()
        loop = self._running_loop()
        job = awaitable_job(works, None if timeout is None else loop.time() + timeout, loop, self.cancel)
        self.add(job)
        self.start_batches()
        return job

    def add(self, job: Job | HopJob) -> None:
        """Queue ``job`` (the batcher calls its ``on_settled`` when it settles), without starting a batch yet: a
        request, or a hop's requests as one job (the engine process adds a hop so, then calls :meth:`start_batches`
        once, so they share a batch)."""
        self.check_room()
        self._queue.add(job, self._running_loop().time())
        self._changed()

    @property
    def room(self) -> int:
        """Requests the queue takes before it is full."""
        return max(0, self._settings.max_queue - self._queue.jobs)

    def start_batches(self) -> None:
        """An idle engine starts on what was added now, rather than at the end of the loop turn (which would cut the
        same batch, unless more came in that turn)."""
        if not self._in_flight and self._idle_instances and self._settings.max_queue_delay_ms <= 0:
            self._dispatch_ready()

    def cancel(self, job: Job) -> None:
        """Nobody waits for ``job`` any more: its waiting items leave the queue (its running ones finish unused)."""
        if not job.done:
            job.done = job.cancelled = True
            self._forget(job)

    def cancel_request(self, job: HopJob, position: int) -> None:
        """Nobody waits for one request of a hop's job: it no longer counts as waiting, and its waiting works leave
        the queue when the next batch is cut."""
        if not job.done and job.cancel(position):
            self._queue.dropped(job, 1)
            if job.open == 0:
                self.cancel(job)
            else:
                self._changed()

    def _settle(self, job: Job, error: BaseException | None = None) -> None:
        """``job`` ends: with its outputs, or with ``error`` (its waiting items leave the queue); its owner is told."""
        if job.done:
            return
        job.done = True
        if error is not None:
            job.error = error
            self._forget(job)
        job.on_settled(job)

    def _forget(self, job: Job) -> None:
        """Take a job's waiting items out of the queue."""
        if self._queue.forget(job):
            self._changed()

    def _changed(self) -> None:
        if not self._gauges_due:  # once per loop turn: a multiprocess gauge's set costs a getpid and a lock
            self._gauges_due = True
            self._running_loop().call_soon(self._set_gauges)
        if self._queue.rows or self._in_flight:
            self._idle.clear()  # close() must not see a stale "idle" from before this work arrived
        self._dispatch_soon()

    def _dispatch_soon(self) -> None:
        """Hand out what waits at the end of this event-loop turn, so that what else arrives in the turn shares the
        batch. A plain callback, not the scheduler task's turn (a task step, an event's future and a ``wait_for`` for
        every hop and every finished batch); the task only times a queue delay and watches a shutdown."""
        if self._closing or self._settings.max_queue_delay_ms > 0:
            self._wake.set()
        elif not self._queue.rows:
            if not self._in_flight:
                self._idle.set()
        elif not self._dispatch_due:
            self._dispatch_due = True
            self._running_loop().call_soon(self._dispatch_turn)

    def _dispatch_turn(self) -> None:
        self._dispatch_due = False
        self._dispatch_ready()
        if not self._queue.rows and not self._in_flight:
            self._idle.set()

    def _set_gauges(self) -> None:
        self._gauges_due = False
        self._queue_depth.set(self._queue.jobs)
        self._queue_sequences.set(self._queue.rows)

    # ------------------------------------------------------------------ scheduling (event loop)

    async def _schedule(self) -> None:
        while True:
            self._wake.clear()
            timeout = self._dispatch_ready()
            if self._queue.rows == 0 and self._in_flight == 0:
                self._idle.set()
            else:
                self._idle.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass  # the queue delay of the oldest item ran out

    def _dispatch_ready(self) -> float | None:
        """Hand the worker every batch it should get now; returns how long to sleep (None: until woken)."""
        loop = self._running_loop()
        # One batch per instance running, and one more cut and padded, waiting for the first instance to free.
        settings = self._settings
        while self._queue.rows and self._in_flight <= self._instance_count:
            oldest = self._queue.oldest()
            full = self._queue.is_full(oldest.bucket, settings.max_batch_size, settings.max_batch_tokens)
            delay = settings.max_queue_delay_ms / 1000.0
            if not self._in_flight and not full and delay > 0 and not self._closing:
                left = oldest.enqueued + delay - loop.time()
                if left > 0:
                    return left
            items = self._take(oldest.bucket, loop.time())
            if items:
                self._launch(items, oldest.bucket)
        return None

    def _take(self, bucket: int, now: float) -> list[QueuedItem]:
        settings = self._settings
        taken, expired = self._queue.take(bucket, now, settings.max_batch_size, settings.max_batch_tokens)
        for job in expired:
            self._settle(job, DeadlineExceeded("the deadline passed while the request was queued"))
        self._changed()
        return taken

    def _launch(self, items: list[QueuedItem], bucket: int) -> None:
        batch = Batch.cut(items, bucket, bucket if self._settings.pad_to == "bucket" else None, self._pad_id)
        self._in_flight += 1
        if self._idle_instances:
            # The instance that finished last: at low load the same one runs every batch, its weights still warm in
            # the caches, so a lone batch runs faster than when the instances alternate (benchmarks/RESULTS.md,
            # "Serving on CPU").
            instance = self._idle_instances.pop()
            instance[1].submit(self._work, instance, batch)
        else:  # every instance is busy: the first to finish takes it
            self._staged.append(batch)

    def _release(self, instance: Instance) -> None:
        """An instance's worker found nothing staged (event loop): give it a batch staged since, or mark it idle."""
        if self._staged:
            instance[1].submit(self._work, instance, self._staged.popleft())
        else:
            self._idle_instances.append(instance)
            self._dispatch_ready()  # at once, rather than at the end of the turn (_finished asked for that too)

    # ------------------------------------------------------------------ running (worker thread)

    def _work(self, instance: Instance, batch: Batch) -> None:
        """Run ``batch`` and then every staged batch on the instance's worker thread, handing each batch's outcome
        to the event loop; when nothing is staged, hand the instance back."""
        assert self._loop is not None
        run = instance[0]
        while True:
            try:
                outcome = self._compute(run, batch)
            except Exception as e:  # the backend failed: only this batch's requests fail
                outcome = e
            try:
                staged = self._staged.popleft()
            except IndexError:  # the last batch's outcome and the instance go back in one wake-up of the loop
                self._loop.call_soon_threadsafe(self._finished_last, batch, outcome, instance)
                return
            self._loop.call_soon_threadsafe(self._finished, batch, outcome)
            batch = staged

    def _compute(self, run: BatchRunner, batch: Batch) -> Computed | None:
        """Run the batch's live part (Batch.live_part: the event loop settles what left it); None when none is."""
        live = batch.live_part()
        if live is None:
            return None
        items, works, inputs = live
        started = time.perf_counter()
        outputs = run(works, inputs)
        if len(outputs) != len(works):
            raise RuntimeError(f"the batch runner gave {len(outputs)} outputs for {len(works)} works")
        ended = time.perf_counter()
        # One output per work as a list too, made here rather than on the event loop: a request's Job stores its
        # works' outputs one by one, where a hop's job takes a slice of the runner's array.
        rows = list(outputs) if isinstance(outputs, np.ndarray) else outputs
        # Observed here, on the worker, not on the event loop every request passes through (the metrics are
        # thread-safe; in a multiprocess server each observation is a lock and a write to a shared file).
        self._batch_seconds.observe(ended - started)
        self._batch_size.observe(inputs["input_ids"].shape[0])
        self._batch_tokens.observe(inputs["input_ids"].size)
        return items, outputs, rows, started, ended

    # ------------------------------------------------------------------ outcomes (event loop)

    def _expire(self, batch: Batch, now: float) -> None:
        """Fail the batch's requests whose deadline has passed (while it waited for the worker, or ran)."""
        for item in batch.items:
            if item.job.expired(now):
                self._settle(item.job, DeadlineExceeded("the deadline passed while the request was queued"))

    def _finished(self, batch: Batch, outcome: Computed | Exception | None) -> None:
        try:
            if isinstance(outcome, Exception):
                log.error("batch of %d sequences (bucket %d) failed", batch.rows, batch.bucket, exc_info=outcome)
                self._fail(batch, BackendFailure(f"the model failed on this request's batch ({type(outcome).__name__})"))
            else:
                if outcome is not None:
                    self._deliver(*outcome)
                if outcome is None or len(outcome[0]) < len(batch.items):  # some items were left out of the run
                    self._expire(batch, self._running_loop().time())
        finally:
            self._in_flight -= 1
            self._dispatch_soon()

    def _finished_last(self, batch: Batch, outcome: Computed | Exception | None, instance: Instance) -> None:
        self._finished(batch, outcome)
        self._release(instance)

    def _deliver(self, items: list[QueuedItem], outputs: Sequence, rows: list, started: float, ended: float) -> None:
        k = 0
        for item in items:
            first, k = k, k + len(item.indices)
            if item.job.deliver(item.indices, outputs, rows, first, started, ended):
                self._settle(item.job)

    def _fail(self, batch: Batch, error: Exception) -> None:
        for item in batch.items:
            self._settle(item.job, error)
