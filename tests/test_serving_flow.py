"""Requests under load through the real server, with a backend the tests can slow down or break: concurrent requests
share encoder batches, a full queue refuses at once, expired and cancelled requests never reach the model, and a
failing batch fails only its own requests."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from bertzoo.serving.client import BertzooClient, channel_options
from bertzoo.serving.config import BatchSettings
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.serving.model import load_served_model
from bertzoo.serving.proto import pb2
from conftest import ControlledBackend, serve_config

MAX_QUEUE = 6


@pytest.fixture(scope="module")
def controlled_server(tiny_artifact):
    _, artifact = tiny_artifact
    backends: list[ControlledBackend] = []

    def loader(config):
        served = load_served_model(config)
        served.backend = ControlledBackend(served.backend)
        backends.append(served.backend)
        return served

    config = serve_config(artifact, batch=BatchSettings(max_queue=MAX_QUEUE))
    # No client retries: these tests check what the server answers the first time.
    with ServerThread(config, loader) as running, \
            BertzooClient(f"127.0.0.1:{running.port}", options=channel_options(retries=False)) as client:
        yield running, client, backends[0]


@pytest.fixture
def controlled(controlled_server):
    running, client, backend = controlled_server
    backend.delay, backend.fail_next = 0.0, False
    backend.batch_rows.clear()
    backend.batch_shapes.clear()
    yield running, client, backend
    backend.delay = 0.0


def sample(running, name: str, **labels) -> float:
    return running.metrics.registry.get_sample_value(name, labels or None) or 0.0


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def request(*texts: str) -> pb2.SentimentRequest:
    return pb2.SentimentRequest(texts=list(texts))


def test_concurrent_requests_share_encoder_batches(controlled):
    running, client, backend = controlled
    backend.delay = 0.05
    batches_before = sample(running, "bertzoo_batch_size_count", lane="main")
    rows_before = sample(running, "bertzoo_batch_size_sum", lane="main")
    calls = [client.stub.Sentiment.future(request(f"sentence {i}", f"another {i}"), timeout=30) for i in range(5)]
    assert all(len(call.result().results) == 2 for call in calls)
    batches = sample(running, "bertzoo_batch_size_count", lane="main") - batches_before
    assert sample(running, "bertzoo_batch_size_sum", lane="main") - rows_before == 10  # every sentence encoded once
    assert batches < 5 and len(backend.batch_rows) == batches and max(backend.batch_rows) > 2


def test_a_batch_holds_sequences_of_one_padded_width(controlled):
    """Short and long sentences queued together go into separate batches: no row is padded by 8 tokens or more
    (the artifact's length buckets alone would put 19 and 32 tokens in one batch)."""
    running, client, backend = controlled
    backend.delay = 0.3
    blocker = client.stub.Sentiment.future(request("occupies the model"), timeout=30)
    wait_for(lambda: len(backend.batch_rows) == 1)  # everything sent from now on queues behind it
    texts = [" ".join(["word"] * n) for n in (2, 30, 3, 17, 2, 31)]
    calls = [client.stub.Sentiment.future(request(text), timeout=30) for text in texts]
    assert all(len(call.result().results) == 1 for call in [blocker, *calls])
    queued = backend.batch_shapes[1:]
    lengths = sorted(n for _, rows in queued for n in rows)
    assert lengths == [4, 4, 5, 19, 32, 33]
    for (rows, width), real in queued:
        assert rows == len(real) and width - min(real) < 8, (width, real)


def send_one_by_one(running, client, texts: list[str], handled_before: float) -> list:
    """A call per text, each sent once the server handles the one before (the in-flight gauge counts it): the first
    is cut ahead as the next batch on its own, and the rest wait in the queue behind it."""
    calls = []
    for text in texts:
        calls.append(client.stub.Sentiment.future(request(text), timeout=30))
        handled = handled_before + len(calls)
        wait_for(lambda n=handled: sample(running, "bertzoo_inflight_requests") == n)
    return calls


def test_a_full_queue_answers_resource_exhausted_at_once(controlled):
    running, client, backend = controlled
    backend.delay = 1.0  # ample time to fill the queue behind the running batch and the one cut ahead
    running_call = client.stub.Sentiment.future(request("occupies the model"), timeout=30)
    wait_for(lambda: backend.batch_rows)
    queued = send_one_by_one(running, client, ["cut ahead", *(f"waits {i}" for i in range(MAX_QUEUE))], 1)
    wait_for(lambda: sample(running, "bertzoo_queue_depth", lane="main") == MAX_QUEUE)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        client.sentiment(["one too many"])
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue is full" in error.value.details()
    assert time.monotonic() - started < 0.5  # refused at once, not after waiting for the model
    assert running_call.result().results and all(call.result().results for call in queued)
    assert sample(running, "bertzoo_request_failures_total", protocol="grpc", task="sentiment", code="RESOURCE_EXHAUSTED",
                  reason="queue_full") >= 1


def test_a_request_past_its_deadline_is_dropped_before_compute(controlled):
    running, client, backend = controlled
    backend.delay = 1.5
    before = sample(running, "bertzoo_request_failures_total", protocol="grpc", task="sentiment", code="DEADLINE_EXCEEDED",
                    reason="deadline")
    first = client.stub.Sentiment.future(request("occupies the model"), timeout=30)
    wait_for(lambda: backend.batch_rows)
    # A deadline long enough for the request to reach the server's queue even on a loaded machine (a shorter one
    # can pass before the server has seen the call, which then never counts it), short enough to pass there.
    with pytest.raises(grpc.RpcError) as error:
        client.sentiment(["too late"], timeout=0.6)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    first.result()
    wait_for(lambda: sample(running, "bertzoo_request_failures_total", protocol="grpc", task="sentiment",
                            code="DEADLINE_EXCEEDED", reason="deadline") == before + 1)
    time.sleep(0.05)
    assert backend.batch_rows == [1]  # only the first request ever reached the model
    assert sample(running, "bertzoo_queue_depth", lane="main") == 0


def test_a_cancelled_request_is_dropped_before_compute(controlled):
    running, client, backend = controlled
    backend.delay = 1.0  # ample time to cancel while the first batch runs
    before = sample(running, "bertzoo_request_failures_total", protocol="grpc", task="sentiment", code="CANCELLED",
                    reason="cancelled")
    first = client.stub.Sentiment.future(request("occupies the model"), timeout=30)
    wait_for(lambda: backend.batch_rows)
    [ahead] = send_one_by_one(running, client, ["cut ahead"], 1)
    cancelled = client.stub.Sentiment.future(request("never mind", "me neither"), timeout=30)
    wait_for(lambda: sample(running, "bertzoo_queue_sequences", lane="main") == 2)
    assert cancelled.cancel()
    # out of the queue before the model is free
    wait_for(lambda: sample(running, "bertzoo_queue_sequences", lane="main") == 0)
    first.result()
    ahead.result()
    wait_for(lambda: sample(running, "bertzoo_request_failures_total", protocol="grpc", task="sentiment", code="CANCELLED",
                            reason="cancelled") == before + 1)
    assert backend.batch_rows == [1, 1]  # the first request and the one cut ahead; never the cancelled two


def test_a_backend_failure_fails_only_its_batch_with_internal(controlled):
    running, client, backend = controlled
    backend.fail_next = True
    with pytest.raises(grpc.RpcError) as error:
        client.paraphrase([("a", "b")])
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert "the model failed on this request's batch" in error.value.details()
    assert client.paraphrase([("a", "b")]).results and client.health() == "SERVING"
    assert sample(running, "bertzoo_request_failures_total", protocol="grpc", task="paraphrase", code="INTERNAL",
                  reason="backend") == 1


def test_short_requests_tokenize_on_the_event_loop_long_ones_on_the_tokenizer_thread(controlled, monkeypatch):
    from bertzoo.serving import tasks_service
    from bertzoo.tokenization import Tokenizer

    _, client, _ = controlled
    threads: list[str] = []
    encode = Tokenizer.encode_sentences

    def recording(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "encode_sentences", recording)
    client.sentiment(["short and sweet"])
    long_text = "a long review " * (tasks_service.INLINE_TOKENIZE_CHARS // 14 + 1)
    assert len(long_text) > tasks_service.INLINE_TOKENIZE_CHARS
    client.sentiment([long_text])
    assert len(threads) == 2
    assert not threads[0].startswith("bertzoo-tokenize")
    assert threads[1].startswith("bertzoo-tokenize")
