"""A front end's link to the engine process, against a stand-in engine socket: what crosses in a hop."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import zmq
import zmq.asyncio

from bertzoo.serving import engine_protocol as protocol
from bertzoo.serving.config import ServeConfig
from bertzoo.serving.engine import Work
from bertzoo.serving.engine_link import EngineLink
from bertzoo.serving.errors import Unavailable
from bertzoo.tokenization import Encoding


def test_requests_of_one_turn_leave_as_one_hop_and_cancellations_follow(tmp_path):
    """Against a stand-in engine socket: what a front end sends."""
    async def main() -> list:
        context = zmq.asyncio.Context()
        engine = context.socket(zmq.ROUTER)
        address = f"ipc://{tmp_path / 'engine.sock'}"
        engine.bind(address)
        link = EngineLink(address, ServeConfig(str(tmp_path)))
        work = [Work("sentiment", (Encoding([101, 7, 102], [0, 0, 0]),))]
        kept = [link.submit("main", work, 5.0) for _ in range(3)]
        dropped = link.submit("main", work, 5.0)
        dropped.future.cancel()  # in the turn of its submit: it never leaves
        peer, *frames = await asyncio.wait_for(engine.recv_multipart(), 5)
        kind = protocol.kind_of(frames[0])
        requests, cancelled = protocol.read_jobs(frames)
        kept[0].future.cancel()  # a job that left: its cancellation goes in a hop of its own
        _, *later = await asyncio.wait_for(engine.recv_multipart(), 5)
        _, later_cancelled = protocol.read_jobs(later)
        await link.close()
        assert all(isinstance(job.future.exception(), Unavailable) for job in kept[1:])  # closing fails the waiting
        engine.close(linger=0)
        context.term()
        return [kind, [r.job_id for r, _ in requests], cancelled, [list(w[0].rows[0].input_ids) for _, w in requests],
                later_cancelled]

    kind, ids, cancelled, rows, later_cancelled = asyncio.run(main())
    assert kind is protocol.Kind.JOBS
    assert ids == [0, 1, 2] and cancelled == []  # one hop for the three; the cancelled fourth never left
    assert rows == [[101, 7, 102]] * 3  # token ids cross as they were
    assert later_cancelled == [0]


def _engine_with_links(config, tmp_path, links: int):
    """The engine's host serving real lanes of ``config``'s model, and ``links`` front ends' links to it: the links,
    their lanes, the engine's own lanes and metrics, and how to stop it all."""
    from bertzoo.serving.engine_process import EngineHost
    from bertzoo.serving.lanes import open_local_lanes
    from bertzoo.serving.metrics import Metrics
    from bertzoo.serving.model import load_served_model

    async def start():
        context = zmq.Context()
        socket = context.socket(zmq.ROUTER)
        address = f"ipc://{tmp_path / 'engine.sock'}"
        socket.bind(address)
        host = EngineHost(socket, max_queue=config.batch.max_queue)
        host.start()
        metrics = Metrics()
        lanes = await open_local_lanes(config, load_served_model, metrics)
        host.ready(lanes)
        ends = [EngineLink(address, config) for _ in range(links)]
        fronts = [await end.open() for end in ends]

        async def stop():
            for end in ends:
                await end.close()
            host.stop()
            await lanes.close()
            socket.close(linger=0)
            context.term()

        return ends, fronts, lanes, metrics, stop

    return start()


def test_a_call_cancelled_in_the_turn_of_its_submit_never_reaches_the_engine(tiny_artifact, tmp_path):
    """The real engine host and lanes behind a link. A call cancelled in the turn of its submit is never submitted to
    the engine's lane and runs no batch; the same call not cancelled is, and runs one (both counts can move); a call
    cancelled after it left, while its batch waits for the queue delay, is submitted but leaves the queue unrun."""
    from bertzoo.serving.config import BatchSettings
    from conftest import serve_config

    _, artifact = tiny_artifact
    work = [Work("sentiment", (Encoding([101, 7, 102], [0, 0, 0]),))]
    config = serve_config(artifact, batch=BatchSettings(max_queue_delay_ms=1000), warmup=False)

    async def main() -> list[tuple[int, float]]:
        _, [front], lanes, metrics, stop = await _engine_with_links(config, tmp_path, 1)
        submitted, add = [], lanes.main.add
        # Every request the engine queues: a hop's several as one job (their ids), a hop's one alone.
        lanes.main.add = lambda job: submitted.extend(getattr(job, "job_ids", [job.tag])) or add(job)

        def seen() -> tuple[int, float]:
            return len(submitted), metrics.registry.get_sample_value("bertzoo_batch_size_count", {"lane": "main"}) or 0.0

        counts = [seen()]
        front.main.submit(work, 5.0).future.cancel()
        await asyncio.sleep(1.5)  # past the queue delay
        counts.append(seen())
        await asyncio.wait_for(front.main.submit(work, 5.0).future, 5)
        counts.append(seen())
        later = front.main.submit(work, 5.0)
        await asyncio.sleep(0.3)  # it left; its batch waits for the queue delay
        later.future.cancel()
        await asyncio.sleep(1.5)
        counts.append(seen())
        await stop()
        return counts

    assert asyncio.run(main()) == [(0, 0), (0, 0), (1, 1), (2, 1)]


