"""Operating the server: TLS and token auth, the loading state, SIGTERM draining a real `bertzoo serve` process,
fuzzed requests, the command-line client and load tool, and the generated stubs and dashboard staying in step."""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from google.protobuf import descriptor_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertzoo.cli import main
from bertzoo.serving.client import BertzooClient, channel_options
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.serving.metrics import Metrics
from bertzoo.serving.model import load_served_model
from bertzoo.serving.proto import pb2
from conftest import free_port, self_signed, serve_config

MAX_ITEMS = 8


@pytest.fixture(scope="module")
def server(tiny_artifact):
    _, artifact = tiny_artifact
    with ServerThread(serve_config(artifact, max_items=MAX_ITEMS)) as running, \
            BertzooClient(f"127.0.0.1:{running.port}") as client:
        yield running, client


# ---------------------------------------------------------------- TLS and auth

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
        with BertzooClient(target, timeout=3) as plaintext:
            with pytest.raises(grpc.RpcError) as error:
                plaintext.health()
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert running.metrics.registry.get_sample_value(
            "bertzoo_request_failures_total",
            {"task": "model_info", "code": "UNAUTHENTICATED", "reason": "unauthenticated"}) == 2


# ---------------------------------------------------------------- life cycle


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
        "bertzoo_request_failures_total", {"task": "sentiment", "code": "UNAVAILABLE", "reason": "shutdown"}) == 5
    assert any("5 calls still running when the 0.3 s grace ran out were cut (UNAVAILABLE" in r.getMessage()
               for r in caplog.records)


def test_sigterm_finishes_every_accepted_request_then_exits(tiny_artifact):
    _, artifact = tiny_artifact
    port = free_port()
    # An idle model waits 1.5 s to fill a batch, so the requests are still in flight when SIGTERM arrives.
    command = [sys.executable, "-m", "bertzoo.cli", "serve", str(artifact), "--host", "127.0.0.1", "--port", str(port),
               "--metrics-port", "0", "--threads", "1", "--no-ort-spinning", "--max-queue-delay-ms", "1500"]
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
                                       str(free_port()), "--metrics-port", "0"])
    assert result.exit_code == 1 and "no manifest.json" in result.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", str(tiny_artifact[1]), "--host", "127.0.0.1", "--port", str(port),
                                           "--metrics-port", "0"])
    assert result.exit_code == 1 and f"could not listen on 127.0.0.1:{port}" in result.output


# ---------------------------------------------------------------- fuzzing


TEXTS = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["", " ", "\n\t ", "\x00", "\u200b", "\ufeff", "🙂" * 50, "[CLS] [SEP] [PAD]", "é" * 300]),
    st.builds(lambda char, n: char * n, st.characters(codec="utf-8"), st.integers(19_990, 20_010)),  # at the limit
)


@st.composite
def fuzz_requests(draw):
    rpc = draw(st.sampled_from(["sentiment", "embed", "paraphrase", "similarity", "qa"]))
    count = draw(st.integers(0, MAX_ITEMS + 2))
    if rpc in ("sentiment", "embed"):
        return rpc, [draw(TEXTS) for _ in range(count)]
    return rpc, [(draw(TEXTS), draw(TEXTS)) for _ in range(count)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request=fuzz_requests())
def test_fuzzed_requests_get_an_answer_or_invalid_argument_and_never_hurt_the_server(server, request):
    _, client = server
    rpc, items = request
    try:
        response = getattr(client, rpc)(items)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
        return
    results = response.embeddings if rpc == "embed" else response.results
    assert len(results) == len(items)
    if rpc == "qa":
        for (_, context), result in zip(items, results, strict=True):
            assert result.no_answer or context[result.start_char:result.end_char] == result.answer


@settings(max_examples=40, deadline=None)
@given(raw=st.binary(max_size=300), method=st.sampled_from(["Sentiment", "Paraphrase", "Similarity", "QA", "Embed"]))
def test_undecodable_bytes_never_hurt_the_server(server, raw, method):
    _, client = server
    call = client.channel.unary_unary(f"/bertzoo.v1.Bertzoo/{method}")  # no serializers: raw bytes in and out
    try:
        call(raw, timeout=10)
    except grpc.RpcError as e:  # bytes that do decode are a request like any other: answered or refused
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())


def test_malformed_health_checks_are_invalid_argument_without_a_traceback(tiny_artifact, caplog):
    _, artifact = tiny_artifact
    with caplog.at_level(logging.DEBUG), \
            ServerThread(serve_config(artifact, auth_token="s3cret-token")) as running, \
            BertzooClient(f"127.0.0.1:{running.port}") as client:
        check = client.channel.unary_unary("/grpc.health.v1.Health/Check")  # raw bytes, no token: health is open
        for _ in range(20):
            with pytest.raises(grpc.RpcError) as error:
                check(b"\xff\xff\xff", timeout=10)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.health() == "SERVING"
        assert running.metrics.registry.get_sample_value(
            "bertzoo_request_failures_total", {"task": "health", "code": "INVALID_ARGUMENT", "reason": "malformed"}) == 20
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_the_server_is_unharmed_after_the_fuzzing(server):
    running, client = server
    assert client.health() == "SERVING" and client.sentiment(["still here"]).results
    codes = {s.labels["code"] for family in running.metrics.registry.collect() for s in family.samples
             if s.name == "bertzoo_request_failures_total"}
    assert codes <= {"INVALID_ARGUMENT"}  # bad input was refused; nothing failed inside the server


# ---------------------------------------------------------------- command line


