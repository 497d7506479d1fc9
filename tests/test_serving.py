"""The gRPC server end to end on 127.0.0.1 with a tiny exported model: every RPC answers what the evaluation pipeline
computes, health and reflection, input validation, metrics, and the PyTorch reference backend."""

from __future__ import annotations

import dataclasses
import re
import urllib.request

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from prometheus_client.parser import text_string_to_metric_families

from bertzoo import pipeline
from bertzoo import tasks as T
from bertzoo.artifact import load_manifest
from bertzoo.data import QAExample, SentenceExample
from bertzoo.datafiles import load_split, samples_dir
from bertzoo.serving.backends import OnnxRuntimeBackend
from bertzoo.serving.client import BertzooClient, channel_options
from bertzoo.serving.config import ServeConfig
from bertzoo.serving.engine import EMBED, Work, prepare_inputs, run_batch
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.serving.model import load_served_model
from bertzoo.tokenization import Tokenizer
from conftest import free_port, serve_config

LONG_TEXT = "a remarkably long and winding sentence " * 40  # far over 128 tokens


@pytest.fixture(scope="module")
def served(tiny_artifact):
    _, artifact = tiny_artifact
    metrics_port = free_port()
    with ServerThread(serve_config(artifact, metrics_port=metrics_port)) as running, \
            BertzooClient(f"127.0.0.1:{running.port}", timeout=30) as client:
        yield running, client, metrics_port


@pytest.fixture(scope="module")
def reference(tiny_artifact):
    """The same artifact through the evaluation pipeline: what the server must answer."""
    _, artifact = tiny_artifact
    manifest = load_manifest(artifact)
    return (OnnxRuntimeBackend(artifact, threads=1, spinning=False), Tokenizer.from_file(artifact / "tokenizer.json"),
            T.Limits(**manifest["limits"]), manifest)


def test_sentence_and_pair_tasks_answer_what_the_evaluation_pipeline_computes(served, reference):
    _, client, _ = served
    backend, tokenizer, limits, _ = reference
    sentences = load_split(samples_dir(), "sentiment", "dev")[:10]
    sentences.append(SentenceExample("long", LONG_TEXT, None))  # truncated to 128 tokens, as in evaluation
    response = client.sentiment([e.text for e in sentences])
    expected = T.postprocess_sentiment(pipeline.predict(backend, "sentiment", sentences, tokenizer, limits),
                                       T.task_spec("sentiment"))
    assert [r.label for r in response.results] == [e.label for e in expected]
    assert [r.label_index for r in response.results] == [e.label_index for e in expected]
    np.testing.assert_allclose([r.probabilities for r in response.results], [e.probabilities for e in expected],
                               atol=1e-5)
    assert list(response.labels) == list(T.task_spec("sentiment").labels)
    assert response.timing.total_seconds >= response.timing.inference_seconds > 0

    for task, postprocess in (("paraphrase", T.postprocess_paraphrase), ("similarity", T.postprocess_similarity)):
        pairs = load_split(samples_dir(), task, "dev")[:8]
        expected = postprocess(pipeline.predict(backend, task, pairs, tokenizer, limits))
        call = client.paraphrase if task == "paraphrase" else client.similarity
        results = call([(e.text_a, e.text_b) for e in pairs]).results
        got = [r.probability if task == "paraphrase" else r.score for r in results]
        np.testing.assert_allclose(got, expected, atol=1e-5)
        if task == "paraphrase":
            assert [r.is_paraphrase for r in results] == [bool(p >= 0.5) for p in expected]


def test_qa_answers_the_pipeline_spans_with_context_offsets(served, reference):
    _, client, _ = served
    backend, tokenizer, limits, manifest = reference
    examples = load_split(samples_dir(), "qa", "dev")[:6]
    long_context = " ".join(e.context for e in load_split(samples_dir(), "qa", "dev")[::10])
    examples.append(QAExample("long", "Who ruled Normandy?", long_context, (), (), True))
    assert len(T.encode_qa(tokenizer, examples[-1].question, long_context, limits)) > 2  # several windows
    expected = pipeline.predict(backend, "qa", examples, tokenizer, limits,
                                null_threshold=manifest["model"]["qa_null_threshold"])
    results = client.qa([(e.question, e.context) for e in examples]).results
    for example, got, want in zip(examples, results, expected, strict=True):
        assert (got.answer, got.start_char, got.end_char, got.no_answer) == (
            want.answer, want.start_char, want.end_char, want.no_answer)
        assert got.score == pytest.approx(want.score, abs=1e-4)
        assert got.null_score == pytest.approx(want.null_score, abs=1e-4)
        if not got.no_answer:
            assert example.context[got.start_char:got.end_char] == got.answer


