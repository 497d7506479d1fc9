"""The engine process of a server with front ends (``--frontends`` N > 1): the model, its batchers and engine
instances (the same :func:`~bertzoo.serving.lanes.open_local_lanes` a one-process server runs), serving the front
ends' hops over one ZeroMQ ROUTER socket.

A front end's hello is answered once the model is loaded and warmed up (with the model's facts and tokenizer, so front
ends load nothing themselves). A hop's requests are added to their lanes together, then their batches start, so they
share one: a hop's one-work requests for a lane as one :class:`~bertzoo.serving.hop_job.HopJob`, whose batches answer
the requests they ran in one record each; a hop's only request, and any request of several works, as a
:class:`~bertzoo.serving.job.Job` of its own. Every answer joins the hop going back to its front end at the end of
that event-loop turn (no future or callback per request). Only the parent stops this process, by closing its control
pipe after every front end has finished its calls: SIGINT and SIGTERM (a terminal's Ctrl-C, or an init system
signalling the whole group) are ignored here, so the front ends' accepted calls never lose their engine.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import logging
import signal
import sys
from collections import defaultdict
from collections.abc import Sequence
from multiprocessing.connection import Connection

import zmq

from bertzoo.errors import UserError

from . import engine_protocol as protocol
from .batcher import Batcher
from .child_process import child_process_setup
from .config import ServeConfig
from .engine_protocol import HopSocket
from .errors import BackendFailure, QueueFull, ServingError
from .event_loop import run_on_best_loop
from .hop_job import HopJob
from .job import Job
from .lanes import Lanes, open_local_lanes
from .metrics import Metrics
from .model import load_served_model

log = logging.getLogger("bertzoo.serving")

_NO_DEADLINE = float("inf")


class EngineHost:
    """Serves one process's lanes to the front ends connected to ``socket`` (a bound ROUTER)."""

    def __init__(self, socket: zmq.Socket, max_queue: int) -> None:
        self._socket = HopSocket(socket, self._handle)
        self._max_queue = max_queue
        # Whether each lane's queue is full, as each front end was last told: a change reaches every front end in the
        # next hop, answers or not, so each refuses at its door, without a round trip, while the queue is full.
        self._told_full: dict[bytes, tuple[bool, bool]] = {}
        self._lanes: Lanes | None = None
        self._main: Batcher | None = None  # the lanes' batchers (open_local_lanes'), to add jobs to
        self._long: Batcher | None = None
        self._ready_message: list[bytes] | None = None
        self._waiting_hellos: list[bytes] = []
        self._jobs: dict[tuple[bytes, int], tuple[Job, Batcher]] = {}  # one-request hops, by (front end, job id)
        self._hops: dict[bytes, set[HopJob]] = defaultdict(set)  # by front end: the hops not answered in full
        self._outbox: dict[bytes, list[protocol.Outcome]] = defaultdict(list)  # a request each: a Job's end, a failure
        self._answered: dict[bytes, list[protocol.Answered]] = defaultdict(list)  # a hop's job's answers
        self._flush_scheduled = False
        # Kept from start(): on Python 3.11 each asyncio.get_running_loop() is a getpid system call, and with one
        # request a hop (a GPU server's many front ends) these would run once per request.
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._socket.start()

    def stop(self) -> None:
        self._socket.stop()

    def ready(self, lanes: Lanes) -> None:
        """The model is loaded: answer every hello so far, and from now on each at once."""
        assert isinstance(lanes.main, Batcher) and isinstance(lanes.long, Batcher)
        self._lanes, self._main, self._long = lanes, lanes.main, lanes.long
        self._ready_message = protocol.ready_message(lanes.spec, lanes.tokenizer.to_str())
        hellos, self._waiting_hellos = self._waiting_hellos, []
        for peer in hellos:
            self._socket.send([peer, *self._ready_message])
        self._socket.drain()

    def _handle(self, frames: list[bytes]) -> None:
        peer, kind = frames[0], protocol.kind_of(frames[1]) if len(frames) > 1 else None
        try:
            if kind is protocol.Kind.HELLO:
                self._told_full[peer] = (False, False)  # a front end starts from empty queues
                self._schedule_flush()
                if self._ready_message is None:
                    self._waiting_hellos.append(peer)
                else:
                    self._socket.send([peer, *self._ready_message])
            elif kind is protocol.Kind.JOBS and self._lanes is not None:
                self._take(peer, frames[1:])
            elif kind is None:
                log.error("the engine got a message of no known kind from a front end; ignored")
        except Exception:  # one unreadable hop must not stop the engine serving the others
            log.exception("the engine could not handle a %s message from a front end", kind and kind.name)

    def _take(self, peer: bytes, frames: list[bytes]) -> None:
        assert self._main is not None and self._long is not None and self._loop is not None
        requests, cancelled = protocol.read_jobs(frames)
        if len(requests) == 1 and not cancelled:  # a GPU server's many front ends under light load: the short way
            lane = self._long if requests[0][0].lane == "long" else self._main
            self._queue(peer, lane, requests)
            lane.start_batches()
            self._schedule_flush()
            return
        dropped = set(cancelled)
        by_lane: dict[Batcher, list] = {}
        for request in requests:
            if request[0].job_id not in dropped:  # cancelled before the hop left: never queued, so never run
                by_lane.setdefault(self._long if request[0].lane == "long" else self._main, []).append(request)
        for lane, lane_requests in by_lane.items():
            self._queue(peer, lane, lane_requests)
        for job_id in cancelled:
            self._cancel(peer, job_id)
        for lane in by_lane:
            lane.start_batches()
        self._schedule_flush()  # the queues' depths may have crossed the limit: every front end is told

    def _queue(self, peer: bytes, lane: Batcher, requests: list) -> None:
        """A hop's requests for ``lane``, as many as its queue has room for (the rest refused): those of one work each
        (a sentence: most of a GPU server's) as one HopJob, any other as a Job of its own (its works are already one
        item per bucket), and a hop's only request as a Job too (a HopJob's bookkeeping would cost it more than it
        saves)."""
        assert self._loop is not None
        try:
            lane.check_room()
        except ServingError as e:  # shutting down, or full
            self._refuse(peer, requests, e)
            return
        now = self._loop.time()
        if len(requests) == 1:
            self._queue_alone(peer, lane, requests[0], now)
            return
        room = lane.room
        if len(requests) > room:
            self._refuse(peer, requests[room:],
                         QueueFull(f"the server's queue is full ({self._max_queue} requests waiting); retry later"))
            requests = requests[:room]
        singles = [request for request in requests if len(request[1]) == 1]
        if len(singles) < 2:  # nothing to share
            singles = []
        for request in requests:
            if not singles or len(request[1]) != 1:
                self._queue_alone(peer, lane, request, now)
        if singles:
            deadlines = [_NO_DEADLINE if header.timeout is None else now + header.timeout for header, _ in singles]
            job = HopJob([header.job_id for header, _ in singles], [works[0] for _, works in singles], deadlines,
                         self, (peer, lane))
            lane.add(job)
            self._hops[peer].add(job)

    def _queue_alone(self, peer: bytes, lane: Batcher, request: tuple, now: float) -> None:
        header, works = request
        key = (peer, header.job_id)
        job = Job(works, None if header.timeout is None else now + header.timeout, self._settled, key)
        lane.add(job)
        self._jobs[key] = (job, lane)

    def _settled(self, job: Job) -> None:
        """A request's own job ended: its answer joins the next hop back."""
        peer, job_id = job.tag
        self._jobs.pop(job.tag, None)
        if job.error is None:
            outcome = protocol.Outcome(job_id, protocol.packed_outputs(job.outputs), job.first_start or 0.0,
                                       job.last_end or 0.0)
        else:
            outcome = protocol.Outcome(job_id, failure=_failure(job.error))
        self._answer(peer, outcome)

    def _refuse(self, peer: bytes, requests: list, error: ServingError) -> None:
        failure = protocol.Failure.of(error)
        for header, _ in requests:
            self._answer(peer, protocol.Outcome(header.job_id, failure=failure))

    def _cancel(self, peer: bytes, job_id: int) -> None:
        """A request its front end no longer waits for (a hop's job is searched for: cancellations are rare)."""
        if (entry := self._jobs.pop((peer, job_id), None)) is not None:
            entry[1].cancel(entry[0])  # its waiting items leave the queue
            return
        for job in self._hops.get(peer, ()):
            position = bisect.bisect_left(job.job_ids, job_id)
            if position < len(job.job_ids) and job.job_ids[position] == job_id:
                job.tag[1].cancel_request(job, position)  # its waiting works leave the queue unrun
                if job.done:
                    self._hops[peer].discard(job)
                return

    # ------------------------------------------------------------------ HopOwner: the batcher's word on a hop

    def answered(self, job: HopJob, positions: Sequence[int], outputs: Sequence, started: float,
                 ended: float) -> None:
        ids = job.job_ids
        self._answered[job.tag[0]].append(protocol.Answered(
            [ids[p] for p in positions], protocol.answered_outputs(outputs), started, ended))
        self._schedule_flush()

    def failed(self, job: HopJob, positions: Sequence[int], error: Exception) -> None:
        peer, failure = job.tag[0], _failure(error)
        for position in positions:
            self._answer(peer, protocol.Outcome(job.job_ids[position], failure=failure))
        if job.open == 0:
            self._hops[peer].discard(job)

    def settled(self, job: HopJob) -> None:
        if job.error is not None:
            self.failed(job, job.live_positions().tolist(), job.error)
        self._hops[job.tag[0]].discard(job)

    def _answer(self, peer: bytes, outcome: protocol.Outcome) -> None:
        self._outbox[peer].append(outcome)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """One hop per front end with everything finished in this event-loop turn, and one (of depths alone) to each
        other front end whose view of which queues are full is no longer true."""
        self._flush_scheduled = False
        if self._lanes is None:
            return
        waiting = {"main": self._lanes.main.waiting, "long": self._lanes.long.waiting}
        full = (waiting["main"] >= self._max_queue, waiting["long"] >= self._max_queue)
        outbox, self._outbox = self._outbox, defaultdict(list)
        answers, self._answered = self._answered, defaultdict(list)
        for peer, told in self._told_full.items():
            if peer in outbox or peer in answers or told != full:
                self._socket.send([peer, *protocol.results_message(outbox.pop(peer, []), waiting,
                                                                   answers.pop(peer, []))], then_drain=False)
                self._told_full[peer] = full
        for peer in outbox.keys() | answers.keys():  # a front end that never said hello (none such; lose nothing)
            self._socket.send([peer, *protocol.results_message(outbox.pop(peer, []), waiting,
                                                               answers.pop(peer, []))], then_drain=False)
        self._socket.drain()  # after the sends, which can take the socket's readable edge (HopSocket)


