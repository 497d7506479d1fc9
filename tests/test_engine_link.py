"""A front end's link to the engine process, against a stand-in engine socket: what crosses in a hop."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from bertzoo.serving import hops
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
        requests, cancelled = hops.unpack_jobs(frames)
        _, _, *second = await asyncio.wait_for(engine.recv_multipart(), 5)
        cancelled += hops.unpack_jobs(second)[1]
        kept[0].future.cancel()  # a job that left a while ago: its cancellation goes in a hop of its own
        _, _, *later = await asyncio.wait_for(engine.recv_multipart(), 5)
        _, later_cancelled = hops.unpack_jobs(later)
        await link.close()
        assert all(isinstance(job.future.exception(), Unavailable) for job in kept[1:])  # closing fails the waiting
        engine.close(linger=0)
        context.term()
        return [kind, [r.job_id for r in requests], cancelled, [list(r.works[0].rows[0].input_ids) for r in requests],
                later_cancelled]

    kind, ids, cancelled, rows, later_cancelled = asyncio.run(main())
    assert kind == hops.JOBS
    assert ids == [0, 1, 2, 3] and cancelled == [3]  # one hop for the four; job 3's cancellation right after
    assert rows == [[101, 7, 102]] * 4  # token ids cross as they were
    assert later_cancelled == [0]
