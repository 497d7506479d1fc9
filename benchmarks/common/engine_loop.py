"""The engine process's event loop alone: what a hop's requests cost its Python (decoding the hop, a job per request,
queueing, cutting and padding batches, settling, encoding the answers), with nothing else in the way.

`engine_hops.py` measures the engine process as it serves: ZeroMQ's calls and wake-ups, the worker thread's model and
the other processes on the machine all move its figures, by 5-10% between rounds on a 2-core VM. This benchmark keeps
only the loop's own work, so a change to it shows in one run: the engine's `EngineHost` and the lanes'
`Batcher`s run in this process on the server's event loop, the socket is a stand-in that hands each answer back at
once, the model answers with zeros without computing (its worker thread still runs every batch), and the front ends
are played from the same loop with prebuilt hops. It reports the loop thread's CPU per request, less what playing
the front ends cost it (reading the answers' job ids: the row's answers read again afterwards, timed alone).

    python -m benchmarks.engine_hops --probe DIR --loop-alone [--per-hop 1 8] [--peers 12] [--rounds 3]
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace

import numpy as np
import zmq

from bertzoo.serving import engine_protocol as protocol
from bertzoo.serving.config import BatchSettings, ServeConfig
from bertzoo.serving.engine import Work
from bertzoo.serving.engine_process import EngineHost
from bertzoo.serving.event_loop import run_on_best_loop
from bertzoo.serving.lanes import open_local_lanes
from bertzoo.serving.metrics import Metrics
from bertzoo.serving.model import load_served_model


class ZeroModel:
    """A backend that answers every batch with zeros of the right shapes, computing nothing: after ``seconds`` a batch
    with the GIL let go, as a GPU's batch runs (0.55 ms for 64 SST-length rows on an H200 in a CUDA graph), so that
    batches grow to the sizes such a device sees; 0: at once."""

    def __init__(self, hidden: int, labels: int, seconds: float = 0.0) -> None:
        self.hidden, self.labels, self.seconds = hidden, labels, seconds
        self.reset()

    def reset(self) -> None:
        self.batches = self.rows = 0  # counted on the worker thread
        self.busy = 0.0  # seconds inside encode: the stand-in device at work
        self.first_start = self.last_end = None

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        started = time.perf_counter()
        rows, width = batch["input_ids"].shape
        self.batches += 1
        self.rows += rows
        if self.seconds:
            time.sleep(self.seconds)
        states = np.zeros((rows, width, self.hidden), dtype=np.float32)
        self.last_end = time.perf_counter()
        self.first_start = started if self.first_start is None else self.first_start
        self.busy += self.last_end - started
        return states

    def head(self, task: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        return (np.zeros((len(inputs["states"]), self.labels), dtype=np.float32),)


SNDMORE = int(zmq.SNDMORE)


class AnsweringSocket:
    """Stands in for the engine's ROUTER socket: nothing to read, and each message sent goes to ``on_message``."""

    def __init__(self, on_message) -> None:
        self._read_end, self._write_end = os.pipe()  # a descriptor the loop can watch, never readable
        self._on_message = on_message
        self._frames: list[bytes] = []

    def getsockopt(self, option: int) -> int:
        assert option == zmq.FD
        return self._read_end

    def get(self, option: int) -> int:
        return 0  # zmq.EVENTS: no message waits

    def send(self, frame: bytes, flags: int = 0) -> None:
        self._frames.append(frame)
        if not flags & SNDMORE:
            frames, self._frames = self._frames, []
            self._on_message(frames)

    def close(self) -> None:
        os.close(self._read_end)
        os.close(self._write_end)


def hop(tokenizer, sentences: list[str], first_id: int, per_request: int = 1) -> list[bytes]:
    """A JOBS hop of Sentiment requests of ``per_request`` sentences each (one work a sentence, as a front end sends
    them), job ids from ``first_id``."""
    works = [Work("sentiment", (e,)) for e in tokenizer.encode_sentences(sentences, 128)]
    requests = [works[k:k + per_request] for k in range(0, len(works), per_request)]
    return protocol.jobs_message([(protocol.JobHeader(first_id + i, "main", 30.0, [("sentiment", 1)] * len(request)),
                                   request) for i, request in enumerate(requests)], [])


def playing_cost(messages: list[bytes], per_hop: int) -> float:
    """CPU seconds per answer of what the played front ends do with the answers (decode, count by slot), timed on
    ``messages`` (answers the row received) alone, best of 5."""
    answers = sum(len(protocol.read_results(m).job_ids()) for m in messages)
    best = float("inf")
    for _ in range(5):
        counts: dict[int, int] = {}
        started = time.thread_time()
        for message in messages:
            for job_id in protocol.read_results(message).job_ids():
                slot = job_id // per_hop
                counts[slot] = counts.get(slot, per_hop) - 1
        best = min(best, time.thread_time() - started)
    return best / max(1, answers)


def device_share(model: ZeroModel) -> dict[str, float]:
    """What a device would see of the row: the share of the time from the first batch's start to the last one's end
    that a batch was running (its encode: with ``--batch-ms``, the stand-in device's own time), and the mean gap
    between one batch's end and the next one's start (the host's work between batches, the device idle)."""
    if model.first_start is None or model.batches < 2:
        return {"model_busy_share": 0.0, "gap_us_per_batch": 0.0}
    span = model.last_end - model.first_start
    return {"model_busy_share": round(model.busy / span, 3),
            "gap_us_per_batch": round(1e6 * (span - model.busy) / (model.batches - 1), 1)}


