"""The streaming RPCs (SentimentStream, ...): the same answers as the unary RPCs, one per request and in request order,
a failed request answered in its place while the stream goes on, a malformed message ending the stream, at most
``stream_window`` requests of one stream in the server at a time, and the load generator's stream mode."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from bertzoo.datafiles import load_split, samples_dir
from bertzoo.serving.client import AsyncBertzooClient, BertzooClient
from bertzoo.serving.config import ServeConfig
from bertzoo.serving.errors import QueueFull
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.serving.load import run_load
from bertzoo.serving.metrics import Metrics
from bertzoo.serving.proto import pb2
from bertzoo.serving.servicer import BertzooServicer
from conftest import serve_config


@pytest.fixture(scope="module")
def served(tiny_artifact):
    _, artifact = tiny_artifact
    with ServerThread(serve_config(artifact)) as running, \
            BertzooClient(f"127.0.0.1:{running.port}", timeout=30) as client:
        yield running, client


def answers(client: BertzooClient, method: str, requests: list) -> list:
    """Every message of one stream carrying ``requests``."""
    return list(client.stream(method, iter(requests), timeout=60))


def test_each_stream_answers_what_its_unary_rpc_answers_in_request_order(served):
    _, client = served
    texts = [e.text for e in load_split(samples_dir(), "sentiment", "dev")[:12]]
    pairs = [(e.text_a, e.text_b) for e in load_split(samples_dir(), "similarity", "dev")[:6]]
    questions = [(e.question, e.context) for e in load_split(samples_dir(), "qa", "dev")[:4]]
    # Each case: what must be equal, and the numbers that must agree up to float rounding (a stream's requests are
    # batched with other neighbours than the unary calls').
    cases = [
        ("Sentiment", [pb2.SentimentRequest(texts=[t]) for t in texts] + [pb2.SentimentRequest(texts=texts[:3])],
         lambda r: [x.label for x in r.results], lambda r: [list(x.probabilities) for x in r.results]),
        ("Embed", [pb2.EmbedRequest(texts=[t]) for t in texts],
         lambda r: r.dimensions, lambda r: [list(e.values) for e in r.embeddings]),
        ("Paraphrase", [pb2.ParaphraseRequest(pairs=[pb2.TextPair(text_a=a, text_b=b)]) for a, b in pairs],
         lambda r: len(r.results), lambda r: [x.probability for x in r.results]),
        ("Similarity", [pb2.SimilarityRequest(pairs=[pb2.TextPair(text_a=a, text_b=b)]) for a, b in pairs],
         lambda r: len(r.results), lambda r: [x.score for x in r.results]),
        ("QA", [pb2.QARequest(items=[pb2.QAItem(question=q, context=c)]) for q, c in questions],
         lambda r: [(x.answer, x.start_char, x.end_char, x.no_answer) for x in r.results],
         lambda r: [(x.score, x.null_score) for x in r.results]),
    ]
    for method, requests, exact, numbers in cases:
        streamed = answers(client, method, requests)
        assert len(streamed) == len(requests), method
        for request, message in zip(requests, streamed, strict=True):
            assert message.WhichOneof("result") == "response", (method, message)
            unary = client.call(method, request)
            assert exact(message.response) == exact(unary), method
            np.testing.assert_allclose(np.asarray(numbers(message.response), dtype=float),
                                       np.asarray(numbers(unary), dtype=float), atol=1e-4 if method == "QA" else 1e-5)
            assert message.response.timing.total_seconds > 0


def test_a_failed_request_is_answered_in_its_place_and_the_stream_goes_on(served):
    running, client = served
    requests = [pb2.SentimentRequest(texts=["fine"]), pb2.SentimentRequest(texts=["fine", "   "]),
                pb2.SentimentRequest(texts=[]), pb2.SentimentRequest(texts=["still fine"])]
    before = running.metrics.registry.get_sample_value(
        "bertzoo_request_failures_total",
        {"task": "sentiment", "code": "INVALID_ARGUMENT", "reason": "empty_text", "protocol": "grpc"}) or 0
    streamed = answers(client, "Sentiment", requests)
    assert [m.WhichOneof("result") for m in streamed] == ["response", "error", "error", "response"]
    # the same code and message as the unary RPC's status
    assert (streamed[1].error.code, streamed[1].error.message) == ("INVALID_ARGUMENT", "texts[1] is empty")
    assert (streamed[2].error.code, streamed[2].error.message) == ("INVALID_ARGUMENT", "texts: no items; send 1 to 64")
    assert len(streamed[3].response.results) == 1
    # each request of a stream is counted as a request of its task
    assert running.metrics.registry.get_sample_value(
        "bertzoo_request_failures_total",
        {"task": "sentiment", "code": "INVALID_ARGUMENT", "reason": "empty_text", "protocol": "grpc"}) == before + 1


def test_a_malformed_message_ends_the_stream_with_invalid_argument_without_a_traceback(served, caplog):
    running, client = served
    good = pb2.EmbedRequest(texts=["fine"]).SerializeToString()
    call = client.channel.stream_stream("/bertzoo.v1.Bertzoo/EmbedStream",
                                        response_deserializer=pb2.EmbedStreamResponse.FromString)
    with caplog.at_level(logging.DEBUG):
        responses = call(iter([good, b"\xff\xff\xff", good]), timeout=30)
        first = next(responses)
        with pytest.raises(grpc.RpcError) as error:
            next(responses)
    assert first.WhichOneof("result") == "response"
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid message" in error.value.details()
    assert running.metrics.registry.get_sample_value(
        "bertzoo_request_failures_total",
        {"task": "embed", "code": "INVALID_ARGUMENT", "reason": "malformed", "protocol": "grpc"}) == 1
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert client.embed(["the server goes on"]).dimensions > 0


def test_the_load_generator_drives_streams(served):
    running, _ = served
    report = asyncio.run(run_load(f"127.0.0.1:{running.port}", "sentiment", ["a fine film", "a dull one"],
                                  concurrency=3, duration=None, requests=20, stream=True))
    summary = report.summary()
    assert summary["ok"] == 20 and summary["errors"] == {} and summary["stream"] is True


def test_each_load_client_has_a_connection_of_its_own():
    """N clients of the load generator are N TCP connections, as N users (and an HTTP peer's load) would be."""
    from bertzoo.serving.proto import pb2_grpc

    peers = set()

    class PeerRecorder(pb2_grpc.BertzooServicer):
        async def Sentiment(self, request, context):
            peers.add(context.peer())  # "ipv4:127.0.0.1:<the client's port>": one per connection
            return pb2.SentimentResponse()

    async def load() -> dict:
        server = grpc.aio.server()
        pb2_grpc.add_BertzooServicer_to_server(PeerRecorder(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            report = await run_load(f"127.0.0.1:{port}", "sentiment", ["a fine film"], concurrency=4, duration=None,
                                    requests=40)
            return report.summary()
        finally:
            await server.stop(None)

    assert asyncio.run(load())["ok"] == 40
    assert len(peers) == 4


class SlowService:
    """A TaskService stand-in whose sentiment answers when the test says so, counting the requests it holds."""

    spec = SimpleNamespace(labels={"sentiment": ["negative", "positive"]})

    def __init__(self) -> None:
        self.held = 0
        self.most_held = 0
        self.release: dict[str, asyncio.Event] = {}

    async def sentiment(self, texts, timeout):
        self.held += 1
        self.most_held = max(self.most_held, self.held)
        if texts[0] == "full":
            self.held -= 1
            raise QueueFull("the server's queue is full (256 requests waiting); retry later")
        event = self.release.setdefault(texts[0], asyncio.Event())
        await event.wait()
        self.held -= 1
        return [], None


class FakeContext:
    def time_remaining(self) -> float | None:
        return None


class Aborted(Exception):
    pass


class AbortingContext(FakeContext):
    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise Aborted(code, message)


def test_a_drain_ends_a_stream_whose_reader_never_ran(monkeypatch):
    """A drain that comes between a stream's start and its reader's first step still ends the stream: its reader's
    end is signalled by a callback, which a task cancelled before it ran also calls."""
    service = SlowService()
    servicer = BertzooServicer(lambda: service, ServeConfig("unused"), Metrics(), {})

    async def scenario() -> None:
        async def requests():
            await asyncio.Event().wait()  # a client that has sent nothing yet
            yield pb2.SentimentRequest(texts=["never"])

        stream = servicer.SentimentStream(requests(), AbortingContext())
        first = asyncio.ensure_future(stream.__anext__())
        while not servicer._stream_readers:  # the generator ran up to its first await: the reader exists, unstarted
            await asyncio.sleep(0)
        assert servicer.drain_streams() == 1
        with pytest.raises(Aborted) as ended:
            await asyncio.wait_for(first, 5)
        assert ended.value.args[0] == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())
    assert servicer.drain_streams() == 0  # nothing left open


def test_a_stream_holds_at_most_its_window_and_answers_in_request_order(monkeypatch):
    """Requests finish in reverse order; their answers still come back in request order, and no more than
    ``stream_window`` of them are in the server at a time."""
    service = SlowService()
    servicer = BertzooServicer(lambda: service, ServeConfig("unused", stream_window=3), Metrics(), {})
    monkeypatch.setattr("bertzoo.serving.servicer._timing", lambda timing: pb2.Timing())

    async def scenario() -> list:
        texts = [f"t{i}" for i in range(6)] + ["full"]

        async def requests():
            for text in texts:
                yield pb2.SentimentRequest(texts=[text])

        got: list = []

        async def consume():
            async for message in servicer.SentimentStream(requests(), FakeContext()):
                got.append(message)

        consumer = asyncio.create_task(consume())
        for text in reversed(texts[:-1]):  # the later requests finish first
            for _ in range(20):
                await asyncio.sleep(0)
            assert service.held <= 3
            service.release.setdefault(text, asyncio.Event()).set()
        await asyncio.wait_for(consumer, 10)
        return got

    got = asyncio.run(scenario())
    assert service.most_held == 3
    assert [m.WhichOneof("result") for m in got] == ["response"] * 6 + ["error"]
    assert got[-1].error.code == "RESOURCE_EXHAUSTED"


def test_a_stream_needs_the_token_as_a_call_does(tiny_artifact):
    _, artifact = tiny_artifact
    request = pb2.SentimentRequest(texts=["fine"])
    with ServerThread(serve_config(artifact, auth_token="s3cret-token")) as running:
        target = f"127.0.0.1:{running.port}"
        with BertzooClient(target) as anonymous, pytest.raises(grpc.RpcError) as error:
            answers(anonymous, "Sentiment", [request])
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with BertzooClient(target, token="s3cret-token") as client:
            assert [m.WhichOneof("result") for m in answers(client, "Sentiment", [request] * 3)] == ["response"] * 3


def test_a_draining_replica_ends_its_streams_at_once_after_answering_what_they_sent(tiny_artifact):
    _, artifact = tiny_artifact
    running = ServerThread(serve_config(artifact, shutdown_grace=20.0)).__enter__()
    seen: list[tuple[str, str]] = []
    sent = 0

    def requests():
        nonlocal sent
        for i in range(10_000):
            sent += 1
            yield pb2.SentimentRequest(texts=[f"text {i}"])
            time.sleep(0.02)

    def consume() -> None:
        with BertzooClient(f"127.0.0.1:{running.port}") as client:
            try:
                for message in client.stream("Sentiment", requests(), timeout=60):
                    seen.append((message.WhichOneof("result"), ""))
            except grpc.RpcError as e:
                seen.append((e.code().name, e.details()))

    def open_streams() -> float:
        return running.metrics.registry.get_sample_value("bertzoo_open_streams", {"task": "sentiment"})

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    while len(seen) < 3:
        time.sleep(0.02)
    assert open_streams() == 1
    stop_began = time.monotonic()
    running.__exit__(None, None, None)  # SIGTERM's path: drain, then stop
    consumer.join(30)
    assert time.monotonic() - stop_began < 10  # the stream did not hold the replica for its 20 s grace
    assert seen[-1][0] == "UNAVAILABLE" and "shutting down" in seen[-1][1], seen[-3:]
    assert {kind for kind, _ in seen[:-1]} == {"response"}  # every request taken was answered, none cut
    # It ended long before the client ran out of requests; which of them to send again is the ones after the answers
    # (none, when the drain came between two sends).
    assert len(seen) - 1 <= sent < 10_000
    assert open_streams() == 0


def test_stream_all_carries_on_on_another_replica_when_its_replica_drains(tiny_artifact):
    _, artifact = tiny_artifact
    texts = [e.text for e in load_split(samples_dir(), "sentiment", "dev")[:10]]
    requests = [pb2.SentimentRequest(texts=[texts[i % len(texts)]]) for i in range(600)]
    replicas = [ServerThread(serve_config(artifact)).__enter__() for _ in range(2)]
    target = "ipv4:" + ",".join(f"127.0.0.1:{r.port}" for r in replicas)
    got: list = []

    def consume() -> None:
        with BertzooClient(target) as client:
            for message in client.stream_all("Sentiment", requests, timeout=60):
                got.append(message)
                time.sleep(0.002)  # a slow reader: the stream is still open when its replica drains

    def served(replica: ServerThread) -> float:
        return replica.metrics.registry.get_sample_value(
            "bertzoo_requests_total", {"task": "sentiment", "code": "OK", "protocol": "grpc"}) or 0.0

    try:
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        while len(got) < 60:
            time.sleep(0.01)
        streaming = [r for r in replicas if r.metrics.registry.get_sample_value(
            "bertzoo_open_streams", {"task": "sentiment"}) == 1]
        assert len(streaming) == 1
        drained, other = streaming[0], next(r for r in replicas if r is not streaming[0])
        drained.__exit__(None, None, None)
        consumer.join(60)
        assert not consumer.is_alive()
        assert served(drained) < len(requests) and served(other) > 0  # the rest went to the other replica
        assert len(got) == len(requests) and {m.WhichOneof("result") for m in got} == {"response"}
        with BertzooClient(f"127.0.0.1:{other.port}") as client:
            labels = {text: client.sentiment([text]).results[0].label for text in texts}
        assert [m.response.results[0].label for m in got] == [labels[r.texts[0]] for r in requests]  # in order
    finally:
        for replica in replicas:
            replica.__exit__(None, None, None)


def test_the_asyncio_clients_stream_all_answers_every_request_in_order(served):
    running, _ = served
    texts = ["a lovely film", "a dull film", "fine"]

    async def scenario() -> list:
        async with AsyncBertzooClient(f"127.0.0.1:{running.port}") as client:
            return [m async for m in client.stream_all("Sentiment", [pb2.SentimentRequest(texts=[t]) for t in texts])]

    got = asyncio.run(scenario())
    with BertzooClient(f"127.0.0.1:{running.port}") as client:
        assert [m.response.results[0].label for m in got] == [client.sentiment([t]).results[0].label for t in texts]