def test_cli_client_and_bench_serve(server, tmp_path):
    running, _ = server
    target = ["--target", f"127.0.0.1:{running.port}"]
    runner = CliRunner()
    result = runner.invoke(main, ["client", "sentiment", "a lovely film", *target])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["results"][0]["label"]
    result = runner.invoke(main, ["client", "qa", "Who went?", "Alice went to Paris.", *target])
    assert result.exit_code == 0 and "no_answer" in json.loads(result.output)["results"][0]
    result = runner.invoke(main, ["client", "sentiment", " ", *target])
    assert result.exit_code == 1 and "INVALID_ARGUMENT: texts[0] is empty" in result.output
    out = tmp_path / "bench.json"
    result = runner.invoke(main, ["bench-serve", *target, "--task", "similarity", "--requests", "30", "--concurrency",
                                  "3", "--items", "2", "--json-out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert (summary["requests"], summary["ok"], summary["errors"]) == (30, 30, {})
    assert 0 < summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"] and summary["items_per_s"] > 0
    assert "throughput" in result.output and "p99" in result.output


def test_cli_client_answers_a_file_one_json_line_per_input_in_order(server, tmp_path):
    running, _ = server
    target = ["--target", f"127.0.0.1:{running.port}"]
    texts = tmp_path / "reviews.txt"
    # a blank line (skipped), and a text over the server's max_text_chars (refused alone)
    texts.write_text("\n".join(["a lovely film", "", "x", "a dull film", "y" * 20_001]) + "\n")
    out = tmp_path / "answers.jsonl"
    result = CliRunner().invoke(main, ["client", "sentiment", "--input", str(texts), "--output", str(out), *target])
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["index"] for a in answers] == [0, 1, 2, 3]
    with BertzooClient(f"127.0.0.1:{running.port}") as client:
        expected = [client.sentiment([t]).results[0].label for t in ("a lovely film", "x", "a dull film")]
    assert [a["label"] for a in answers[:3]] == expected
    assert answers[3]["error"]["code"] == "INVALID_ARGUMENT" and "label" not in answers[3]  # failed alone, in place
    result = CliRunner().invoke(main, ["client", "embed", "--input", str(texts), *target])
    assert result.exit_code == 0
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 4 and len(lines[0]["embedding"]) == client_dimensions(running)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"text_a": "a cat sat", "text_b": "a cat was sitting", "id": 7}\n\n{"text_a": "x", "text_b": "y"}\n')
    result = CliRunner().invoke(main, ["client", "similarity", "--input", str(pairs), *target])
    assert result.exit_code == 0, result.output
    scores = [json.loads(line)["score"] for line in result.stdout.splitlines()]
    with BertzooClient(f"127.0.0.1:{running.port}") as client:
        assert scores == pytest.approx([r.score for r in client.similarity([("a cat sat", "a cat was sitting"),
                                                                            ("x", "y")]).results], abs=1e-5)
    pairs.write_text('{"text_a": "a cat sat"}\n')
    result = CliRunner().invoke(main, ["client", "similarity", "--input", str(pairs), *target])
    assert result.exit_code == 1 and f"{pairs}:1: a similarity input is an object with the text fields text_a, text_b" \
        in result.output
    result = CliRunner().invoke(main, ["client", "sentiment", "more", "--input", str(texts), *target])
    assert result.exit_code == 2 and "--input FILE replaces TEXTS" in result.output
    missing_server = CliRunner().invoke(main, ["client", "sentiment", "--input", str(texts), "--output",
                                               str(tmp_path / "none.jsonl"), "--target", "127.0.0.1:1", "--timeout", "2"])
    assert missing_server.exit_code == 1 and not (tmp_path / "none.jsonl").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def client_dimensions(running) -> int:
    with BertzooClient(f"127.0.0.1:{running.port}") as client:
        return client.model_info().embedding_dimensions


# ---------------------------------------------------------------- generated and shipped files


def test_installed_stubs_are_generated_from_the_proto_in_this_tree(tmp_path):
    protoc = pytest.importorskip("grpc_tools.protoc")
    protos = Path(__file__).resolve().parents[1] / "protos"
    out = tmp_path / "descriptor.pb"
    assert protoc.main(["protoc", f"-I{protos}", f"--descriptor_set_out={out}", "bertzoo/v1/bertzoo.proto"]) == 0
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    installed = descriptor_pb2.FileDescriptorProto.FromString(pb2.DESCRIPTOR.serialized_pb)
    compiled.name = installed.name  # the stubs are compiled under their import path, bertzoo/serving/_proto/

    def drop_json_names(messages) -> None:  # a descriptor set records them, generated code does not
        for message in messages:
            for f in message.field:
                f.ClearField("json_name")
            drop_json_names(message.nested_type)

    drop_json_names(compiled.message_type)
    assert compiled == installed, "stale stubs: reinstall the package (pip install -e .) to regenerate them"


def test_the_dashboard_charts_every_metric_and_only_those():
    dashboard = json.loads((importlib.resources.files("bertzoo.serving") / "grafana" / "bertzoo-dashboard.json")
                           .read_text())
    charted = set(re.findall(r"(?:bertzoo|process)_[a-z_]+", " ".join(t["expr"] for p in dashboard["panels"]
                                                                     for t in p["targets"])))
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",), "info": ("_info",)}
    families = {f.name: f.type for f in Metrics().registry.collect()}
    exported = {name + suffix for name, kind in families.items() for suffix in suffixes[kind]}
    assert charted <= exported, charted - exported
    # Every bertzoo metric is charted; of the process's, CPU, memory and file descriptors.
    ours = {name for name in families if name.startswith("bertzoo_")}
    assert {name for name in ours if not any(c.startswith(name) for c in charted)} == set()
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= charted