async def measure(config: ServeConfig, sentences: list[str], per_hops: list[int], peers: int, window: int,
                  seconds: float, rounds: int, batch_seconds: float = 0.0, per_request: int = 1) -> list[dict]:
    models: list[ZeroModel] = []

    def loader(cfg: ServeConfig):
        served = load_served_model(cfg)
        models.append(ZeroModel(served.spec.hidden_size, len(served.spec.labels["sentiment"]), batch_seconds))
        return replace(served, backend=models[0], spare_backend=None)

    lanes = await open_local_lanes(config, loader, Metrics())
    loop = asyncio.get_running_loop()
    state = {"answered": 0, "on_results": None, "kept": []}

    def on_message(frames: list[bytes]) -> None:
        if state["on_results"] is not None and protocol.kind_of(frames[1]) is protocol.Kind.RESULTS:
            if len(state["kept"]) < 5000:
                state["kept"].append(frames[1])
            state["on_results"](protocol.read_results(frames[1]).job_ids())

    socket = AnsweringSocket(on_message)
    host = EngineHost(socket, config.batch.max_queue)
    host.start()
    host.ready(lanes)
    names = [b"peer-%02d" % k for k in range(peers)]
    for name in names:
        host._handle([name, *protocol.hello_message()])
    rows = []
    try:
        for round_ in range(rounds):
            for per_hop in per_hops:
                slots = max(1, window // per_hop)
                size = per_hop * per_request  # sentences a hop
                ring = [[names[s % peers], *hop(lanes.tokenizer, [sentences[(s * size + i) % len(sentences)]
                                                                 for i in range(size)], s * per_hop, per_request)]
                        for s in range(slots)]
                outstanding = dict.fromkeys(range(slots), per_hop)
                ends = time.perf_counter() + seconds
                done = asyncio.Event()
                in_flight = [slots]

                def on_results(job_ids, ring=ring, outstanding=outstanding, per_hop=per_hop,
                               ends=ends, done=done, in_flight=in_flight) -> None:
                    for job_id in job_ids:
                        slot = job_id // per_hop
                        outstanding[slot] -= 1
                        state["answered"] += 1
                        if outstanding[slot] == 0:
                            in_flight[0] -= 1
                            if time.perf_counter() < ends:  # in a later turn, as a hop read from the socket
                                outstanding[slot] = per_hop
                                in_flight[0] += 1
                                loop.call_soon(host._handle, ring[slot])
                    if not in_flight[0]:
                        done.set()

                state.update(answered=0, on_results=on_results, kept=[])
                models[0].reset()
                cpu, wall = time.thread_time(), time.perf_counter()
                for frames in ring:
                    host._handle(frames)
                await done.wait()
                cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                answered = state["answered"]
                driver = playing_cost(state["kept"], per_hop) * answered
                row = {"round": round_ + 1, "per_hop": per_hop, "peers": peers, "requests": answered,
                       "sentences_per_request": per_request,
                       "requests_per_s": round(answered / wall, 1),
                       "sentences_per_s": round(answered * per_request / wall, 1),
                       "loop_cpu_us_per_request": round(1e6 * (cpu - driver) / answered, 2),
                       "loop_cpu_us_per_sentence": round(1e6 * (cpu - driver) / (answered * per_request), 2),
                       "driver_cpu_us_per_request": round(1e6 * driver / answered, 2),
                       "mean_batch_rows": round(models[0].rows / max(1, models[0].batches), 1),
                       **device_share(models[0])}
                rows.append(row)
                sentences_note = ("" if per_request == 1 else f", {row['loop_cpu_us_per_sentence']:.2f} us a sentence "
                                  f"of {per_request}, {row['sentences_per_s']:.0f} sentences/s")
                print(f"round {row['round']} per hop {per_hop:3d}: loop {row['loop_cpu_us_per_request']:6.2f} us a "
                      f"request{sentences_note} ({row['requests_per_s']:.0f} requests/s; the played front ends "
                      f"{row['driver_cpu_us_per_request']:.2f} us apart; {row['mean_batch_rows']} rows a batch; "
                      f"the model busy {row['model_busy_share']:.0%} of the time, {row['gap_us_per_batch']:.0f} us "
                      "between batches)",
                      flush=True)
    finally:
        state["on_results"] = None
        host.stop()
        await lanes.close()
        socket.close()
    return rows


def loop_alone(artifact: str, sentences: list[str], per_hops: list[int], peers: int, window: int, seconds: float,
               rounds: int, batch_seconds: float = 0.0, per_request: int = 1, pad_to: str = "longest") -> list[dict]:
    """:func:`measure` on a server's event loop (uvloop where installed), the engine serving ``artifact``; requests
    of ``per_request`` sentences; ``pad_to``: the batcher's padding."""
    config = ServeConfig(artifact, instances=1, threads=1, frontends=2, warmup=False,
                         batch=BatchSettings(pad_to=pad_to))
    rows: list[dict] = []

    async def run() -> None:
        rows.extend(await measure(config, sentences, per_hops, peers, window, seconds, rounds, batch_seconds,
                                  per_request))

    run_on_best_loop(run)
    return rows