def test_one_encoder_pass_serves_every_task_at_once(reference):
    backend, tokenizer, limits, manifest = reference
    sentences = load_split(samples_dir(), "sentiment", "dev")[:3]
    pairs = load_split(samples_dir(), "similarity", "dev")[:2]
    questions = load_split(samples_dir(), "qa", "dev")[:2]
    a, b = T.encode_pairs_separately(tokenizer, [p.text_a for p in pairs], [p.text_b for p in pairs], limits)
    works = [Work("sentiment", (e,)) for e in T.encode_sentences(tokenizer, [s.text for s in sentences], limits)]
    works += [Work("similarity", (x, y)) for x, y in zip(a, b, strict=True)]
    works += [Work("qa", tuple(T.encode_qa(tokenizer, q.question, q.context, limits))) for q in questions]
    works += [Work(EMBED, (e,)) for e in T.encode_sentences(tokenizer, ["embed me"], limits)]
    outputs = run_batch(backend, works, prepare_inputs(works, 128, tokenizer.pad_id), "mean")
    np.testing.assert_allclose(np.stack(outputs[:3]), pipeline.predict(backend, "sentiment", sentences, tokenizer, limits),
                               atol=1e-5)
    np.testing.assert_allclose(outputs[3:5], pipeline.predict(backend, "similarity", pairs, tokenizer, limits), atol=1e-5)
    threshold = manifest["model"]["qa_null_threshold"]
    spans = [T.postprocess_qa(q.context, w.rows, starts, ends, limits, null_threshold=threshold)
             for q, w, (starts, ends) in zip(questions, works[5:7], outputs[5:7], strict=True)]
    expected = pipeline.predict(backend, "qa", questions, tokenizer, limits, null_threshold=threshold)
    assert [(s.answer, s.start_char, s.no_answer) for s in spans] == [
        (e.answer, e.start_char, e.no_answer) for e in expected]
    assert outputs[7].shape == (32,) and np.linalg.norm(outputs[7]) == pytest.approx(1.0, abs=1e-5)


def test_embeddings_are_mean_pooled_without_padding_and_unit_length(served, reference):
    _, client, _ = served
    backend, tokenizer, limits, _ = reference
    texts = ["a short one", "a somewhat longer sentence about nothing in particular", "short"]
    response = client.embed(texts)
    states = pipeline.encode_states(backend, T.encode_sentences(tokenizer, texts, limits), tokenizer.pad_id, 8)
    expected = np.stack([s.mean(axis=0) for s, _ in states])  # each trimmed to its own tokens: no padding
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    got = np.array([e.values for e in response.embeddings])
    assert response.dimensions == got.shape[1] == 32
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_model_info_reports_tasks_labels_limits_and_versions(served):
    _, client, _ = served
    info = client.model_info()
    assert list(info.tasks) == ["sentiment", "paraphrase", "similarity", "qa"]
    assert info.sentiment_labels[0] == "very negative" and list(info.paraphrase_labels) == ["not_duplicate", "duplicate"]
    assert (info.limits.max_seq_length, info.limits.qa_max_length, info.limits.qa_doc_stride) == (128, 128, 32)
    assert (info.limits.max_items_per_request, info.limits.overlong, info.limits.stream_window) == (64, "truncate", 32)
    assert (info.backend, info.variant, info.pooling, info.embedding_dimensions) == ("onnxruntime", "fp32", "mean", 32)
    assert list(info.length_buckets) == [16, 32, 64, 128]
    assert info.artifact_versions["onnx"] and info.runtime_versions["grpcio"] == grpc.__version__


