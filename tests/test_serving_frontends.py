"""`bertzoo serve --frontends N` (N > 1) as users run it: a real multi-process server (parent, front ends, engine) in
a subprocess, against the same artifact answered by the one-process server."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from prometheus_client.mmap_dict import MmapedDict

from bertzoo.serving.client import BertzooClient, channel_options
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.serving.proto import pb2
from conftest import self_signed, serve_config
from server_process import ServerProcess, gone, metric

pytestmark = pytest.mark.slow  # real processes: `pytest -m 'not slow'` leaves them out


def answers(client: BertzooClient) -> list:
    """One answer of every RPC, without the timings."""
    got = [client.sentiment(["a fine film", "a dull one"]).results,
           client.paraphrase([("how old are you", "what is your age")]).results,
           client.similarity([("a cat sits", "a cat is sitting")]).results,
           client.qa([("who went home?", "Bob went home after the game.")]).results,
           client.embed(["an embedded sentence"]).embeddings]
    return [[str(x) for x in part] for part in got]


def requests_counted_by(pid: int) -> float:
    """The calls process ``pid`` counted in bertzoo_requests_total: its own file of the metrics' multiprocess folder
    (which it inherited in PROMETHEUS_MULTIPROC_DIR), read as prometheus_client reads it to merge the view."""
    environ = dict(item.split("=", 1) for item in
                   open(f"/proc/{pid}/environ", "rb").read().decode().split("\0") if "=" in item)
    path = f"{environ['PROMETHEUS_MULTIPROC_DIR']}/counter_{pid}.db"
    return sum(value for key, value, *_ in MmapedDict.read_all_values_from_file(path)
               if json.loads(key)[1] == "bertzoo_requests_total")  # (metric, sample, label names, values, help)


def test_frontends_answer_as_one_process_does_with_one_metrics_view(tiny_artifact):
    _, artifact = tiny_artifact
    with ServerThread(serve_config(artifact)) as single, \
            BertzooClient(f"127.0.0.1:{single.port}") as client:
        expected = answers(client)
    with ServerProcess(artifact) as server:
        server.wait_ready()
        assert len(server.children()) == 3  # the engine and two front ends
        # Each client on a connection of its own: the kernel spreads connections over the front ends (SO_REUSEPORT,
        # by a hash of the connection: all 16 on one of the two has a chance of 2 in 65,536).
        for _ in range(16):
            with BertzooClient(server.target) as client:
                assert answers(client) == expected
                info = client.model_info()
                assert info.backend == "onnxruntime" and list(info.tasks) == ["sentiment", "paraphrase",
                                                                              "similarity", "qa"]
        text = server.metrics()
        for task in ("sentiment", "paraphrase", "similarity", "qa", "embed"):
            assert metric(text, "bertzoo_requests_total", task=task, code="OK", protocol="grpc") == 16
        counted = [requests_counted_by(pid) for pid in server.children("bertzoo-fe")]
        assert len(counted) == 2 and min(counted) > 0 and sum(counted) == 16 * 6, counted  # 5 tasks + ModelInfo
        assert metric(text, "bertzoo_batch_size_count", lane="main") >= 30  # counted in the engine process
        assert metric(text, "bertzoo_ready") == 1
        assert metric(text, "process_cpu_seconds_total") > 0
        assert "pid=" not in text  # every gauge combined over the processes, as one process shows it
        assert server.stop() == 0
    run_dir = server.run_dir()
    out = server.output
    assert out.count("effective config") == 1 and out.count("front end on port") == 2
    assert "2 front ends on gRPC port" in out  # said to be gRPC: curl on it gets only "Received HTTP/0.9"
    assert "engine ready" in out and out.count("ready: health SERVING") == 2
    # Every front end turned SERVING only after the engine had warmed up.
    assert out.index("warmed up") < out.index("engine ready") < out.index("ready: health SERVING")
    assert not run_dir.exists()  # the engine's socket and the metrics files went with it


@pytest.mark.parametrize("engines", [1, 2])
def test_sigterm_front_ends_finish_accepted_calls_then_the_engine_stops(tiny_artifact, engines):
    _, artifact = tiny_artifact
    # An idle model waits 1.5 s to fill a batch, so the requests are still in flight when SIGTERM arrives.
    with ServerProcess(artifact, "--max-queue-delay-ms", "1500", "--engines", str(engines)) as server:
        server.wait_ready()
        clients = [BertzooClient(server.target, options=channel_options(retries=False)) for _ in range(6)]
        calls = [c.stub.Sentiment.future(pb2.SentimentRequest(texts=[f"accepted {i}"]), timeout=30)
                 for i, c in enumerate(clients)]
        time.sleep(0.4)
        children = server.children()
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        for _ in range(4):  # new connections reach every front end: none serves any more
            with BertzooClient(server.target, options=channel_options(retries=False)) as fresh:
                try:
                    assert fresh.health(timeout=2) == "NOT_SERVING"
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE
        assert all(len(call.result().results) == 1 for call in calls)  # none lost
        for c in clients:
            c.close()
        assert server.stop() == 0
    assert all(gone(pid) for pid in children) and len(children) == 2 + engines
    out = server.output
    assert out.index("stop signal") < out.index("engine stopped") < out.rindex("stopped")
    assert out.count("engine stopped") == engines


def test_deadlines_cancellation_and_queue_full_reach_the_engine(tiny_artifact):
    _, artifact = tiny_artifact
    with ServerProcess(artifact, "--max-queue-delay-ms", "1500", "--max-queue", "1") as server:
        server.wait_ready()
        with BertzooClient(server.target, options=channel_options(retries=False)) as client:
            with pytest.raises(grpc.RpcError) as expired:
                client.sentiment(["too late"], timeout=0.3)
            assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            cancelled = client.stub.Sentiment.future(pb2.SentimentRequest(texts=["cancelled"]), timeout=30)
            time.sleep(0.3)
            cancelled.cancel()
            time.sleep(2.0)  # past the queue delay: a batch would have run by now
            assert metric(server.metrics(), "bertzoo_batch_size_count", lane="main") == 0  # neither reached the model
            waiting = client.stub.Sentiment.future(pb2.SentimentRequest(texts=["waits"]), timeout=30)
            time.sleep(0.3)
            started = time.perf_counter()
            with pytest.raises(grpc.RpcError) as refused:
                client.sentiment(["one too many"], timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.perf_counter() - started < 0.5  # refused at once, not after the queue delay
            assert len(waiting.result().results) == 1


def test_many_concurrent_calls_each_get_their_own_answer(tiny_artifact):
    """Both ends read their sockets until empty on each wake-up and again after each send (the descriptor signals
    edges): a missed message would leave a call unanswered, so every one of many concurrent calls must be answered,
    with its own text's answer."""
    _, artifact = tiny_artifact
    texts = [f"sentence number {i} of the load" for i in range(12)]
    with ServerThread(serve_config(artifact)) as single, BertzooClient(f"127.0.0.1:{single.port}") as client:
        expected = {text: str(client.sentiment([text]).results[0].label) for text in texts}
    with ServerProcess(artifact) as server:
        server.wait_ready()
        clients = [BertzooClient(server.target, timeout=30) for _ in range(8)]  # 8 connections over 2 front ends

        def calls(client: BertzooClient) -> list[tuple[str, str]]:
            return [(text, str(client.sentiment([text]).results[0].label)) for text in texts * 5]

        with ThreadPoolExecutor(len(clients)) as pool:
            got = [pair for answered in pool.map(calls, clients) for pair in answered]
        for client in clients:
            client.close()
        assert len(got) == 8 * 60 and all(label == expected[text] for text, label in got)
        assert metric(server.metrics(), "bertzoo_requests_total", task="sentiment", code="OK",
                      protocol="grpc") == 8 * 60


