"""A front end's link to the engine process (``--frontends`` N > 1): the lanes its task service submits to, backed by
one ZeroMQ DEALER socket to the engine's ROUTER.

Requests submitted during one event-loop turn leave together as one hop (serving/engine_protocol.py); the engine
answers with hops of finished jobs. A call cancelled before its hop left never leaves; one cancelled later sends its
job's id, so its items leave the engine's queue unrun. The engine's queue depths come back with every answer, and a
hop of depths alone reaches every front end whenever a queue turns full or has room again, so a front end refuses a
request at once, before tokenizing it, while the engine's queue is full, with no round trip; the engine still refuses
what arrives while it is full. If the engine process goes away (its socket disconnects), every waiting request fails
UNAVAILABLE at once and ``on_engine_lost`` runs (the front end turns NOT_SERVING; the parent process stops the
server). With engine replicas (``--engines``) a front end holds one link to each, and :class:`SpreadLane` spreads its
requests over them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
from zmq.utils.monitor import parse_monitor_message

from bertzoo.tokenization import Tokenizer

from . import engine_protocol as protocol
from .config import ServeConfig
from .engine import Work
from .engine_protocol import HopSocket, JobHeader, Kind
from .errors import QueueFull, ServingError, Unavailable
from .lanes import Lanes

log = logging.getLogger("bertzoo.serving")


@dataclass(eq=False)
class RemoteJob:
    """A request's items in the engine process; as :class:`~bertzoo.serving.batcher.Job` to the task service."""

    future: asyncio.Future
    submitted: float = field(default_factory=time.perf_counter)
    first_start: float | None = None
    last_end: float | None = None


class RemoteLane:
    def __init__(self, link: EngineLink, name: str) -> None:
        self._link, self.name = link, name

    def check_room(self) -> None:
        self._link.check_room(self.name)

    def submit(self, works: list[Work], timeout: float | None = None) -> RemoteJob:
        return self._link.submit(self.name, works, timeout)

    @property
    def outstanding(self) -> int:
        """Requests this front end sent its engine that are not answered yet (both lanes)."""
        return self._link.outstanding


class SpreadLane:
    """The same lane of every engine replica, as one: each request goes to the replica with the fewest requests
    outstanding from this front end (the first of equals) among those with room in that lane's queue."""

    def __init__(self, lanes: list[RemoteLane]) -> None:
        self._lanes = lanes

    def _with_room(self) -> list[RemoteLane]:
        """The replicas' lanes with room; with none, what the last one refused with is raised."""
        roomy, error = [], None
        for lane in self._lanes:
            try:
                lane.check_room()
                roomy.append(lane)
            except ServingError as e:
                error = e
        if not roomy and error is not None:
            raise error
        return roomy

    def check_room(self) -> None:
        self._with_room()

    def submit(self, works: list[Work], timeout: float | None = None) -> RemoteJob:
        return min(self._with_room(), key=lambda lane: lane.outstanding).submit(works, timeout)


async def open_replicas(links: list[EngineLink]) -> Lanes:
    """Wait for every replica (each answers once loaded and warmed up); their lanes as one. Every replica serves the
    same model, whose facts and tokenizer the first one's READY gives."""
    opened = await asyncio.gather(*(link.open() for link in links))
    if len(opened) == 1:
        return opened[0]

    async def close() -> None:
        for lanes in opened:
            await lanes.close()

    return Lanes(opened[0].spec, opened[0].tokenizer, SpreadLane([lanes.main for lanes in opened]),
                 SpreadLane([lanes.long for lanes in opened]), close)