def test_a_hops_requests_end_one_by_one_in_the_engine(tiny_artifact, tmp_path):
    """The real engine host and lanes behind a link: four requests leave in one hop and become one job in the engine.
    The queue has room for three, so the fourth is refused QUEUE_FULL; of the three, one is cancelled after it left
    and one's deadline passes while the batch waits for the queue delay: neither reaches the model, and the batch
    that runs holds the one left, which is answered with its logits."""
    from bertzoo.serving.config import BatchSettings
    from bertzoo.serving.errors import DeadlineExceeded, QueueFull
    from conftest import serve_config

    _, artifact = tiny_artifact
    config = serve_config(artifact, batch=BatchSettings(max_queue=3, max_queue_delay_ms=1000), warmup=False)
    work = [Work("sentiment", (Encoding([101, 7, 102], [0, 0, 0]),))]

    async def main() -> tuple:
        _, [front], lanes, metrics, stop = await _engine_with_links(config, tmp_path, 1)
        jobs = [front.main.submit(work, timeout) for timeout in (5.0, 0.5, 5.0, 5.0)]
        await asyncio.sleep(0.3)  # the hop left and is queued
        waiting = lanes.main.waiting
        jobs[2].future.cancel()
        await asyncio.sleep(0.1)
        waiting_after_cancel = lanes.main.waiting
        ended = await asyncio.gather(*(job.future for job in (jobs[0], jobs[1], jobs[3])), return_exceptions=True)
        rows = metrics.registry.get_sample_value("bertzoo_batch_size_sum", {"lane": "main"})
        await stop()
        return waiting, waiting_after_cancel, ended, rows

    waiting, waiting_after_cancel, (answered, expired, refused), rows = asyncio.run(main())
    assert (waiting, waiting_after_cancel) == (3, 2)
    assert len(answered) == 1 and answered[0].shape == (5,)
    assert isinstance(expired, DeadlineExceeded) and isinstance(refused, QueueFull)
    assert rows == 1.0


def test_a_hop_of_one_sentence_and_longer_requests_answers_each_as_it_left(tiny_artifact, tmp_path):
    """One hop of three one-sentence requests (one job in the engine) and a request of two sentences (a job of its
    own): each is answered with its own outputs, in its own order, equal to the same request sent alone."""
    from conftest import serve_config

    _, artifact = tiny_artifact
    config = serve_config(artifact, warmup=False)

    def sentence(token: int) -> Work:
        return Work("sentiment", (Encoding([101, token, 102], [0, 0, 0]),))

    async def main() -> tuple:
        _, [front], lanes, _, stop = await _engine_with_links(config, tmp_path, 1)
        requests = [[sentence(7)], [sentence(8), sentence(9)], [sentence(10)], [sentence(11)]]
        together = await asyncio.gather(*(front.main.submit(works, 5.0).future for works in requests))
        alone = [await front.main.submit(works, 5.0).future for works in requests]
        await stop()
        return together, alone

    together, alone = asyncio.run(main())
    assert [len(outputs) for outputs in together] == [1, 2, 1, 1]
    for got, expected in zip(together, alone, strict=True):
        assert np.allclose(np.stack(got), np.stack(expected), atol=1e-5)
    assert not np.allclose(together[0][0], together[2][0], atol=1e-6)  # not one answer for all