def _failure(error: BaseException) -> protocol.Failure:
    """What crosses for a request that failed with ``error``: a serving error as it is, anything else (the backend's
    own) as BACKEND_FAILURE, naming only its type."""
    if not isinstance(error, ServingError):
        error = BackendFailure(f"the model failed on this request ({type(error).__name__})")
    return protocol.Failure.of(error)


async def run_engine(config: ServeConfig, address: str, control: Connection) -> None:
    """Bind ``address``, load the model, serve hops until ``control`` closes (the parent's word to stop), then close
    the lanes."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_reader(control.fileno(), stop.set)  # readable at EOF: the parent closed it, or died
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    # No high-water mark: a ROUTER drops what it cannot queue, and an answer must never be dropped (the lanes' queue
    # limits bound what is in flight).
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.bind(address)
    host = EngineHost(socket, config.batch.max_queue)
    host.start()
    lanes = None
    try:
        loading = asyncio.create_task(open_local_lanes(config, load_served_model, Metrics()))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():
            loading.cancel()
            return
        lanes = loading.result()
        gc.freeze()  # the model and everything loaded stay out of full collections, as in a one-process server
        host.ready(lanes)
        log.info("engine ready: %s on %s, %s", lanes.spec.backend, lanes.spec.device, lanes.spec.precision)
        await stopping
    finally:
        loop.remove_reader(control.fileno())
        host.stop()
        if lanes is not None:
            await lanes.close()
        socket.close(linger=0)
        context.term()
        log.info("engine stopped")


def engine_main(config: ServeConfig, address: str, control: Connection, log_levels: dict[str, int],
                name: str = "bertzoo-engine") -> None:
    """The engine process's entry point (multiprocessing, spawn); ``name``: its process name (a replica's own)."""
    child_process_setup(log_levels, name)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        run_on_best_loop(lambda: run_engine(config, address, control))
    except Exception as e:  # the parent sees the exit code and stops the server with it
        if isinstance(e, (UserError, OSError)):
            log.error("the engine failed to start: %s", e)
        else:
            log.exception("the engine failed")
        sys.exit(1)