def test_long_requests_keep_their_lane_through_the_engine(tiny_artifact):
    _, artifact = tiny_artifact
    context = " ".join(f"Sentence {i} tells of the river and the town." for i in range(60))
    with ServerProcess(artifact, "--long-request-tokens", "200") as server:
        server.wait_ready()
        with BertzooClient(server.target) as client:
            assert len(client.qa([("what does it tell of?", context)]).results) == 1
            long_batches = metric(server.metrics(), "bertzoo_batch_size_count", lane="long")
            assert len(client.sentiment(["short"]).results) == 1
        text = server.metrics()
    # Where each request's batches ran: the long one's windows on the long lane, in several batches; the short one
    # on the main lane, and nothing more on the long one.
    assert long_batches >= 2  # its windows outgrow one long-lane batch (2,048 tokens)
    assert metric(text, "bertzoo_batch_size_count", lane="long") == long_batches
    assert metric(text, "bertzoo_batch_size_count", lane="main") == 1


def test_a_dead_front_end_is_replaced_and_our_client_retries_its_calls(tiny_artifact):
    _, artifact = tiny_artifact
    with ServerProcess(artifact, "--max-queue-delay-ms", "800") as server:
        server.wait_ready()
        assert len(server.children()) == 3
        clients = [BertzooClient(server.target) for _ in range(6)]  # retries on, as users run it
        calls = [c.stub.Sentiment.future(pb2.SentimentRequest(texts=[f"in flight {i}"]), timeout=30)
                 for i, c in enumerate(clients)]
        time.sleep(0.3)
        victim = server.children("bertzoo-fe-")[0]
        os.kill(victim, signal.SIGKILL)
        outcomes = []
        for call in calls:
            try:
                outcomes.append(len(call.result().results))
            except grpc.RpcError as e:
                outcomes.append(e.code())
        assert set(outcomes) <= {1, grpc.StatusCode.UNAVAILABLE}
        for _ in range(100):
            if len(server.children()) == 3:
                break
            time.sleep(0.1)
        after = set(server.children())
        assert victim not in after and len(after) == 3
        server.wait_ready()
        for c in clients:  # the retrying client carries on against the replacement
            assert len(c.sentiment(["after the restart"]).results) == 1
            c.close()
        assert server.stop() == 0
    assert re.search(r"front end \d exited \(code -9\): starting it again", server.output)


