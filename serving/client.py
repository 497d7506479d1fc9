"""Python clients for the bertzoo gRPC server, synchronous (``bertzoo client`` uses it) and asyncio::

    with BertzooClient("localhost:50051") as client:
        client.wait_ready()
        response = client.sentiment(["a lovely film", "a dull film"])
        print([r.label for r in response.results], response.timing.total_seconds)

    async with AsyncBertzooClient("localhost:50051") as client:
        await client.wait_ready()
        response = await client.sentiment(["a lovely film"])

Many small requests cost the server (and the client) far less over one stream than as separate calls::

    requests = (pb2.SentimentRequest(texts=[text]) for text in texts)
    for message in client.stream("Sentiment", requests):  # one answer per request, in order
        print(message.error.message if message.WhichOneof("result") == "error" else message.response.results[0].label)

``client.stream_all("Sentiment", list_of_requests)`` does the same and carries on where a stream ends because its
replica drains or restarts: the unanswered requests go again on a new stream, which the channel sends elsewhere.

Methods return the protobuf responses of protos/bertzoo/v1/bertzoo.proto; errors raise ``grpc.RpcError`` with the
server's status code and message (``error.code()``, ``error.details()``). Channels get :func:`channel_options`:
gRPC's own retries with backoff for UNAVAILABLE, RESOURCE_EXHAUSTED and CANCELLED (a restarting replica, a full
queue, a call caught by a replica's shutdown), keepalive pings, and no 4 MiB cap on what is sent. TLS can carry a
client certificate (mTLS). The channel's options and credentials are ``client_channel.py``'s, ``bertzoo client
health``'s exit codes ``health_probe.py``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .client_channel import PemSource, auth_metadata, channel_credentials, channel_options
from .proto import pb2, pb2_grpc

# A stream that ends with one of these lost its replica (draining, restarting, or cut when its shutdown grace ran
# out): another replica can answer what it left unanswered.
STREAM_RESUMABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


class _Resumption:
    """Where :meth:`BertzooClient.stream_all` is in its requests, and whether a broken stream is worth another."""

    def __init__(self, method: str, requests: Sequence, attempts: int) -> None:
        self.method, self.requests, self.attempts = method, requests, attempts
        self.answered = 0
        self.failures = 0  # streams in a row that answered nothing
        self.progressed = False

    @property
    def done(self) -> bool:
        return self.answered >= len(self.requests)

    def start(self) -> Iterator:
        """The requests for a new stream: those not answered yet."""
        self.progressed = False
        return iter(self.requests[self.answered:])

    def answered_one(self) -> None:
        self.answered, self.progressed = self.answered + 1, True

    def check_complete(self) -> None:
        if not self.done:
            raise RuntimeError(f"{self.method}Stream ended with {self.answered} of {len(self.requests)} requests "
                               "answered")

    def wait_after(self, error: grpc.RpcError) -> float:
        """Seconds to wait before the next stream; re-raises ``error`` when there is to be none."""
        self.failures = 0 if self.progressed else self.failures + 1
        if error.code() not in STREAM_RESUMABLE or self.failures >= self.attempts:
            raise error
        return min(2.0, 0.1 * 2 ** self.failures)


class BertzooClient:
    """The synchronous client: each method returns the response."""

    def __init__(self, target: str, *, token: str | None = None, tls: bool = False,
                 root_certificates: PemSource = None, certificate_chain: PemSource = None,
                 private_key: PemSource = None, timeout: float | None = 30.0,
                 options: Sequence[tuple[str, object]] | None = None) -> None:
        """``target``: host:port. ``token``: sent as ``authorization: Bearer <token>``. ``certificate_chain`` and
        ``private_key``: the client's certificate for servers that require one (mTLS). ``timeout``: the default
        deadline of every call, in seconds (None: no deadline). ``options``: gRPC channel options (default:
        :func:`channel_options`)."""
        credentials = channel_credentials(tls, root_certificates, certificate_chain, private_key)
        options = list(channel_options() if options is None else options)
        self.channel = self._channel(target, credentials, options)
        self.stub = pb2_grpc.BertzooStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._metadata = auth_metadata(token)
        self.timeout = timeout

    @staticmethod
    def _channel(target: str, credentials: grpc.ChannelCredentials | None, options: list):
        if credentials is None:
            return grpc.insecure_channel(target, options=options)
        return grpc.secure_channel(target, credentials, options=options)

    def _call(self, method, request, timeout: float | None):
        return method(request, timeout=self.timeout if timeout is None else timeout, metadata=self._metadata)

    def call(self, method: str, request, timeout: float | None = None):
        """Any RPC of bertzoo.v1.Bertzoo by name (``"Sentiment"``), with this client's token and deadline."""
        return self._call(getattr(self.stub, method), request, timeout)

    def stream(self, method: str, requests: Iterable | AsyncIterable | None = None, timeout: float | None = None):
        """The streaming twin of a task RPC, by the unary RPC's name (``"Sentiment"`` opens ``SentimentStream``):
        the call, which yields one message per request, in order, each holding ``response`` or ``error``
        (``message.WhichOneof("result")``). ``requests``: the request messages (with the asyncio client, an
        (async) iterable, or None to ``await call.write(...)`` them and ``await call.done_writing()``).
        ``timeout``: seconds for the whole stream; None (the default): no deadline, unlike unary calls."""
        rpc = getattr(self.stub, f"{method}Stream")
        return rpc(*(() if requests is None else (requests,)), timeout=timeout, metadata=self._metadata)

    def stream_all(self, method: str, requests: Sequence, attempts: int = 4, timeout: float | None = None
                   ) -> Iterator:
        """Every request of ``requests`` answered over streams of ``method``, one message per request, in order, as
        :meth:`stream` yields them. When a stream ends UNAVAILABLE or CANCELLED (its replica drains or restarts), the
        requests it had not answered go again on a new stream, which the channel gives to another replica where it
        has one (the server ends a draining replica's streams once it has answered what it read). It waits 0.1 s
        before a new stream after one that answered some, else 0.2, 0.4, ... s, and gives up, raising the last
        stream's error, after ``attempts`` streams in a row that answered nothing. ``requests``: a sequence (kept
        until every one is answered). ``timeout``: seconds for each stream."""
        resume = _Resumption(method, requests, attempts)
        while not resume.done:
            call = self.stream(method, resume.start(), timeout)
            try:
                for message in call:
                    resume.answered_one()
                    yield message
                resume.check_complete()
            except grpc.RpcError as e:
                time.sleep(resume.wait_after(e))
            finally:
                call.cancel()  # a no-op once the stream ended; stops it when the caller stops reading early

    def sentiment(self, texts: Sequence[str], timeout: float | None = None) -> pb2.SentimentResponse:
        return self._call(self.stub.Sentiment, pb2.SentimentRequest(texts=texts), timeout)

    def paraphrase(self, pairs: Sequence[tuple[str, str]], timeout: float | None = None) -> pb2.ParaphraseResponse:
        request = pb2.ParaphraseRequest(pairs=[pb2.TextPair(text_a=a, text_b=b) for a, b in pairs])
        return self._call(self.stub.Paraphrase, request, timeout)

    def similarity(self, pairs: Sequence[tuple[str, str]], timeout: float | None = None) -> pb2.SimilarityResponse:
        request = pb2.SimilarityRequest(pairs=[pb2.TextPair(text_a=a, text_b=b) for a, b in pairs])
        return self._call(self.stub.Similarity, request, timeout)

    def qa(self, items: Sequence[tuple[str, str]], timeout: float | None = None) -> pb2.QAResponse:
        """``items``: (question, context) pairs."""
        request = pb2.QARequest(items=[pb2.QAItem(question=q, context=c) for q, c in items])
        return self._call(self.stub.QA, request, timeout)

    def embed(self, texts: Sequence[str], timeout: float | None = None) -> pb2.EmbedResponse:
        return self._call(self.stub.Embed, pb2.EmbedRequest(texts=texts), timeout)

    def model_info(self, timeout: float | None = None) -> pb2.ModelInfoResponse:
        return self._call(self.stub.ModelInfo, pb2.ModelInfoRequest(), timeout)

    def health(self, service: str = "", timeout: float | None = None) -> str:
        """The health status name: SERVING, NOT_SERVING, ... (needs no token)."""
        response = self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                      timeout=self.timeout if timeout is None else timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> None:
        """Block until health reports SERVING (the model is loaded and warmed up); TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                last = self.health(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                if last == "SERVING":
                    return
            except grpc.RpcError as e:
                last = e.code().name
            time.sleep(interval)
        raise TimeoutError(f"the server was not SERVING after {timeout} s (last: {last})")

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> BertzooClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncBertzooClient(BertzooClient):
    """The asyncio client: the same methods (``sentiment``, ``qa``, ``embed``, ...) return awaitables."""

    @staticmethod
    def _channel(target: str, credentials: grpc.ChannelCredentials | None, options: list):
        if credentials is None:
            return grpc.aio.insecure_channel(target, options=options)
        return grpc.aio.secure_channel(target, credentials, options=options)

    async def health(self, service: str = "", timeout: float | None = None) -> str:  # type: ignore[override]
        response = await self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                            timeout=self.timeout if timeout is None else timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    async def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> None:  # type: ignore[override]
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                last = await self.health(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                if last == "SERVING":
                    return
            except grpc.RpcError as e:
                last = e.code().name
            await asyncio.sleep(interval)
        raise TimeoutError(f"the server was not SERVING after {timeout} s (last: {last})")

    async def stream_all(self, method: str, requests: Sequence, attempts: int = 4,  # type: ignore[override]
                         timeout: float | None = None) -> AsyncIterator:
        """:meth:`BertzooClient.stream_all`, as an async iterator."""
        resume = _Resumption(method, requests, attempts)
        while not resume.done:
            call = self.stream(method, resume.start(), timeout)
            try:
                async for message in call:
                    resume.answered_one()
                    yield message
                resume.check_complete()
            except grpc.RpcError as e:
                await asyncio.sleep(resume.wait_after(e))
            finally:
                call.cancel()

    async def close(self) -> None:  # type: ignore[override]
        await self.channel.close()

    async def __aenter__(self) -> AsyncBertzooClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