def test_every_front_end_is_told_when_the_queue_turns_full_and_refuses_at_its_door(tiny_artifact, tmp_path):
    """The engine (its host, real lanes of the tiny model) with two front ends' links: front end A fills the queue;
    front end B, with no request of its own there, is told anyway and refuses the next request before it leaves; once
    A's requests ran, B is told the queue has room again."""
    from bertzoo.serving.config import BatchSettings
    from bertzoo.serving.errors import QueueFull
    from conftest import serve_config

    _, artifact = tiny_artifact
    # An idle engine waits up to 1.5 s for a fuller batch: two requests hold the 2-request queue full that long.
    config = serve_config(artifact, batch=BatchSettings(max_queue=2, max_queue_delay_ms=1500), warmup=False)

    async def main() -> tuple:
        (a, b), (front_a, _), _, _, stop = await _engine_with_links(config, tmp_path, 2)
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
        pending = dict(b._pending)
        await stop()
        return told_full, pending

    told_full, b_pending = asyncio.run(main())
    assert told_full is not None and "queue is full (2 requests waiting)" in told_full
    assert b_pending == {}  # B refused with nothing of its own in the engine


def test_what_crosses_comes_back_as_it_left():
    """The engine protocol's records, encoded and decoded as the two processes do: rows, deadlines and lanes of a JOBS
    hop; outputs of every task's shape, failures by code and reason, and the queue depths of a RESULTS hop."""
    import msgspec

    from bertzoo.serving.errors import DeadlineExceeded, QueueFull

    works = [Work("paraphrase", (Encoding([101, 5, 102], [0, 0, 0]), Encoding([101, 6, 7, 102], [0, 0, 0, 0]))),
             Work("qa", (Encoding([101, 8, 102, 9, 102], [0, 0, 0, 1, 1]),))]
    header = protocol.JobHeader(7, "long", 2.5, [("paraphrase", 2), ("qa", 1)])
    frames = protocol.jobs_message([(header, works)], cancelled=[3])
    assert protocol.kind_of(frames[0]) is protocol.Kind.JOBS
    [(got, got_works)], cancelled = protocol.read_jobs(frames)
    assert got == header and cancelled == [3]
    assert [[(list(r.input_ids), list(r.token_type_ids)) for r in w.rows] for w in got_works] == \
        [[(list(r.input_ids), list(r.token_type_ids)) for r in w.rows] for w in works]

    logits = np.array([0.5, -1.25, 3.0], dtype=np.float32)
    qa = ([np.arange(4, dtype=np.float32)], [np.arange(4, 8, dtype=np.float32)])
    outcomes = [protocol.Outcome(1, [logits[:2], np.float32(0.75), qa], 1.5, 2.5),
                protocol.Outcome(2, failure=protocol.Failure.of(QueueFull("full", reason="queue_full"))),
                protocol.Outcome(3, failure=protocol.Failure.of(DeadlineExceeded("late")))]
    [frame] = protocol.results_message(outcomes, {"main": 4, "long": 0})
    assert protocol.kind_of(frame) is protocol.Kind.RESULTS
    results = protocol.read_results(frame)
    assert results.waiting == {"main": 4, "long": 0}
    answer, full, late = results.outcomes
    assert answer.outputs[0].tolist() == [0.5, -1.25] and answer.outputs[1] == 0.75
    assert [a.tolist() for a in answer.outputs[2][0]] == [[0, 1, 2, 3]] and answer.outputs[2][1][0].tolist() == [4, 5, 6, 7]
    assert (answer.first_start, answer.last_end) == (1.5, 2.5)
    assert isinstance(full.failure.error(), QueueFull) and full.failure.error().reason == "queue_full"
    assert isinstance(late.failure.error(), DeadlineExceeded) and str(late.failure.error()) == "late"

    # A request's vectors of one length (a sentence task's, one per sentence) cross as one array, and come back one
    # per work; anything else crosses as it is.
    vectors = [np.arange(k, k + 5, dtype=np.float32) for k in range(3)]
    packed = protocol.packed_outputs(vectors)
    assert isinstance(packed, np.ndarray) and packed.shape == (3, 5)
    assert protocol.packed_outputs(vectors[:1]) == vectors[:1]
    mixed = [vectors[0], vectors[1][:4]]
    assert protocol.packed_outputs(mixed) is mixed and protocol.packed_outputs([0.5, 0.25]) == [0.5, 0.25]
    [frame] = protocol.results_message([protocol.Outcome(4, packed)], {})
    crossed = protocol.output_list(protocol.read_results(frame).outcomes[0].outputs)
    assert isinstance(crossed, list) and [v.tolist() for v in crossed] == [v.tolist() for v in vectors]
    with pytest.raises(msgspec.ValidationError, match="rows of 4 values"):  # rows the values do not fill
        protocol.read_results(protocol.Kind.RESULTS.prefix + msgspec.msgpack.encode(
            [[[5, msgspec.msgpack.Ext(2, (4).to_bytes(4, "little") + bytes(4 * 6)), 0.0, 0.0, None]], {}]))

    # A hop's one-work requests that one batch answered cross together: a slice of the batch's array as it is, any
    # other outputs packed as a request's are.
    logits = np.arange(10, dtype=np.float32).reshape(5, 2)
    sliced = logits[1:3]
    assert protocol.answered_outputs(sliced) is sliced and protocol.answered_outputs([0.5, 0.25]) == [0.5, 0.25]
    blocks = [protocol.Answered([10, 12], protocol.answered_outputs(logits[:2]), 1.0, 2.0),
              protocol.Answered([11], protocol.answered_outputs([0.75]), 3.0, 4.0)]
    [frame] = protocol.results_message([], {}, blocks)
    crossed = protocol.read_results(frame)
    assert [(b.job_ids, np.asarray(b.outputs).tolist(), b.started, b.ended) for b in crossed.answered] == [
        ([10, 12], [[0.0, 1.0], [2.0, 3.0]], 1.0, 2.0), ([11], [0.75], 3.0, 4.0)]
    assert crossed.job_ids() == [10, 12, 11]

    assert protocol.kind_of(b"") is None and protocol.kind_of(bytes([99])) is None
    with pytest.raises(msgspec.ValidationError):  # a header of the wrong shape is refused, not half read
        protocol.read_jobs([protocol.Kind.JOBS.prefix + msgspec.msgpack.encode([[[1, "sideways", None, []]], []]),
                            frames[1]])
    with pytest.raises(msgspec.ValidationError, match="token values"):  # tokens that the lengths do not account for
        protocol.read_jobs([frames[0], frames[1][:-4]])
    with pytest.raises(msgspec.ValidationError, match="rows"):  # works whose rows the lengths do not count
        protocol.read_jobs([protocol.Kind.JOBS.prefix + msgspec.msgpack.encode(
            [[[7, "main", None, [["sentiment", 1]]]], [], [3, 4]]), frames[1][:4 * 2 * 7]])
    with pytest.raises(msgspec.ValidationError, match="more rows than"):  # more sentences than lengths
        protocol.read_jobs([protocol.Kind.JOBS.prefix + msgspec.msgpack.encode(
            [[[7, "main", None, [["sentiment", 1], ["sentiment", 1]]]], [], [3]]), frames[1][:4 * 2 * 3]])


