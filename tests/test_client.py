"""The Python clients: asyncio next to sync, gRPC's retries for UNAVAILABLE, RESOURCE_EXHAUSTED and a
server's CANCELLED, mTLS."""

from __future__ import annotations

import asyncio
from concurrent import futures

import grpc
import pytest

from bertzoo.serving.client import AsyncBertzooClient, BertzooClient, channel_options
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.serving.proto import pb2, pb2_grpc
from conftest import self_signed, serve_config


@pytest.fixture(scope="module")
def running(tiny_artifact):
    _, artifact = tiny_artifact
    with ServerThread(serve_config(artifact)) as server:
        yield server


SENTIMENT_OK = {"task": "sentiment", "code": "OK", "protocol": "grpc"}

def test_the_async_client_answers_as_the_sync_one(running):
    target = f"127.0.0.1:{running.port}"
    with BertzooClient(target) as client:
        expected = client.sentiment(["a lovely film", "a dull film"])

    async def ask():
        async with AsyncBertzooClient(target) as client:
            await client.wait_ready(timeout=30)
            got = await client.sentiment(["a lovely film", "a dull film"])
            info = await client.model_info()
            return got, info

    got, info = asyncio.run(ask())
    assert [r.label for r in got.results] == [r.label for r in expected.results]
    assert [list(r.probabilities) for r in got.results] == [list(r.probabilities) for r in expected.results]
    assert "sentiment" in info.tasks


class Flaky(pb2_grpc.BertzooServicer):
    """Answers the first ``failures`` calls with ``code``, then succeeds."""

    def __init__(self, failures: int, code: grpc.StatusCode) -> None:
        self.calls, self.failures, self.code = 0, failures, code

    def Sentiment(self, request, context):  # noqa: N802 (gRPC method name)
        self.calls += 1
        if self.calls <= self.failures:
            context.abort(self.code, "try again")
        return pb2.SentimentResponse(results=[pb2.SentimentResult(label="neutral")])


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  grpc.StatusCode.CANCELLED])
def test_the_client_retries_a_restarting_full_or_stopping_server_with_backoff(code):
    flaky = Flaky(failures=2, code=code)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb2_grpc.add_BertzooServicer_to_server(flaky, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with BertzooClient(f"127.0.0.1:{port}", timeout=10) as client:
            assert client.sentiment(["x"]).results[0].label == "neutral"
        assert flaky.calls == 3  # two refusals retried by gRPC itself, within the call's deadline
        flaky.calls = 0
        with BertzooClient(f"127.0.0.1:{port}", timeout=10, options=channel_options(retries=False)) as client:
            with pytest.raises(grpc.RpcError) as error:
                client.sentiment(["x"])
        assert error.value.code() == code and flaky.calls == 1
    finally:
        server.stop(None)


def test_mutual_tls_admits_only_clients_with_a_certificate(tiny_artifact, tmp_path):
    _, artifact = tiny_artifact
    (tmp_path / "server").mkdir()
    (tmp_path / "client").mkdir()
    cert, key = self_signed(tmp_path / "server")
    client_cert, client_key = self_signed(tmp_path / "client")  # self-signed: its own CA
    config = serve_config(artifact, tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(client_cert))
    with ServerThread(config) as server:
        target = f"127.0.0.1:{server.port}"
        with BertzooClient(target, root_certificates=cert, certificate_chain=client_cert,
                           private_key=client_key) as client:
            assert client.sentiment(["with a client certificate"]).results
        with BertzooClient(target, root_certificates=cert, timeout=5,
                           options=channel_options(retries=False)) as anonymous:
            with pytest.raises(grpc.RpcError) as error:
                anonymous.health()
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake is refused


def test_a_client_certificate_needs_its_key(tmp_path):
    cert, _ = self_signed(tmp_path)
    with pytest.raises(ValueError, match="needs its private key"):
        BertzooClient("127.0.0.1:1", root_certificates=cert, certificate_chain=cert)


def test_a_target_with_several_servers_spreads_calls_over_all_of_them(running, tiny_artifact):
    """round_robin in the client's service config: a target resolving to several replicas (a headless Service)
    sends calls to each, where gRPC's default (pick_first) would send all of them to one."""
    _, artifact = tiny_artifact
    with ServerThread(serve_config(artifact)) as second:
        target = f"ipv4:127.0.0.1:{running.port},127.0.0.1:{second.port}"
        before = [s.metrics.registry.get_sample_value("bertzoo_requests_total", SENTIMENT_OK)
                  or 0.0 for s in (running, second)]
        with BertzooClient(target) as client:
            for i in range(20):
                client.sentiment([f"call {i}"])
        after = [s.metrics.registry.get_sample_value("bertzoo_requests_total", SENTIMENT_OK)
                 for s in (running, second)]
    shares = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(shares) == 20 and min(shares) >= 5, shares
