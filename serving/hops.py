"""What crosses between a front-end process and the engine process (``--frontends`` N > 1), over one ZeroMQ
DEALER (front end) to ROUTER (engine) connection each.

Every message is a *hop*: everything one side has for the other at the end of an event-loop turn, not one message
per request. A front end's hop carries the requests it tokenized in that turn as three flat arrays (every row's
token ids, token types and length) and a small header (job ids, lanes, deadlines, each work's task and row count),
plus the ids of jobs whose calls were cancelled. The engine's hop carries the outcomes of the jobs a batch finished
(head outputs, or a serving error's kind and message) and the lanes' queue depths. Token ids go as int32 arrays
rather than Python lists: one copy into the message and views on the other side.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import zmq

from bertzoo.tokenization import Encoding

from . import errors
from .engine import Work

HELLO, READY, JOBS, RESULTS = b"hello", b"ready", b"jobs", b"results"

# pyzmq's send_multipart and recv_multipart build an enum member per frame (the flags combined, the option read), a
# Python-level call each; these loops with plain ints and frames' own `more` cost an event loop less per hop.
_SNDMORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)


def send(socket: zmq.Socket, frames: Sequence[bytes]) -> None:
    """Send one message of ``frames`` (copied: a hop's frames are a few KB, where copying beats zero-copy)."""
    for frame in frames[:-1]:
        socket.send(frame, _SNDMORE)
    socket.send(frames[-1])


def receive(socket: zmq.Socket) -> list[bytes]:
    """The next waiting message's frames; raises ``zmq.Again`` when none waits."""
    frame = socket.recv(_NOBLOCK, copy=False)
    frames = [frame.bytes]
    while frame.more:
        frame = socket.recv(_NOBLOCK, copy=False)
        frames.append(frame.bytes)
    return frames


@dataclass(frozen=True)
class JobRequest:
    """One request's items on their way to the engine: ``timeout`` is the seconds its client still waits."""

    job_id: int
    lane: str  # "main" or "long"
    timeout: float | None
    works: Sequence[Work]


@dataclass(frozen=True)
class JobOutcome:
    """One job's answer: its outputs (one per work) and when its first batch started and last ended, or an error."""

    job_id: int
    outputs: list | None = None
    first_start: float = 0.0
    last_end: float = 0.0
    error: tuple[str, str, str] | None = None  # (ServingError subclass name, message, reason)


def pack_jobs(requests: Sequence[JobRequest], cancelled: Sequence[int]) -> list[bytes]:
    rows = [row for request in requests for work in request.works for row in work.rows]
    lengths = np.fromiter((len(row.input_ids) for row in rows), dtype=np.int32, count=len(rows))
    total = int(lengths.sum())
    ids = np.fromiter(itertools.chain.from_iterable(row.input_ids for row in rows), dtype=np.int32, count=total)
    types = np.fromiter(itertools.chain.from_iterable(row.token_type_ids for row in rows), dtype=np.int8, count=total)
    header = ([(r.job_id, r.lane, r.timeout, [(w.task, len(w.rows)) for w in r.works]) for r in requests],
              list(cancelled))
    return [JOBS, pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL), lengths.tobytes(), ids.tobytes(),
            types.tobytes()]


def unpack_jobs(frames: Sequence[bytes]) -> tuple[list[JobRequest], list[int]]:
    """The requests of a :func:`pack_jobs` message (its frames after the kind), rows as views of the arrays."""
    header, lengths, ids, types = frames
    jobs, cancelled = pickle.loads(header)
    ids, types = np.frombuffer(ids, dtype=np.int32), np.frombuffer(types, dtype=np.int8)
    # Plain ints from here: a hop holds a few rows, where numpy's per-call cost outweighs its loops.
    bounds = iter(itertools.pairwise(itertools.accumulate(np.frombuffer(lengths, dtype=np.int32).tolist(), initial=0)))
    requests = []
    for job_id, lane, timeout, shape in jobs:
        works = []
        for task, count in shape:
            encodings = tuple(Encoding(ids[start:end], types[start:end])
                              for start, end in itertools.islice(bounds, count))
            works.append(Work(task, encodings))
        requests.append(JobRequest(job_id, lane, timeout, works))
    return requests, cancelled


def pack_results(outcomes: Sequence[JobOutcome], waiting: dict[str, int]) -> list[bytes]:
    # As tuples: pickle takes a dataclass instance apart through its reduce protocol, each one on the engine's loop.
    rows = [(o.job_id, o.outputs, o.first_start, o.last_end, o.error) for o in outcomes]
    return [RESULTS, pickle.dumps((rows, waiting), protocol=pickle.HIGHEST_PROTOCOL)]


def unpack_results(frame: bytes) -> tuple[list[JobOutcome], dict[str, int]]:
    rows, waiting = pickle.loads(frame)
    return [JobOutcome(*row) for row in rows], waiting


def error_fields(error: errors.ServingError) -> tuple[str, str, str]:
    return type(error).__name__, str(error), error.reason


def error_from_fields(kind: str, message: str, reason: str) -> errors.ServingError:
    """The serving error the engine raised, raised again on the front end (an unknown kind is a backend failure)."""
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.ServingError)):
        cls = errors.BackendFailure
    return cls(message, reason=reason)