def test_health_is_serving_and_reflection_lists_the_services(served):
    _, client, _ = served
    assert client.health() == "SERVING" and client.health("bertzoo.v1.Bertzoo") == "SERVING"
    with pytest.raises(grpc.RpcError) as error:
        client.health("no.such.Service")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    database = ProtoReflectionDescriptorDatabase(client.channel)
    assert set(database.get_services()) == {"bertzoo.v1.Bertzoo", "grpc.health.v1.Health",
                                            "grpc.reflection.v1alpha.ServerReflection"}
    service = DescriptorPool(database).FindServiceByName("bertzoo.v1.Bertzoo")
    unary = ["Sentiment", "Paraphrase", "Similarity", "QA", "Embed"]
    assert [m.name for m in service.methods] == [*unary, "ModelInfo", *(f"{m}Stream" for m in unary)]


@pytest.mark.parametrize(("call", "args", "message"), [
    ("sentiment", [], "texts: no items; send 1 to 64"),
    ("sentiment", ["fine", "   "], "texts[1] is empty"),
    ("sentiment", ["x" * 20001], "texts[0] has 20001 characters, the limit is 20000 (max_text_chars)"),
    ("sentiment", ["fine"] * 65, "texts: 65 items, the limit is 64 per request (max_items)"),
    ("embed", ["fine", ""], "texts[1] is empty"),
    ("paraphrase", [("fine", "")], "pairs[0].text_b is empty"),
    ("similarity", [("fine", "fine"), ("", "fine")], "pairs[1].text_a is empty"),
    ("qa", [("", "Some context.")], "items[0].question is empty; a QA item needs a question and a context"),
    ("qa", [("Who?", " ")], "items[0].context is empty"),
])
def test_bad_input_is_invalid_argument_naming_the_field_and_limit(served, call, args, message):
    _, client, _ = served
    with pytest.raises(grpc.RpcError) as error:
        getattr(client, call)(args)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == message
    assert client.sentiment(["still fine"]).results  # nothing disturbed


