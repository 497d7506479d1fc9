"""A small synchronous Python client for the bertzoo gRPC server (``bertzoo client`` uses it)::

    with BertzooClient("localhost:50051") as client:
        client.wait_ready()
        response = client.sentiment(["a lovely film", "a dull film"])
        print([r.label for r in response.results], response.timing.total_seconds)

Methods return the protobuf responses of protos/bertzoo/v1/bertzoo.proto; errors raise ``grpc.RpcError`` with the
server's status code and message (``error.code()``, ``error.details()``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .proto import pb2, pb2_grpc


def channel_credentials(tls: bool = False, root_certificates: bytes | str | Path | None = None
                        ) -> grpc.ChannelCredentials | None:
    """TLS credentials (``root_certificates``: a PEM file or its bytes; None: the system's roots), or None for a
    plaintext channel."""
    if not tls and root_certificates is None:
        return None
    if isinstance(root_certificates, (str, Path)):
        root_certificates = Path(root_certificates).read_bytes()
    return grpc.ssl_channel_credentials(root_certificates=root_certificates)


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


class BertzooClient:
    def __init__(self, target: str, *, token: str | None = None, tls: bool = False,
                 root_certificates: bytes | str | Path | None = None, timeout: float | None = 30.0) -> None:
        """``target``: host:port. ``token``: sent as ``authorization: Bearer <token>``. ``timeout``: the default
        deadline of every call, in seconds (None: no deadline)."""
        credentials = channel_credentials(tls, root_certificates)
        self.channel = (grpc.secure_channel(target, credentials) if credentials is not None
                        else grpc.insecure_channel(target))
        self.stub = pb2_grpc.BertzooStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._metadata = auth_metadata(token)
        self.timeout = timeout

    def _call(self, method, request, timeout: float | None):
        return method(request, timeout=self.timeout if timeout is None else timeout, metadata=self._metadata)

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


# Exit codes of `bertzoo client health`, as grpc_health_probe's where it has one (2, 3, 4), so scripts written for
# either read the same: 0 only for SERVING.
HEALTH_SERVING = 0
HEALTH_CANNOT_CONNECT = 2  # nothing listens, the connection failed, or the deadline passed (also click's usage error)
HEALTH_RPC_FAILED = 3  # the server answered the health RPC with an error
HEALTH_NOT_SERVING = 4  # an answer other than SERVING: NOT_SERVING (loading, draining), SERVICE_UNKNOWN, UNKNOWN
HEALTH_AUTH_OR_TLS = 5  # TLS handshake failed (certificate, plaintext against TLS), or the call was not authorized
_TLS_WORDS = ("ssl", "tls", "handshake", "certificate")


def probe_health(client: BertzooClient, service: str = "", timeout: float = 5.0) -> tuple[int, str]:
    """One health check: (exit code, what happened in one line)."""
    try:
        status = client.health(service, timeout=timeout)
    except grpc.RpcError as e:
        code, details = e.code(), (e.details() or "").strip()
        if code == grpc.StatusCode.NOT_FOUND:  # the health service's answer for a service name it does not know
            return HEALTH_NOT_SERVING, f"SERVICE_UNKNOWN: no service {service!r} on this server"
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or any(
                word in details.lower() for word in _TLS_WORDS):
            return HEALTH_AUTH_OR_TLS, f"auth or TLS failure: {code.name}: {details}"
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return HEALTH_CANNOT_CONNECT, f"cannot reach the server: {code.name}: {details}"
        return HEALTH_RPC_FAILED, f"health check failed: {code.name}: {details}"
    if status == "SERVING":
        return HEALTH_SERVING, status
    return HEALTH_NOT_SERVING, status


def wait_for_health(client: BertzooClient, service: str = "", wait: float = 0.0, timeout: float = 5.0,
                    interval: float = 0.25) -> tuple[int, str]:
    """Check until SERVING or ``wait`` seconds have passed (one check with ``wait=0``); the last result."""
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        result = probe_health(client, service, timeout=min(timeout, left) if left > 0.1 else timeout)
        if result[0] == HEALTH_SERVING or time.monotonic() + interval >= deadline:
            return result
        time.sleep(interval)
