"""What crosses between a front-end process and the engine process (``--frontends`` N > 1), and the socket it
crosses on: one ZeroMQ DEALER (front end) to ROUTER (engine) connection per front end.

A message is one frame, or two for ``JOBS``: its :class:`Kind` as the first byte, then its record. Every message is
a *hop*: everything one side has for the other at the end of an event-loop turn, not one message per request. Few
frames, because each frame is a call into ZeroMQ and a wake-up of its I/O thread, the larger part of the engine
process's own cost per hop.

- ``HELLO`` (front end): no record. Answered by ``READY`` once the model is loaded and warmed up.
- ``READY`` (engine): :class:`Ready`, the model's facts and its tokenizer, so front ends load nothing themselves.
- ``JOBS`` (front end): :class:`JobsHeader` (each request's job id, lane, deadline and works; the ids of cancelled
  jobs; every row's length); a second frame holds every row's token ids, then every row's token types, one flat
  int32 array (one read of the frame on the engine, which a hop of one request pays in full).
- ``RESULTS`` (engine): :class:`Results`, the requests batches finished (:class:`Answered`: a hop's one-work
  requests that one batch ran, together; :class:`Outcome`: any other request's answer, one each), those that failed
  (:class:`Outcome`) and the lanes' queue depths.

Records are msgspec Structs encoded as MessagePack arrays: typed on both ends (a decode checks every field's type),
no class names on the wire, and several times cheaper to encode and decode than pickle for these small records.
Errors travel as an :class:`ErrorCode`. Token ids go as int32 arrays rather than lists: one copy into the message and
views on the other side; head outputs (float32 vectors) as MessagePack extensions holding their bytes.
"""

from __future__ import annotations

import array
import asyncio
import enum
from collections.abc import Callable, Sequence
from typing import Any, Literal

import msgspec
import numpy as np
import zmq

from bertzoo.tokenization import Encoding

from .engine import Work
from .errors import BackendFailure, DeadlineExceeded, InvalidRequest, QueueFull, ServingError, Unavailable
from .model import ModelSpec


class Kind(enum.IntEnum):
    HELLO = 1
    READY = 2
    JOBS = 3
    RESULTS = 4

    @property
    def prefix(self) -> bytes:
        return _KIND_PREFIXES[self]


_KIND_PREFIXES = {kind: bytes([kind]) for kind in Kind}


_KINDS = {int(kind): kind for kind in Kind}  # a lookup, not Kind(byte): an enum call per hop is a Python-level call


def kind_of(frame: bytes) -> Kind | None:
    """A message's kind from its first frame; None for a frame that names none (a peer of another version)."""
    return _KINDS.get(frame[0]) if frame else None


class ErrorCode(enum.IntEnum):
    INVALID_REQUEST = 1
    QUEUE_FULL = 2
    UNAVAILABLE = 3
    DEADLINE_EXCEEDED = 4
    BACKEND_FAILURE = 5


_ERRORS: dict[ErrorCode, type[ServingError]] = {
    ErrorCode.INVALID_REQUEST: InvalidRequest, ErrorCode.QUEUE_FULL: QueueFull, ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.DEADLINE_EXCEEDED: DeadlineExceeded, ErrorCode.BACKEND_FAILURE: BackendFailure,
}
_CODES = {cls: code for code, cls in _ERRORS.items()}

Lane = Literal["main", "long"]


class Ready(msgspec.Struct, array_like=True, frozen=True):
    spec: ModelSpec
    tokenizer_json: str


class JobHeader(msgspec.Struct, array_like=True, frozen=True):
    """One request: ``timeout`` is the seconds its client still waits; ``works`` each work's task and row count."""

    job_id: int
    lane: Lane
    timeout: float | None
    works: list[tuple[str, int]]


class JobsHeader(msgspec.Struct, array_like=True, frozen=True):
    jobs: list[JobHeader]
    cancelled: list[int]  # jobs cancelled since the last hop; one also listed in `jobs` is never queued
    lengths: list[int]  # every row's tokens, in order (a hop's few rows decode faster as a list than as an array)


class Failure(msgspec.Struct, array_like=True, frozen=True):
    code: ErrorCode
    message: str
    reason: str

    @classmethod
    def of(cls, error: ServingError) -> Failure:
        return cls(_CODES.get(type(error), ErrorCode.BACKEND_FAILURE), str(error), error.reason)

    def error(self) -> ServingError:
        """The serving error the engine raised, to raise again on the front end."""
        return _ERRORS[self.code](self.message, reason=self.reason)


class Outcome(msgspec.Struct, array_like=True, frozen=True):
    """One job's answer: its outputs (one per work: :func:`packed_outputs` on the way out, :func:`output_list` on the
    way in) and when its first batch started and last ended, or a failure."""

    job_id: int
    outputs: Any = None
    first_start: float = 0.0
    last_end: float = 0.0
    failure: Failure | None = None