def scrape(metrics_port: int) -> tuple[str, dict]:
    """The metrics endpoint's text, and its samples by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return text, {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_endpoint_serves_the_histograms_gauges_and_counters(served):
    _, client, metrics_port = served
    client.sentiment(["counted"])
    with pytest.raises(grpc.RpcError):
        client.sentiment([""])
    text, samples = scrape(metrics_port)
    for name in ("request", "queue", "tokenize", "inference"):
        assert re.search(rf'^bertzoo_{name}_seconds_bucket{{.*task="sentiment"', text, re.M), name
    for name in ("bertzoo_batch_size_bucket", "bertzoo_batch_tokens_bucket", "bertzoo_batch_seconds_count",
                 "bertzoo_queue_depth", "bertzoo_queue_sequences", "bertzoo_inflight_requests"):
        assert re.search(rf"^{name}\b", text, re.M), name
    assert samples[("bertzoo_requests_total", (("code", "OK"), ("protocol", "grpc"), ("task", "sentiment")))] >= 1
    assert samples[("bertzoo_request_failures_total", (("code", "INVALID_ARGUMENT"), ("protocol", "grpc"),
                                                       ("reason", "empty_text"), ("task", "sentiment")))] >= 1
    assert samples[("process_resident_memory_bytes", ())] > 0 and ("process_open_fds", ()) in samples
    assert not re.search(r"_created\b", text)  # no timestamp series next to every counter and histogram


def test_every_served_task_is_exported_at_zero_before_its_first_request(tiny_artifact):
    # rate() needs a sample from before the first request: a series that first appears already counting hides it.
    _, artifact = tiny_artifact
    metrics_port = free_port()
    with ServerThread(serve_config(artifact, metrics_port=metrics_port, http_port=free_port())):
        _, samples = scrape(metrics_port)
    served_tasks = (*load_manifest(artifact)["model"]["tasks"], EMBED)
    for task in served_tasks:
        for name in ("queue", "tokenize", "inference"):
            assert samples[(f"bertzoo_{name}_seconds_count", (("task", task),))] == 0, (name, task)
        for protocol in ("grpc", "http"):  # the HTTP routes' series too, where the HTTP port is open
            assert samples[("bertzoo_request_seconds_count", (("protocol", protocol), ("task", task)))] == 0, task
            assert samples[("bertzoo_requests_total", (("code", "OK"), ("protocol", protocol), ("task", task)))] == 0
    assert {labels for name, labels in samples if name == "bertzoo_request_seconds_count"} == \
        {(("protocol", protocol), ("task", task)) for task in served_tasks for protocol in ("grpc", "http")}


def test_the_largest_allowed_request_passes_and_a_larger_one_is_refused_and_counted(served, tiny_artifact):
    _, client, _ = served
    # 64 texts of 20,000 4-byte characters (5.1 MB): over gRPC's 4 MiB default, within the server's default limit.
    widest = ["\U0001F600" * 20000] * 64
    assert len(client.embed(widest).embeddings) == 64
    _, artifact = tiny_artifact
    metrics_port = free_port()
    with ServerThread(serve_config(artifact, max_message_bytes=4096, metrics_port=metrics_port)) as running, \
            BertzooClient(f"127.0.0.1:{running.port}", timeout=30, options=channel_options(retries=False)) as small:
        with pytest.raises(grpc.RpcError) as error:
            small.sentiment(["x" * 5000])
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over the server's limit of 4096 (--max-message-bytes)" in error.value.details()
        assert small.sentiment(["short enough"]).results
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    assert re.search(r'^bertzoo_request_failures_total{code="RESOURCE_EXHAUSTED",protocol="grpc",'
                     r'reason="message_too_large",task="sentiment"} 1\.0$', text, re.M)


@pytest.fixture(scope="module")
def strict(tiny_artifact):
    """A server that rejects overlong texts, takes 4 items per request and has no QA head."""
    _, artifact = tiny_artifact

    def without_qa(config: ServeConfig):
        served = load_served_model(config)
        served.spec = dataclasses.replace(served.spec, tasks=("sentiment", "paraphrase", "similarity"))
        return served

    with ServerThread(serve_config(artifact, overlong="reject", max_items=4), without_qa) as running, \
            BertzooClient(f"127.0.0.1:{running.port}") as client:
        yield client


@pytest.mark.parametrize(("call", "args", "message"), [
    ("qa", [("Who?", "Nobody.")], "this model has no 'qa' head; it serves sentiment, paraphrase, similarity"),
    ("sentiment", ["fine", LONG_TEXT], "texts[1] has 242 tokens, the limit is 128 ([CLS] and [SEP] included"),
    ("similarity", [("fine", LONG_TEXT)], "pairs[0].text_b has 242 tokens, the limit is 128"),
    ("embed", ["fine"] * 5, "texts: 5 items, the limit is 4 per request"),
])
def test_limits_and_missing_tasks_are_refused(strict, call, args, message):
    with pytest.raises(grpc.RpcError) as error:
        getattr(strict, call)(args)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(message)


def test_texts_within_the_limit_are_answered_the_same_under_both_overlong_policies(served, strict):
    _, client, _ = served
    texts = ["a lovely film", "a dull film " * 10]
    lenient, rejecting = client.sentiment(texts).results, strict.sentiment(texts).results
    np.testing.assert_allclose([r.probabilities for r in lenient], [r.probabilities for r in rejecting], atol=1e-6)


def test_the_pytorch_reference_backend_serves_a_checkpoint(tiny_artifact, served):
    from bertzoo.serving.backends import TorchBackend
    from bertzoo.trainer.checkpoint import load_model

    run, artifact = tiny_artifact
    model, _, directory = load_model(run)
    tokenizer = Tokenizer.from_file(directory / "tokenizer.json")
    manifest = load_manifest(artifact)
    pairs = load_split(samples_dir(), "similarity", "dev")[:6]
    expected = T.postprocess_similarity(pipeline.predict(TorchBackend(model), "similarity", pairs, tokenizer,
                                                         T.Limits(**manifest["limits"])))
    with ServerThread(serve_config(run, backend="torch")) as running, \
            BertzooClient(f"127.0.0.1:{running.port}") as client:
        assert client.model_info().backend == "torch"
        got = [r.score for r in client.similarity([(e.text_a, e.text_b) for e in pairs]).results]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    _, onnx_client, _ = served  # and the exported graphs agree with it
    np.testing.assert_allclose([r.score for r in onnx_client.similarity([(e.text_a, e.text_b) for e in pairs]).results],
                               expected, atol=1e-4)


def test_two_engine_instances_answer_as_one(tiny_artifact, reference, caplog):
    """--instances 2: concurrent requests spread over two engines, and every answer is the pipeline's. The log says
    the port is gRPC's, and counts the instances as --instances does, the long-request lane's own one named apart."""
    from concurrent.futures import ThreadPoolExecutor

    _, artifact = tiny_artifact
    backend, tokenizer, limits, _ = reference
    sentences = load_split(samples_dir(), "sentiment", "dev")[:40]
    expected = T.postprocess_sentiment(pipeline.predict(backend, "sentiment", sentences, tokenizer, limits),
                                       T.task_spec("sentiment"))
    caplog.set_level("INFO", logger="bertzoo.serving")
    with ServerThread(serve_config(artifact, instances=2, threads=2)) as running, \
            BertzooClient(f"127.0.0.1:{running.port}", timeout=30) as client:
        assert "warmed up 2 engine instances (+1 for the long-request lane) on length buckets" in caplog.text
        assert f"listening on 127.0.0.1:{running.port} for gRPC over HTTP/2 (plaintext;" in caplog.text
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda e: client.sentiment([e.text]).results[0], sentences))
    np.testing.assert_allclose([a.probabilities for a in answers], [e.probabilities for e in expected], atol=1e-5)
    assert [a.label for a in answers] == [e.label for e in expected]


@pytest.mark.parametrize("pin", [True, False])
def test_engine_instances_run_on_cores_of_their_own(tiny_artifact, pin):
    """--instances 2 with threads that share out every usable core: each instance's worker on its half of them (with
    --no-pin-instances, both anywhere); the long lane's worker anywhere."""
    import os
    import threading

    from bertzoo.serving.workers import usable_cores

    cores = usable_cores()
    if not hasattr(os, "sched_getaffinity") or len(cores) < 2 or len(cores) % 2:
        pytest.skip("needs Linux CPU affinity and an even number of usable cores")
    _, artifact = tiny_artifact
    with ServerThread(serve_config(artifact, instances=2, threads=len(cores), pin_instances=pin)):
        placed = {t.name: os.sched_getaffinity(t.native_id) for t in threading.enumerate()
                  if t.name.startswith(("bertzoo-main", "bertzoo-long"))}
    half = len(cores) // 2
    expected = ({"bertzoo-main_0": set(cores[:half]), "bertzoo-main1_0": set(cores[half:])} if pin else
                {"bertzoo-main_0": set(cores), "bertzoo-main1_0": set(cores)})
    assert placed == {**expected, "bertzoo-long_0": set(cores)}