def test_a_dead_engine_stops_the_server_with_an_error_and_leaves_nothing(tiny_artifact):
    _, artifact = tiny_artifact
    with ServerProcess(artifact) as server:
        server.wait_ready()
        children = server.children()
        [engine] = server.children("bertzoo-engine")
        os.kill(engine, signal.SIGKILL)
        code = server.process.wait(timeout=60)
        server.stop()
    assert code == 1
    assert all(gone(pid) for pid in children)
    assert "the engine process exited (code -9)" in server.output, server.output[-3000:]
    assert not server.run_dir().exists()


def test_a_taken_port_fails_the_start_with_one_line(tiny_artifact):
    _, artifact = tiny_artifact
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = ServerProcess(artifact)
        server.port = taken.getsockname()[1]
        server.process.kill()
        server.process.communicate()
        command = [sys.executable, "-m", "bertzoo.cli", "serve", str(artifact), "--host", "127.0.0.1", "--port",
                   str(server.port), "--metrics-port", "0", "--http-port", "0", "--frontends", "2"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"could not listen on 127.0.0.1:{server.port}" in result.stderr and "--port" in result.stderr
    assert "Traceback" not in result.stderr


def test_tls_tokens_reflection_streams_and_message_limits_unchanged(tiny_artifact, tmp_path):
    _, artifact = tiny_artifact
    cert, key = self_signed(tmp_path)
    flags = ("--tls-cert", str(cert), "--tls-key", str(key), "--auth-token", "s3cret", "--max-message-bytes", "4096")
    with ServerProcess(artifact, *flags) as server:
        secure = {"tls": True, "root_certificates": str(cert), "token": "s3cret"}
        server.wait_ready(**secure)
        with BertzooClient(server.target, **secure) as client:
            assert len(client.sentiment(["over TLS with a token"]).results) == 1
            streamed = list(client.stream("Sentiment", iter([pb2.SentimentRequest(texts=[f"s{i}"]) for i in range(5)]),
                                          timeout=30))
            assert len(streamed) == 5 and all(r.response.results for r in streamed)
            with pytest.raises(grpc.RpcError) as too_big:
                client.sentiment(["x" * 5000])
            assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with BertzooClient(server.target, tls=True, root_certificates=str(cert),
                           options=channel_options(retries=False)) as anonymous:
            with pytest.raises(grpc.RpcError) as refused:
                anonymous.sentiment(["no token"])
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

            stub = reflection_pb2_grpc.ServerReflectionStub(anonymous.channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            reply = next(stub.ServerReflectionInfo(iter([request]), metadata=[("authorization", "Bearer s3cret")]))
            assert "bertzoo.v1.Bertzoo" in [s.name for s in reply.list_services_response.service]


def test_engine_replicas_each_serve_and_one_dying_stops_the_server_with_nothing_left(tiny_artifact):
    """--engines 2 behind one front end: two engine processes, both running batches under concurrent calls (each
    one's CPU time moves), every answer right; a replica killed ends the server with code 1 and no process left."""
    _, artifact = tiny_artifact
    with ServerProcess(artifact, "--engines", "2", "--max-queue-delay-ms", "20", frontends=1) as server:
        server.wait_ready()
        engines = server.children("bertzoo-engine-")
        assert len(engines) == 2 and len(server.children("bertzoo-fe-")) == 1
        before = [cpu_seconds(pid) for pid in engines]
        with BertzooClient(server.target) as client, ThreadPoolExecutor(8) as pool:
            labels = list(pool.map(lambda i: client.sentiment([f"call {i % 4}"]).results[0].label, range(400)))
            expected = {i: client.sentiment([f"call {i}"]).results[0].label for i in range(4)}
        assert labels == [expected[i % 4] for i in range(400)]
        used = [cpu_seconds(pid) - b for pid, b in zip(engines, before, strict=True)]
        assert min(used) > 0.25 * sum(used) > 0, used  # both replicas ran batches, not one of them alone
        children = server.children()
        os.kill(engines[1], signal.SIGKILL)
        code = server.process.wait(timeout=60)
        server.stop()
    assert code == 1
    assert all(gone(pid) for pid in children)
    assert "the engine process bertzoo-engine-2 exited (code -9)" in server.output, server.output[-3000:]


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
