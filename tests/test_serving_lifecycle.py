"""A server's life: TLS and token auth at the door, NOT_SERVING while loading, the drain when the shutdown grace
runs out, SIGTERM finishing every accepted call of a real `bertzoo serve` process, and a failed start in one line."""

from __future__ import annotations

import importlib.resources
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest
from click.testing import CliRunner

from bertzoo.cli import main
from bertzoo.serving.client import BertzooClient, channel_options
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.serving.model import load_served_model
from bertzoo.serving.proto import pb2
from conftest import free_port, self_signed, serve_config


def test_tls_with_a_bearer_token_and_open_health_checks(tiny_artifact, tmp_path):
    _, artifact = tiny_artifact
    cert, key = self_signed(tmp_path)
    config = serve_config(artifact, tls_cert=str(cert), tls_key=str(key), auth_token="s3cret-token")
    with ServerThread(config) as running:
        target = f"127.0.0.1:{running.port}"
        with BertzooClient(target, token="s3cret-token", root_certificates=cert) as client:
            assert client.sentiment(["over TLS"]).results
        for token in (None, "wrong-token"):
            with BertzooClient(target, token=token, root_certificates=cert) as client:
                assert client.health() == "SERVING"  # health stays open for probes
                with pytest.raises(grpc.RpcError) as error:
                    client.model_info()
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
                # Sentiment's handler was used above with the right token: each call is still checked.
                with pytest.raises(grpc.RpcError) as error:
                    client.sentiment(["over TLS"])
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with BertzooClient(target, timeout=3) as plaintext:
            with pytest.raises(grpc.RpcError) as error:
                plaintext.health()
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert running.metrics.registry.get_sample_value(
            "bertzoo_request_failures_total",
            {"task": "model_info", "code": "UNAUTHENTICATED", "reason": "unauthenticated", "protocol": "grpc"}) == 2


def test_not_serving_and_unavailable_until_the_model_is_loaded(tiny_artifact):
    _, artifact = tiny_artifact
    release = threading.Event()

    def slow_loader(config):
        release.wait(30)
        return load_served_model(config)

    running = ServerThread(serve_config(artifact), slow_loader)
    starter = threading.Thread(target=running.start)
    starter.start()
    try:
        deadline = time.monotonic() + 30
        while running.server.port is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with BertzooClient(f"127.0.0.1:{running.port}", timeout=5) as client:
            grpc.channel_ready_future(client.channel).result(timeout=10)
            assert client.health() == "NOT_SERVING"
            with pytest.raises(grpc.RpcError) as error:
                client.sentiment(["too early"])
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE and "loading" in error.value.details()
            release.set()
            starter.join(30)
            assert client.health() == "SERVING" and client.sentiment(["now"]).results
    finally:
        release.set()
        starter.join(30)
        running.stop()


class SlowBackend:
    def __init__(self, inner, delay: float) -> None:
        self.inner, self.delay = inner, delay

    def encode(self, batch):
        time.sleep(self.delay)
        return self.inner.encode(batch)

    def head(self, task, inputs):
        return self.inner.head(task, inputs)


def test_calls_cut_when_the_shutdown_grace_runs_out_are_counted(tiny_artifact, caplog):
    _, artifact = tiny_artifact

    def slow(config):
        served = load_served_model(config)
        served.backend = SlowBackend(served.backend, 0.0)
        slow.backend = served.backend
        return served

    with caplog.at_level(logging.INFO, logger="bertzoo.serving"):
        running = ServerThread(serve_config(artifact), slow).start()
        with BertzooClient(f"127.0.0.1:{running.port}", options=channel_options(retries=False)) as client:
            slow.backend.delay = 2.0
            calls = [client.stub.Sentiment.future(pb2.SentimentRequest(texts=[f"cut {i}"]), timeout=30)
                     for i in range(5)]
            time.sleep(0.5)  # the first batch is on the model, the rest queued behind it
            running.stop(grace=0.3)
            for call in calls:
                with pytest.raises(grpc.RpcError) as cut:
                    call.result()
                assert cut.value.code() == grpc.StatusCode.UNAVAILABLE  # what the log and the metrics say
    assert running.metrics.registry.get_sample_value(
        "bertzoo_request_failures_total",
        {"task": "sentiment", "code": "UNAVAILABLE", "reason": "shutdown", "protocol": "grpc"}) == 5
    assert any("5 calls still running when the 0.3 s grace ran out were cut (UNAVAILABLE" in r.getMessage()
               for r in caplog.records)


def test_sigterm_finishes_every_accepted_request_then_exits(tiny_artifact):
    _, artifact = tiny_artifact
    port = free_port()
    # An idle model waits 1.5 s to fill a batch, so the requests are still in flight when SIGTERM arrives.
    command = [sys.executable, "-m", "bertzoo.cli", "serve", str(artifact), "--host", "127.0.0.1", "--port", str(port),
               "--metrics-port", "0", "--http-port", "0", "--threads", "1", "--no-ort-spinning",
               "--max-queue-delay-ms", "1500"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               cwd=artifact.parent)
    try:
        with BertzooClient(f"127.0.0.1:{port}", timeout=30) as client:
            client.wait_ready(timeout=60)
            calls = [client.stub.Sentiment.future(pb2.SentimentRequest(texts=[f"accepted {i}"]), timeout=30)
                     for i in range(12)]
            time.sleep(0.4)  # on loopback, long enough for the server to accept them all
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(grpc.RpcError) as refused:
                client.sentiment(["after SIGTERM"], timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert all(len(call.result().results) == 1 for call in calls)  # none lost
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate()[0]
    assert "effective config" in output and "stop signal" in output and "stopped" in output
    # uvloop where the serve extra installed it (its signal handling is what this test exercises), else asyncio's
    expected = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    assert f"event loop: {expected}" in output


def test_serve_fails_with_the_reason_on_a_broken_artifact_or_a_taken_port(tiny_artifact, tmp_path):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["serve", str(tmp_path / "empty"), "--host", "127.0.0.1", "--port",
                                       str(free_port()), "--metrics-port", "0", "--http-port", "0"])
    assert result.exit_code == 1 and "no manifest.json" in result.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", str(tiny_artifact[1]), "--host", "127.0.0.1", "--port", str(port),
                                           "--metrics-port", "0", "--http-port", "0"])
    assert result.exit_code == 1 and f"could not listen on 127.0.0.1:{port}" in result.output