def test_replicas_share_a_front_ends_requests_by_what_each_has_outstanding(tiny_artifact, tmp_path):
    """Two real engine hosts, one front end linked to both: requests alternate between them while each holds its
    batch for the queue delay (the fewest outstanding first), so each engine runs half of them; a replica whose
    queue this front end was told is full gets none."""
    from bertzoo.serving.config import BatchSettings
    from bertzoo.serving.engine_link import open_replicas
    from conftest import serve_config

    _, artifact = tiny_artifact
    work = [Work("sentiment", (Encoding([101, 7, 102], [0, 0, 0]),))]
    config = serve_config(artifact, batch=BatchSettings(max_queue_delay_ms=300), warmup=False)

    async def main() -> tuple[list[float], list[float]]:
        engines = [await _engine_with_links(config, tmp_path / f"e{k}", 0) for k in range(2)]
        links = [EngineLink(f"ipc://{tmp_path / f'e{k}' / 'engine.sock'}", config) for k in range(2)]
        lanes = await open_replicas(links)

        def rows() -> list[float]:
            return [metrics.registry.get_sample_value("bertzoo_batch_size_sum", {"lane": "main"}) or 0.0
                    for _, _, _, metrics, _ in engines]

        await asyncio.wait_for(asyncio.gather(*(lanes.main.submit(work, 5.0).future for _ in range(6))), 10)
        spread = rows()
        links[1]._waiting["main"] = config.batch.max_queue  # as if replica 2 had said its queue is full
        await asyncio.wait_for(asyncio.gather(*(lanes.main.submit(work, 5.0).future for _ in range(4))), 10)
        after_full = rows()
        await lanes.close()
        for *_, stop in engines:
            await stop()
        return spread, after_full

    (tmp_path / "e0").mkdir()
    (tmp_path / "e1").mkdir()
    spread, after_full = asyncio.run(main())
    assert spread == [3.0, 3.0]
    assert after_full == [7.0, 3.0]