def test_instances_are_for_the_cpu_engines(tiny_artifact):
    _, artifact = tiny_artifact
    with pytest.raises(ValueError, match="instances > 1 is for the CPU engines"):
        serve_config(artifact, instances=2, device="cuda")
    assert serve_config(artifact, instances=2, threads=4).engine_threads == 2
    assert serve_config(artifact, instances=3, threads=2).engine_threads == 1


def test_warm_up_runs_the_largest_batches_the_settings_allow(tiny_artifact):
    """The engine meets its worst batches at start-up, so its memory is at its ceiling before the first request:
    the longest sequences as many as the token budget takes, and the most rows at the widest width that fills it."""
    from bertzoo.serving.config import BatchSettings
    from bertzoo.serving.model import largest_batches, warm_up

    assert largest_batches(BatchSettings(), 384) == [(42, 384), (64, 256)]
    assert largest_batches(BatchSettings(max_batch_tokens=2048), 384) == [(5, 384), (64, 32)]
    assert largest_batches(BatchSettings(max_batch_size=8, max_batch_tokens=100_000), 384) == [(8, 384)]
    _, artifact = tiny_artifact
    served = load_served_model(serve_config(artifact))
    shapes, encode = [], served.backend.encode

    def recording_encode(batch):
        shapes.append(batch["input_ids"].shape)
        return encode(batch)

    served.backend.encode = recording_encode
    settings = BatchSettings(max_batch_size=16, max_batch_tokens=1024)
    warm_up(served, settings=settings)
    longest = served.spec.length_buckets[-1]
    assert shapes[:len(served.spec.length_buckets)] == [(1, b) for b in served.spec.length_buckets]
    assert shapes[len(served.spec.length_buckets):] == largest_batches(settings, longest)
    assert max(rows * width for rows, width in shapes) <= 1024
