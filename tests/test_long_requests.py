"""Long requests through the real server: a request over --max-request-tokens is refused naming the flag, one over
--long-request-tokens runs in the long-request lane (its own engine, a few QA windows per batch) while short requests
pass it, its answer equals the main lane's, and its work stops between batches once its deadline has passed."""

from __future__ import annotations

import time

import grpc
import pytest

from bertzoo.serving.client import BertzooClient, channel_options
from bertzoo.serving.config import BatchSettings
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.serving.model import load_served_model
from bertzoo.serving.proto import pb2
from conftest import ControlledBackend, serve_config

# The tiny artifact's QA windows are 128 tokens: batches of 512 tokens hold 4 of them.
BATCH = BatchSettings(max_batch_tokens=512)
LONG_TOKENS = 600  # about 5 windows
MAX_TOKENS = 6000


@pytest.fixture(scope="module")
def lanes(tiny_artifact):
    """(client, main engine, long-lane engine) of a server whose long lane is easy to reach."""
    _, artifact = tiny_artifact
    engines: dict[str, ControlledBackend] = {}  # "main", "long"

    def loader(config):
        served = load_served_model(config)
        engines["main"] = served.backend = ControlledBackend(served.backend)
        make_spare = served.spare_backend
        assert make_spare is not None  # ONNX Runtime on the CPU: the long lane has its own engine

        def spare():
            engines["long"] = ControlledBackend(make_spare())
            return engines["long"]

        served.spare_backend = spare
        return served

    config = serve_config(artifact, batch=BATCH, long_request_tokens=LONG_TOKENS, max_request_tokens=MAX_TOKENS)
    with ServerThread(config, loader) as running, \
            BertzooClient(f"127.0.0.1:{running.port}", options=channel_options(retries=False)) as client:
        yield client, engines["main"], engines["long"]


@pytest.fixture
def engines(lanes):
    client, main, long = lanes
    for engine in (main, long):
        engine.delay = 0.0
        engine.batch_rows.clear()
        engine.batch_shapes.clear()
    return client, main, long


def passes(engine: ControlledBackend) -> list[tuple[int, int]]:
    """(rows, width) of every encoder pass the engine ran."""
    return [tuple(shape) for shape, _ in engine.batch_shapes]


def long_context(words: int) -> str:
    return " ".join(f"word{i % 50} is here." for i in range(words // 3))


QUESTION = "what is here?"


def test_a_request_over_the_cost_limit_is_refused_naming_the_flag(engines):
    client, main, long = engines
    with pytest.raises(grpc.RpcError) as error:
        client.qa([(QUESTION, long_context(3000))] * 4)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_request_tokens" in error.value.details() and str(MAX_TOKENS) in error.value.details()
    assert not passes(main) and not passes(long)  # refused before any compute


def test_short_requests_pass_a_long_one_that_runs_in_its_own_lane(engines):
    client, main, long = engines
    long.delay = 0.2  # each long-lane batch takes a while
    qa = client.stub.QA.future(pb2.QARequest(items=[pb2.QAItem(question=QUESTION, context=long_context(900))]),
                               timeout=60)
    while not passes(long):
        time.sleep(0.005)
    for i in range(5):
        assert len(client.sentiment([f"short request {i}"]).results) == 1
    assert not qa.done()  # every short request was answered while the long one was still running
    assert len(qa.result().results) == 1
    assert len(passes(long)) > 2 and all(rows * width <= BATCH.max_batch_tokens for rows, width in passes(long))
    assert all(width <= 16 for _, width in passes(main))  # no QA window ever ran in the main lane


def test_a_long_answer_equals_the_main_lanes(engines, tiny_artifact):
    client, _, long = engines
    items = [(QUESTION, long_context(900)), ("which word?", long_context(200))]
    answers = client.qa(items).results
    assert passes(long)
    _, artifact = tiny_artifact
    config = serve_config(artifact, long_request_tokens=MAX_TOKENS)  # everything in the main lane, whole
    with ServerThread(config) as running, BertzooClient(f"127.0.0.1:{running.port}") as whole:
        expected = whole.qa(items).results
    assert [(a.answer, a.start_char, a.end_char, a.no_answer) for a in answers] == \
           [(a.answer, a.start_char, a.end_char, a.no_answer) for a in expected]
    scores = [x for a in answers for x in (a.score, a.null_score)]
    assert scores == pytest.approx([x for a in expected for x in (a.score, a.null_score)], abs=1e-4)


def test_a_long_request_past_its_deadline_stops_between_batches(engines):
    client, _, long = engines
    long.delay = 0.3
    items = [(QUESTION, long_context(1500))]  # about 20 windows: 5 batches
    with pytest.raises(grpc.RpcError) as error:
        client.qa(items, timeout=0.45)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(1.5)  # ample time for the rest of the batches, had they run
    assert 1 <= len(passes(long)) <= 2  # the batch cut ahead of time, due after the deadline, did not run


def test_a_big_batch_hands_the_arena_back_and_a_small_one_keeps_it(tiny_artifact):
    """ONNX Runtime's CPU arena keeps the largest block any batch needed: after a batch over ARENA_KEEP_CELLS the
    engine asks it to shrink (one worst-case input must not leave the server holding gigabytes), and memory patterns
    (one planned block per input shape) are off."""
    import numpy as np

    from bertzoo.serving.backends import create_backend
    from bertzoo.serving.backends.ort import ARENA_KEEP_CELLS

    _, artifact = tiny_artifact
    backend = create_backend("onnxruntime", artifact, threads=1)
    assert not backend._encoder.get_session_options().enable_mem_pattern
    seen = []
    real_run = backend._encoder.run
    backend._encoder = type("Recorder", (), {"run": lambda self, out, feed, options=None: (
        seen.append(options), real_run(out, feed, options))[1]})()

    def batch(rows: int, width: int) -> dict:
        ids = np.full((rows, width), 5, dtype=np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}

    backend.encode(batch(2, 16))
    rows = ARENA_KEEP_CELLS // (128 * 128) + 1
    backend.encode(batch(rows, 128))
    assert seen[0] is None
    assert seen[1] is not None and seen[1].get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
