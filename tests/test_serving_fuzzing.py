"""Fuzzed and undecodable requests get an answer or INVALID_ARGUMENT, never hurt the server."""

from __future__ import annotations

import logging

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertzoo.serving.client import BertzooClient
from bertzoo.serving.grpc_server import ServerThread
from conftest import TINY_SERVER_MAX_ITEMS as MAX_ITEMS
from conftest import serve_config

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
def test_fuzzed_requests_get_an_answer_or_invalid_argument_and_never_hurt_the_server(tiny_server, request):
    _, client = tiny_server
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
def test_undecodable_bytes_never_hurt_the_server(tiny_server, raw, method):
    _, client = tiny_server
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
            "bertzoo_request_failures_total",
            {"task": "health", "code": "INVALID_ARGUMENT", "reason": "malformed", "protocol": "grpc"}) == 20
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_the_server_is_unharmed_after_the_fuzzing(tiny_server):
    running, client = tiny_server
    assert client.health() == "SERVING" and client.sentiment(["still here"]).results
    codes = {s.labels["code"] for family in running.metrics.registry.collect() for s in family.samples
             if s.name == "bertzoo_request_failures_total"}
    assert codes <= {"INVALID_ARGUMENT"}  # bad input was refused; nothing failed inside the server
