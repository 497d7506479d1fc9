"""A front end's link to the engine process, against a stand-in engine socket: what crosses in a hop."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from bertzoo.serving import engine_protocol as protocol
from bertzoo.serving.config import ServeConfig
from bertzoo.serving.engine import Work
from bertzoo.serving.engine_link import EngineLink
from bertzoo.serving.errors import Unavailable
from bertzoo.tokenization import Encoding


def test_requests_of_one_turn_leave_as_one_hop_and_cancellations_follow(tmp_path):
    async def main() -> list:
        context = zmq.asyncio.Context()
        engine = context.socket(zmq.ROUTER)
        address = f"ipc://{tmp_path / 'engine.sock'}"
        engine.bind(address)
        link = EngineLink(address, ServeConfig(str(tmp_path)))
        work = [Work("sentiment", (Encoding([101, 7, 102], [0, 0, 0]),))]
        kept = [link.submit("main", work, 5.0) for _ in range(3)]
        dropped = link.submit("main", work, 5.0)
        dropped.future.cancel()  # in the same turn: its cancellation is the engine's to apply after the request
        peer, kind, *frames = await asyncio.wait_for(engine.recv_multipart(), 5)
        requests, cancelled = protocol.read_jobs(frames)
        _, _, *second = await asyncio.wait_for(engine.recv_multipart(), 5)
        cancelled += protocol.read_jobs(second)[1]
        kept[0].future.cancel()  # a job that left a while ago: its cancellation goes in a hop of its own
        _, _, *later = await asyncio.wait_for(engine.recv_multipart(), 5)
        _, later_cancelled = protocol.read_jobs(later)
        await link.close()
        assert all(isinstance(job.future.exception(), Unavailable) for job in kept[1:])  # closing fails the waiting
        engine.close(linger=0)
        context.term()
        return [kind, [r.job_id for r, _ in requests], cancelled, [list(w[0].rows[0].input_ids) for _, w in requests],
                later_cancelled]

    kind, ids, cancelled, rows, later_cancelled = asyncio.run(main())
    assert protocol.kind_of(kind) is protocol.Kind.JOBS
    assert ids == [0, 1, 2, 3] and cancelled == [3]  # one hop for the four; job 3's cancellation right after
    assert rows == [[101, 7, 102]] * 4  # token ids cross as they were
    assert later_cancelled == [0]


def test_every_front_end_is_told_when_the_queue_turns_full_and_refuses_at_its_door(tiny_artifact, tmp_path):
    """The engine (its host, real lanes of the tiny model) with two front ends' links: front end A fills the queue;
    front end B, with no request of its own there, is told anyway and refuses the next request before it leaves; once
    A's requests ran, B is told the queue has room again."""
    from bertzoo.serving.config import BatchSettings
    from bertzoo.serving.engine_process import EngineHost
    from bertzoo.serving.errors import QueueFull
    from bertzoo.serving.lanes import open_local_lanes
    from bertzoo.serving.metrics import Metrics
    from bertzoo.serving.model import load_served_model
    from conftest import serve_config

    _, artifact = tiny_artifact
    # An idle engine waits up to 1.5 s for a fuller batch: two requests hold the 2-request queue full that long.
    config = serve_config(artifact, batch=BatchSettings(max_queue=2, max_queue_delay_ms=1500), warmup=False)

    async def main() -> tuple:
        context = zmq.Context()
        socket = context.socket(zmq.ROUTER)
        address = f"ipc://{tmp_path / 'engine.sock'}"
        socket.bind(address)
        host = EngineHost(socket, max_queue=2)
        host.start()
        lanes = await open_local_lanes(config, load_served_model, Metrics())
        host.ready(lanes)
        a, b = EngineLink(address, config), EngineLink(address, config)
        front_a, _ = await a.open(), await b.open()
        work = [Work("sentiment", (Encoding([101, 7, 102], [0, 0, 0]),))]
        jobs = [front_a.main.submit(work, 5.0) for _ in range(2)]
        for _ in range(100):  # the depths' hop reaches B (it sent nothing)
            await asyncio.sleep(0.01)
            try:
                b.check_room("main")
            except QueueFull as refused:
                told_full = str(refused)
                break
        else:
            told_full = None
        await asyncio.gather(*(job.future for job in jobs))
        await asyncio.sleep(0.1)
        b.check_room("main")  # room again: no exception
        for link in (a, b):
            await link.close()
        await lanes.close()
        host.stop()
        socket.close(linger=0)
        context.term()
        return told_full, b._pending

    told_full, b_pending = asyncio.run(main())
    assert told_full is not None and "queue is full (2 requests waiting)" in told_full
    assert b_pending == {}  # B refused with nothing of its own in the engine


def test_what_crosses_comes_back_as_it_left():
    """The engine protocol's records, encoded and decoded as the two processes do: rows, deadlines and lanes of a JOBS
    hop; outputs of every task's shape, failures by code and reason, and the queue depths of a RESULTS hop."""
    import msgspec
    import numpy as np
    import pytest

    from bertzoo.serving.errors import DeadlineExceeded, QueueFull

    works = [Work("paraphrase", (Encoding([101, 5, 102], [0, 0, 0]), Encoding([101, 6, 7, 102], [0, 0, 0, 0]))),
             Work("qa", (Encoding([101, 8, 102, 9, 102], [0, 0, 0, 1, 1]),))]
    header = protocol.JobHeader(7, "long", 2.5, [("paraphrase", 2), ("qa", 1)])
    frames = protocol.jobs_message([(header, works)], cancelled=[3])
    assert protocol.kind_of(frames[0]) is protocol.Kind.JOBS
    [(got, got_works)], cancelled = protocol.read_jobs(frames[1:])
    assert got == header and cancelled == [3]
    assert [[(list(r.input_ids), list(r.token_type_ids)) for r in w.rows] for w in got_works] == \
        [[(list(r.input_ids), list(r.token_type_ids)) for r in w.rows] for w in works]

    logits = np.array([0.5, -1.25, 3.0], dtype=np.float32)
    qa = ([np.arange(4, dtype=np.float32)], [np.arange(4, 8, dtype=np.float32)])
    outcomes = [protocol.Outcome(1, [logits[:2], np.float32(0.75), qa], 1.5, 2.5),
                protocol.Outcome(2, failure=protocol.Failure.of(QueueFull("full", reason="queue_full"))),
                protocol.Outcome(3, failure=protocol.Failure.of(DeadlineExceeded("late")))]
    results = protocol.read_results(protocol.results_message(outcomes, {"main": 4, "long": 0})[1])
    assert results.waiting == {"main": 4, "long": 0}
    answer, full, late = results.outcomes
    assert answer.outputs[0].tolist() == [0.5, -1.25] and answer.outputs[1] == 0.75
    assert [a.tolist() for a in answer.outputs[2][0]] == [[0, 1, 2, 3]] and answer.outputs[2][1][0].tolist() == [4, 5, 6, 7]
    assert (answer.first_start, answer.last_end) == (1.5, 2.5)
    assert isinstance(full.failure.error(), QueueFull) and full.failure.error().reason == "queue_full"
    assert isinstance(late.failure.error(), DeadlineExceeded) and str(late.failure.error()) == "late"

    assert protocol.kind_of(b"jobs") is None and protocol.kind_of(bytes([99])) is None
    with pytest.raises(msgspec.ValidationError):  # a header of the wrong shape is refused, not half read
        protocol.read_jobs([msgspec.msgpack.encode([[[1, "sideways", None, []]], []]), *frames[2:]])