class EngineLink:
    def __init__(self, address: str, config: ServeConfig, on_engine_lost: Callable[[], object] = lambda: None) -> None:
        self._address = address
        self._max_queue = config.batch.max_queue
        self._on_engine_lost = on_engine_lost
        # Plain sockets read from the event loop's reader callbacks, as the engine's (engine_protocol.HopSocket).
        self._context = zmq.Context()
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)  # never block the loop on a send: the engine's queue limits apply
        socket.setsockopt(zmq.RCVHWM, 0)
        monitor = socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._socket = HopSocket(socket, self._handle)
        self._monitor = HopSocket(monitor, self._watch)
        self._connected = False
        socket.connect(address)
        self._ids = itertools.count()
        self._pending: dict[int, RemoteJob] = {}
        self._outbox: list[tuple[JobHeader, list[Work]]] = []
        self._cancelled: list[int] = []
        self._flush_scheduled = False
        self._waiting = {"main": 0, "long": 0}
        self._lost: str | None = None
        self._ready: asyncio.Future | None = None  # the engine's answer to the hello: READY's body, or why not

    async def open(self) -> Lanes:
        """Wait for the engine to be loaded and warmed up (it answers the hello only then); its lanes."""
        self._ready = asyncio.get_running_loop().create_future()
        self._monitor.start()
        self._socket.start()
        self._socket.send(protocol.hello_message())  # queued until the connection is up
        ready = await self._ready
        if isinstance(ready, str):
            raise RuntimeError(f"the engine process failed to start: {ready}")
        return Lanes(ready.spec, Tokenizer.from_str(ready.tokenizer_json), RemoteLane(self, "main"),
                     RemoteLane(self, "long"), self.close)

    # ------------------------------------------------------------------ requests

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def check_room(self, lane: str) -> None:
        if self._lost is not None:
            raise Unavailable(self._lost, reason="engine_lost")
        if self._waiting[lane] >= self._max_queue:  # as the engine last said: it tells every front end each change
            raise QueueFull(f"the server's queue is full ({self._max_queue} requests waiting); retry later")

    def submit(self, lane: str, works: list[Work], timeout: float | None) -> RemoteJob:
        if self._lost is not None:
            raise Unavailable(self._lost, reason="engine_lost")
        job_id = next(self._ids)
        job = RemoteJob(asyncio.get_running_loop().create_future())
        self._pending[job_id] = job
        self._outbox.append((JobHeader(job_id, lane, timeout, [(w.task, len(w.rows)) for w in works]), works))
        job.future.add_done_callback(lambda f: self._forget(job_id) if f.cancelled() else None)
        self._schedule_flush()
        return job

    def _forget(self, job_id: int) -> None:
        """A cancelled call that already left: tell the engine, so its items leave the queue unrun."""
        if self._pending.pop(job_id, None) is None or self._lost is not None:
            return  # answered, or never sent (see _flush)
        self._cancelled.append(job_id)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send everything this event-loop turn gathered as one hop."""
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, []
        # A call cancelled in the turn of its submit never leaves: its future's done callback (_forget) runs after
        # this flush, so the cancellation is read here, and forgetting it now makes that callback a no-op.
        jobs = []
        for header, works in outbox:
            job = self._pending.get(header.job_id)
            if job is None or job.future.cancelled():
                self._pending.pop(header.job_id, None)
            else:
                jobs.append((header, works))
        if self._lost is not None or not (jobs or self._cancelled):
            return
        frames = protocol.jobs_message(jobs, self._cancelled)
        self._cancelled = []
        self._socket.send(frames)

    # ------------------------------------------------------------------ answers

    def _handle(self, frames: list[bytes]) -> None:
        kind = protocol.kind_of(frames[0])
        if kind is Kind.READY and self._ready is not None and not self._ready.done():
            self._ready.set_result(protocol.read_ready(frames[0]))
        elif kind is Kind.RESULTS:
            self._take_results(protocol.read_results(frames[0]))

    def _take_results(self, results: protocol.Results) -> None:
        self._waiting = results.waiting
        for outcome in results.outcomes:
            if outcome.failure is not None:
                job = self._pending.pop(outcome.job_id, None)
                if job is not None and not job.future.done():
                    job.future.set_exception(outcome.failure.error())
            else:
                self._resolve(outcome.job_id, protocol.output_list(outcome.outputs), outcome.first_start,
                              outcome.last_end)
        for answered in results.answered:
            for job_id, output in zip(answered.job_ids, answered.outputs, strict=True):
                self._resolve(job_id, [output], answered.started, answered.ended)

    def _resolve(self, job_id: int, outputs: list, first_start: float, last_end: float) -> None:
        """A request's outputs are back: its call gets them (unless it ended meanwhile)."""
        job = self._pending.pop(job_id, None)
        if job is not None and not job.future.done():
            job.first_start, job.last_end = first_start, last_end
            job.future.set_result(outputs)

    def _watch(self, frames: list[bytes]) -> None:
        """Notice the engine process going away: its end of the connection closes. Every event is read, also after
        that, so the descriptor does not stay readable and wake the loop for nothing."""
        event = parse_monitor_message(frames)["event"]
        if event == zmq.EVENT_CONNECTED:
            self._connected = True
        elif event == zmq.EVENT_DISCONNECTED and self._connected and self._lost is None:
            log.error("the engine process went away: NOT_SERVING; %d waiting requests fail UNAVAILABLE",
                      len(self._pending))
            self._fail_all("the engine process stopped; this server is restarting", lost=True)
            if self._ready is not None and not self._ready.done():
                self._ready.set_result("the engine process went away")
            self._on_engine_lost()

    def _fail_all(self, message: str, lost: bool) -> None:
        if lost:
            self._lost = message
        pending, self._pending = self._pending, {}
        for job in pending.values():
            if not job.future.done():
                job.future.set_exception(Unavailable(message, reason="engine_lost" if lost else "shutdown"))

    async def close(self) -> None:
        self._socket.stop()
        self._monitor.stop()
        self._fail_all("the server shut down", lost=False)
        self._socket.socket.disable_monitor()
        self._monitor.socket.close(linger=0)
        self._socket.socket.close(linger=0)
        self._context.term()