class Answered(msgspec.Struct, array_like=True, frozen=True):
    """Requests of one hop, of one work each, that one batch answered: their job ids, each one's output (see
    :func:`answered_outputs`) and when the batch started and ended."""

    job_ids: list[int]
    outputs: Any
    started: float
    ended: float


def answered_outputs(outputs: Sequence) -> Sequence:
    """A batch's outputs for the requests it answers, as they cross: a [requests, length] array as it is (a slice
    of the batch's own, for sentiment and embed), else as :func:`packed_outputs` packs a list."""
    if isinstance(outputs, np.ndarray) and outputs.ndim == 2:
        return outputs
    return packed_outputs(list(outputs))


class Results(msgspec.Struct, array_like=True, frozen=True):
    outcomes: list[Outcome]  # a request each: the answer of one not in a hop's job, or a failure
    waiting: dict[str, int]  # requests waiting per lane: a front end refuses at its door while a queue is full
    answered: list[Answered] = []

    def job_ids(self) -> list[int]:
        """Every request these results end, answered or failed."""
        return [outcome.job_id for outcome in self.outcomes] + [i for block in self.answered for i in block.job_ids]


# A head's output vector (logits, an embedding, a QA window's start or end logits) as an extension: its float32 bytes.
_FLOAT32_VECTOR = 1
# A request's outputs when they are vectors of one length (a sentence task's logits or embeddings, one per sentence):
# one [works, length] extension, the length as 4 bytes (little-endian) before the float32 bytes, instead of one
# extension per work to encode and decode.
_FLOAT32_ROWS = 2


def packed_outputs(outputs: list) -> list | np.ndarray:
    """A job's outputs as they cross: several vectors of one length as one [works, length] array, else as they are."""
    if len(outputs) > 1:
        first = outputs[0]
        if isinstance(first, np.ndarray) and first.ndim == 1 and all(
                isinstance(o, np.ndarray) and o.shape == first.shape for o in outputs):
            return np.stack(outputs)
    return outputs


def output_list(outputs: list | np.ndarray) -> list:
    """A crossed job's outputs, one per work (the rows of a packed array: views, no copy)."""
    return list(outputs) if isinstance(outputs, np.ndarray) else outputs


def _encode_extra(value: object) -> object:
    if isinstance(value, np.ndarray):
        if value.dtype != np.float32 or not value.flags.c_contiguous:  # (a head's row mostly is one already)
            value = np.ascontiguousarray(value, dtype=np.float32)
        if value.ndim == 2:
            return msgspec.msgpack.Ext(_FLOAT32_ROWS, value.shape[1].to_bytes(4, "little") + value.tobytes())
        return msgspec.msgpack.Ext(_FLOAT32_VECTOR, value.data.cast("B"))
    if isinstance(value, np.generic):
        return value.item()
    raise NotImplementedError(f"the engine protocol has no encoding for {type(value).__name__}")


def _decode_extra(code: int, data: memoryview) -> object:
    if code == _FLOAT32_VECTOR:
        return np.frombuffer(data, dtype=np.float32)
    if code == _FLOAT32_ROWS:
        length = int.from_bytes(data[:4], "little")
        values = np.frombuffer(data[4:], dtype=np.float32)
        if length == 0 or len(values) % length:
            raise msgspec.ValidationError(f"an engine message's rows of {length} values hold {len(values)} values")
        return values.reshape(-1, length)
    raise msgspec.ValidationError(f"unknown extension {code} in an engine message")


_encoder = msgspec.msgpack.Encoder(enc_hook=_encode_extra)
_ready_decoder = msgspec.msgpack.Decoder(Ready)
_jobs_decoder = msgspec.msgpack.Decoder(JobsHeader)
_results_decoder = msgspec.msgpack.Decoder(Results, ext_hook=_decode_extra)


def _record(kind: Kind, record: msgspec.Struct) -> bytes:
    return kind.prefix + _encoder.encode(record)


def hello_message() -> list[bytes]:
    return [Kind.HELLO.prefix]


def ready_message(spec: ModelSpec, tokenizer_json: str) -> list[bytes]:
    return [_record(Kind.READY, Ready(spec, tokenizer_json))]


def read_ready(frame: bytes) -> Ready:
    return _ready_decoder.decode(memoryview(frame)[1:])


