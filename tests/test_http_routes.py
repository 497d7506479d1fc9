"""The HTTP routes beside the gRPC port (`--http-port`), with real clients: the `openai` package, urllib, curl; their
answers against the gRPC RPCs' for the same texts."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertzoo.serving.client import BertzooClient
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.serving.model import load_served_model
from conftest import ControlledBackend, free_port, serve_config
from server_process import ServerProcess, metric

TEXTS = ["a gorgeous , witty , seductive movie .", "the plot is dull", "hello"]
PAIRS = [("how old are you", "what is your age"), ("a cat sits", "a dog runs")]


def call(port: int, path: str, body: object | None = None, headers: dict | None = None,
         raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers or {},
                                     method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def http_server(tiny_artifact):
    _, artifact = tiny_artifact
    port = free_port()
    with ServerThread(serve_config(artifact, http_port=port)) as running:
        yield running, port


def test_openai_client_gets_the_embed_rpcs_vectors(http_server):
    openai = pytest.importorskip("openai")
    running, port = http_server
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    got = client.embeddings.create(input=TEXTS, model="any-name")  # the package asks for base64 and decodes it
    as_floats = client.embeddings.create(input=TEXTS[0], model="any-name", encoding_format="float")
    with BertzooClient(f"127.0.0.1:{running.port}") as grpc_client:
        expected = np.array([e.values for e in grpc_client.embed(TEXTS).embeddings])
    assert [d.index for d in got.data] == [0, 1, 2]
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), expected, atol=1e-6)
    np.testing.assert_allclose(as_floats.data[0].embedding, expected[0], atol=1e-6)
    assert got.usage.prompt_tokens == got.usage.total_tokens > len(TEXTS) * 2  # [CLS] and [SEP] at least
    assert [m.id for m in client.models.list().data] == [got.model]
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(input="x", model="any-name", dimensions=3)


def test_task_routes_answer_as_the_rpcs_do(http_server):
    running, port = http_server
    with BertzooClient(f"127.0.0.1:{running.port}") as grpc_client:
        expected = {"sentiment": grpc_client.sentiment(TEXTS), "paraphrase": grpc_client.paraphrase(PAIRS),
                    "similarity": grpc_client.similarity(PAIRS),
                    "qa": grpc_client.qa([("who went home?", "Bob went home after the game.")])}
    bodies = {"sentiment": {"texts": TEXTS}, "paraphrase": {"pairs": [{"text_a": a, "text_b": b} for a, b in PAIRS]},
              "similarity": {"pairs": [{"text_a": a, "text_b": b} for a, b in PAIRS]},
              "qa": {"items": [{"question": "who went home?", "context": "Bob went home after the game."}]}}
    for task, body in bodies.items():
        status, answer = call(port, f"/{task}", body)
        assert status == 200, answer
        want = expected[task].results
        assert len(answer["results"]) == len(want)
        if task == "sentiment":
            assert [r["label"] for r in answer["results"]] == [r.label for r in want]
            np.testing.assert_allclose([r["probabilities"] for r in answer["results"]],
                                       [list(r.probabilities) for r in want], atol=1e-6)
        elif task == "qa":
            assert [(r["answer"], r["start_char"]) for r in answer["results"]] == [(r.answer, r.start_char) for r in want]
        else:
            key = "probability" if task == "paraphrase" else "score"
            np.testing.assert_allclose([r[key] for r in answer["results"]], [getattr(r, key) for r in want], atol=1e-6)
        assert set(answer["timing"]) >= {"queue_seconds", "inference_seconds", "total_seconds"}
    status, info = call(port, "/info")
    assert status == 200 and info["tasks"] == ["sentiment", "paraphrase", "similarity", "qa"]
    assert call(port, "/health") == (200, {"status": "SERVING"})
    registry = running.metrics.registry  # the same series as the RPCs', told apart by their protocol label
    for protocol in ("grpc", "http"):
        assert registry.get_sample_value("bertzoo_requests_total", {"task": "paraphrase", "code": "OK",
                                                                    "protocol": protocol}) >= 1, protocol
        assert registry.get_sample_value("bertzoo_request_seconds_count", {"task": "paraphrase",
                                                                           "protocol": protocol}) >= 1, protocol


@pytest.mark.parametrize(("path", "body", "status", "says"), [
    ("/sentiment", b"not json", 400, "not JSON"),
    ("/sentiment", b"[1, 2]", 400, "JSON object"),
    ("/sentiment", b'{"texts": [3]}', 400, "texts"),
    ("/sentiment", b'{"text": ["misspelt field"]}', 400, "text"),
    ("/sentiment", b'{"texts": []}', 400, "texts"),
    ("/sentiment", json.dumps({"texts": ["x" * 20001]}).encode(), 400, "texts[0]"),
    ("/v1/embeddings", b'{"input": []}', 400, "input"),
    ("/v1/embeddings", b'{"input": [[1, 2, 3]]}', 400, "token arrays"),
    ("/v1/embeddings", b'{"input": "x", "encoding_format": "int8"}', 400, "encoding_format"),
    ("/nowhere", b"{}", 404, "/nowhere"),
])
def test_every_malformed_body_is_one_clear_error(http_server, path, body, status, says):
    _, port = http_server
    got, answer = call(port, path, raw=body, headers={"Content-Type": "application/json"})
    message = answer["error"]["message"] if path.startswith("/v1/") else answer["error"]
    assert got == status and says in message, answer
    if path.startswith("/v1/"):
        assert answer["error"]["type"] == "invalid_request_error"  # OpenAI's error object
    else:
        assert answer["code"] == ("NOT_FOUND" if status == 404 else "INVALID_ARGUMENT")


def test_x_request_timeout_is_the_requests_deadline_and_a_trickled_body_gets_408(tiny_artifact):
    """A model slowed to 1.5 s a batch: the request that occupies it runs; one queued behind it with a 0.5 s
    X-Request-Timeout is answered 504 at its deadline and never reaches the model (counted DEADLINE_EXCEEDED under
    protocol "http"); a bad header is a 400 naming it; a body that stops coming is a 408 within the deadline."""
    _, artifact = tiny_artifact
    backends: list[ControlledBackend] = []

    def loader(config):
        served = load_served_model(config)
        served.backend = backends.append(ControlledBackend(served.backend)) or backends[0]
        return served

    port = free_port()
    with ServerThread(serve_config(artifact, http_port=port), loader) as running:
        backend = backends[0]
        backend.batch_rows.clear()
        backend.delay = 1.5
        first = threading.Thread(target=call, args=(port, "/sentiment", {"texts": ["occupies the model"]}))
        first.start()
        while not backend.batch_rows:
            time.sleep(0.01)
        started = time.monotonic()
        status, body = call(port, "/sentiment", {"texts": ["too late"]}, {"X-Request-Timeout": "0.5"})
        waited = time.monotonic() - started
        first.join()
        assert status == 504 and body["code"] == "DEADLINE_EXCEEDED" and "X-Request-Timeout" in body["error"]
        assert 0.45 < waited < 1.3, waited  # at its deadline, not when the model freed
        assert backend.batch_rows == [1]  # the late request never ran
        assert running.metrics.registry.get_sample_value("bertzoo_request_failures_total", {
            "task": "sentiment", "code": "DEADLINE_EXCEEDED", "reason": "deadline", "protocol": "http"}) == 1
        backend.delay = 0.0
        status, body = call(port, "/embed", {"texts": ["x"]}, {"X-Request-Timeout": "soon"})
        assert status == 400 and "X-Request-Timeout must be a number of seconds > 0, got 'soon'" in body["error"]
        assert call(port, "/embed", {"texts": ["x"]}, {"X-Request-Timeout": "5"})[0] == 200

        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:  # 100 bytes promised, 10 sent
            raw.sendall(b"POST /sentiment HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"X-Request-Timeout: 0.5\r\nContent-Length: 100\r\n\r\n{\"texts\": ")
            started = time.monotonic()
            reply = raw.recv(4096).decode()
            assert time.monotonic() - started < 2.0
        assert reply.startswith("HTTP/1.1 408") and "did not arrive within 0.5 s" in reply, reply
        assert running.metrics.registry.get_sample_value("bertzoo_request_failures_total", {
            "task": "sentiment", "code": "DEADLINE_EXCEEDED", "reason": "slow_body", "protocol": "http"}) == 1


def test_an_oversized_body_is_refused_413(tiny_artifact):
    _, artifact = tiny_artifact
    port = free_port()
    with ServerThread(serve_config(artifact, http_port=port, max_message_bytes=1024)):
        status, answer = call(port, "/sentiment", {"texts": ["word " * 400]})
    assert status == 413 and "1024 bytes" in answer["error"] and answer["code"] == "RESOURCE_EXHAUSTED"


def test_a_token_guards_every_route_but_health_and_one_header_only(tiny_artifact):
    _, artifact = tiny_artifact
    port = free_port()
    with ServerThread(serve_config(artifact, http_port=port, auth_token="s3cret")):
        assert call(port, "/health")[0] == 200
        assert call(port, "/sentiment", {"texts": ["x"]})[0] == 401
        assert call(port, "/sentiment", {"texts": ["x"]}, {"Authorization": "Bearer guess"})[0] == 401
        status, answer = call(port, "/v1/embeddings", {"input": "x"}, {"Authorization": "Bearer s3cret"})
        assert status == 200 and len(answer["data"]) == 1
        # Two Authorization headers, right then wrong: refused (urllib sends one; a raw request sends both).
        request = ("POST /sentiment HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Authorization: Bearer s3cret\r\nAuthorization: Bearer guess\r\nContent-Length: 15\r\n"
                   "Connection: close\r\n\r\n{\"texts\":[\"x\"]}")
        import socket

        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(request.encode())
            reply = b"".join(iter(lambda: raw.recv(4096), b""))
        assert reply.startswith(b"HTTP/1.1 401") and b"more than one authorization header" in reply


@pytest.mark.slow
def test_front_ends_serve_http_and_curl_reaches_it(tiny_artifact):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    _, artifact = tiny_artifact
    with ServerProcess(artifact) as server:
        server.wait_ready()
        for _ in range(4):  # connections of their own, over both front ends
            out = subprocess.run(["curl", "-s", f"http://127.0.0.1:{server.http_port}/v1/embeddings", "-H",
                                  "Content-Type: application/json", "-d", '{"input": "hello", "model": "m"}'],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            assert len(json.loads(out)["data"][0]["embedding"]) > 0
        assert call(server.http_port, "/health") == (200, {"status": "SERVING"})
        assert metric(server.metrics(), "bertzoo_requests_total", task="embed", code="OK", protocol="http") == 4
        assert server.stop() == 0
    assert "and HTTP port" in server.output


def test_triton_http_client_reads_health_metadata_and_answers(http_server):
    """The KServe v2 routes with Triton's own HTTP client, unchanged: health, metadata, and infer with its binary
    tensors (its default) and with JSON data, each task's answer the RPC's."""
    httpclient = pytest.importorskip("tritonclient.http")
    running, port = http_server
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("bertzoo")
    metadata = client.get_model_metadata("bertzoo")
    assert [i["name"] for i in metadata["inputs"]] == ["TASK", "TEXT_A", "TEXT_B"]
    assert client.get_server_metadata()["name"] == "bertzoo"

    def infer(task: str, texts_a: list[str], texts_b: list[str] | None, binary: bool) -> list[dict]:
        columns = {"TASK": [task], "TEXT_A": texts_a, **({"TEXT_B": texts_b} if texts_b else {})}
        inputs = []
        for name, values in columns.items():
            tensor = httpclient.InferInput(name, [len(values), 1], "BYTES")
            tensor.set_data_from_numpy(np.array(values, dtype=np.object_).reshape(-1, 1), binary_data=binary)
            inputs.append(tensor)
        result = client.infer("bertzoo", inputs, outputs=[httpclient.InferRequestedOutput("ANSWER", binary_data=binary)])
        return [json.loads(x) for x in result.as_numpy("ANSWER").reshape(-1)]

    with BertzooClient(f"127.0.0.1:{running.port}") as grpc_client:
        sentiment, pairs = grpc_client.sentiment(TEXTS), grpc_client.similarity(PAIRS)
        embedded = grpc_client.embed(TEXTS[:1])
    for binary in (True, False):
        assert [a["label"] for a in infer("sentiment", TEXTS, None, binary)] == [r.label for r in sentiment.results]
        np.testing.assert_allclose([a["score"] for a in infer("similarity", [a for a, _ in PAIRS], [b for _, b in PAIRS],
                                                              binary)], [r.score for r in pairs.results], atol=1e-6)
        np.testing.assert_allclose(infer("embed", TEXTS[:1], None, binary)[0]["values"],
                                   embedded.embeddings[0].values, atol=1e-6)
    with pytest.raises(Exception, match="TEXT_B"):  # a pair task without its second texts: one clear error
        infer("paraphrase", TEXTS, None, True)
    status, answer = call(port, "/v2/models/other/infer", {"inputs": []})
    assert status == 404 and "bertzoo" in answer["error"]
    status, answer = call(port, "/v2/models/bertzoo/infer", {"inputs": [{"name": "TEXT_A", "datatype": "FP32",
                                                                         "shape": [1], "data": [1.0]}]})
    assert status == 400 and "BYTES" in answer["error"]


JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                                     st.text(max_size=40)),
                           lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                           max_leaves=12)
ROUTE_FIELDS = {"/sentiment": "texts", "/embed": "texts", "/paraphrase": "pairs", "/similarity": "pairs", "/qa": "items",
                "/v1/embeddings": "input", "/v2/models/bertzoo/infer": "inputs"}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(sorted(ROUTE_FIELDS)), value=JSON_VALUES, raw=st.one_of(st.none(), st.binary(max_size=200)))
def test_fuzzed_http_bodies_get_an_answer_or_a_client_error_and_never_hurt_the_server(http_server, caplog, route,
                                                                                        value, raw):
    """Random JSON under each route's own field (and random bytes): 200 or a 4xx with a JSON error, never a 5xx or a
    traceback in the log."""
    _, port = http_server
    body = raw if raw is not None else json.dumps({ROUTE_FIELDS[route]: value}).encode()
    caplog.set_level("WARNING", logger="bertzoo.serving")
    status, answer = call(port, route, raw=body, headers={"Content-Type": "application/json"})
    assert status == 200 or (400 <= status < 500 and "error" in answer), (status, answer)
    assert "Traceback" not in caplog.text and "unexpected error" not in caplog.text
    assert call(port, "/health") == (200, {"status": "SERVING"})