def jobs_message(jobs: Sequence[tuple[JobHeader, Sequence[Work]]], cancelled: Sequence[int]) -> list[bytes]:
    """A ``JOBS`` hop: each request's header with its works, and the jobs cancelled since the last hop."""
    rows = [row for _, works in jobs for work in works for row in work.rows]
    tokens: list[int] = []  # one list, then one conversion: an array's extend converts item by item, slower
    for row in rows:
        tokens += row.input_ids
    for row in rows:
        tokens += row.token_type_ids
    header = JobsHeader([header for header, _ in jobs], list(cancelled), [len(row.input_ids) for row in rows])
    return [_record(Kind.JOBS, header), array.array("i", tokens).tobytes()]


def read_jobs(frames: Sequence[bytes]) -> tuple[list[tuple[JobHeader, list[Work]]], list[int]]:
    """The requests of a ``JOBS`` hop, their rows views of the hop's one token array."""
    header_frame, tokens = frames
    header = _jobs_decoder.decode(memoryview(header_frame)[1:])
    lengths = header.lengths
    total = sum(lengths)
    flat = np.frombuffer(tokens, dtype=np.int32)
    if len(flat) != 2 * total:
        raise msgspec.ValidationError(f"a JOBS hop has {len(flat)} token values for rows of {total} tokens")
    ids, types = flat[:total], flat[total:]
    jobs = []
    start = row = 0
    try:
        for job in header.jobs:
            works = []
            for task, count in job.works:
                if count == 1:  # a sentence: most works
                    end = start + lengths[row]
                    works.append(Work(task, (Encoding(ids[start:end], types[start:end]),)))
                    start = end
                    row += 1
                    continue
                encodings = []
                for length in lengths[row:row + count]:
                    end = start + length
                    encodings.append(Encoding(ids[start:end], types[start:end]))
                    start = end
                row += count
                works.append(Work(task, tuple(encodings)))
            jobs.append((job, works))
    except IndexError:  # more rows than lengths
        raise msgspec.ValidationError(f"a JOBS hop's works have more rows than its {len(lengths)} lengths") from None
    if row != len(lengths):
        raise msgspec.ValidationError(f"a JOBS hop's works have {row} rows, its lengths {len(lengths)}")
    return jobs, header.cancelled


def results_message(outcomes: list[Outcome], waiting: dict[str, int], answered: list[Answered] | None = None
                    ) -> list[bytes]:
    return [_record(Kind.RESULTS, Results(outcomes, waiting, answered or []))]


def read_results(frame: bytes) -> Results:
    return _results_decoder.decode(memoryview(frame)[1:])


# pyzmq's send_multipart and recv_multipart build an enum member per frame (the flags combined, the option read), a
# Python-level call each; these loops with plain ints and frames' own `more` cost an event loop less per hop.
_SNDMORE, _NOBLOCK, _EVENTS, _POLLIN = int(zmq.SNDMORE), int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)


class HopSocket:
    """A plain (not asyncio) ZeroMQ socket read from the event loop's reader callback, for either end.

    zmq.asyncio costs a future and several callbacks per message, which made the engine's loop what bounded a GPU
    server's rate (benchmarks/RESULTS.md, "Serving on GPU"). ZeroMQ's descriptor signals edges, not levels: once it
    turns readable every waiting message is read, and every send (which can take that edge) is followed by a read of
    what came meanwhile.
    ``on_message`` gets each message's frames (a ROUTER's first frame is the peer's identity)."""

    def __init__(self, socket: zmq.Socket, on_message: Callable[[list[bytes]], None]) -> None:
        self.socket = socket
        self._on_message = on_message
        self._fd: int | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._fd = self.socket.getsockopt(zmq.FD)
        loop.add_reader(self._fd, self.drain)
        loop.call_soon(self.drain)  # what came before the reader was added

    def stop(self) -> None:
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            self._fd = None

    def send(self, frames: Sequence[bytes], then_drain: bool = True) -> None:
        """Send one message of ``frames`` (copied: a hop's frames are a few KB, where copying beats zero-copy), then
        read whatever came meanwhile (``then_drain=False``: the caller sends more first, then calls :meth:`drain`
        once)."""
        for frame in frames[:-1]:
            self.socket.send(frame, _SNDMORE)
        self.socket.send(frames[-1])
        if then_drain:
            self.drain()

    def drain(self) -> None:
        """Hand every waiting message to ``on_message``. Whether one waits is read from the socket's events (what
        ZeroMQ's edge-signalling descriptor asks for), which costs less than a read that finds nothing and raises."""
        socket = self.socket
        while True:
            try:
                if not socket.get(_EVENTS) & _POLLIN:
                    return
                frame = socket.recv(_NOBLOCK, copy=False)
                frames = [frame.bytes]
                while frame.more:
                    frame = socket.recv(_NOBLOCK, copy=False)
                    frames.append(frame.bytes)
            except zmq.ZMQError:  # the socket is closing (or, never expected, a message vanished: zmq.Again)
                return
            self._on_message(frames)
