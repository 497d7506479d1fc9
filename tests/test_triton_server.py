"""The Triton repository's ``bertzoo`` model in a real Triton Inference Server, on the CPU.

The Triton here is the build the PyPI package nvidia-pytriton carries (benchmarks/peers/triton_setup.sh): its Python
backend, and no onnxruntime backend, so the model runs with ENGINE onnxruntime (the artifact's graphs in its own
process). Requests go over Triton's HTTP/REST inference protocol (KServe v2), and the answers are held against
bertzoo's own server. Skips without such an environment: set BERTZOO_TRITON_VENV to one (CI does).
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from benchmarks.common.triton_peer import start_triton
from bertzoo.export.exporter import ExportOptions, export_checkpoint
from bertzoo.serving.client import BertzooClient
from bertzoo.serving.grpc_server import ServerThread
from conftest import serve_config

VENV = Path(os.environ.get("BERTZOO_TRITON_VENV", "/nonexistent"))
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (VENV / "bin" / "tritonserver").exists(),
                                reason="no Triton: run benchmarks/peers/triton_setup.sh VENV and set "
                                       "BERTZOO_TRITON_VENV=VENV (CI does)")]


@pytest.fixture(scope="module")
def triton(tiny_artifact, tmp_path_factory):
    """(HTTP base URL, artifact) of a tritonserver serving the tiny model's ``bertzoo`` model alone (started as
    benchmarks/common/triton_peer.py starts it)."""
    run, _ = tiny_artifact
    folder = tmp_path_factory.mktemp("triton-server")
    artifact = folder / "artifact"
    export_checkpoint(run, artifact, ExportOptions(triton=True, parity_limit=8))
    settings = argparse.Namespace(artifact=str(artifact), triton=str(VENV), instances=2, threads=2)
    process, _, http_port = start_triton(settings, "fp32", folder)
    try:
        yield f"http://127.0.0.1:{http_port}", artifact
    finally:
        process.terminate()
        process.wait(60)


def infer(url: str, task: str, texts_a: list[str], texts_b: list[str] | None = None) -> list[dict]:
    """The ``bertzoo`` model's answers over KServe v2 HTTP, one row per item; HTTPError where Triton refuses."""
    columns = {"TASK": [task] * len(texts_a), "TEXT_A": texts_a, **({"TEXT_B": texts_b} if texts_b else {})}
    body = {"inputs": [{"name": name, "shape": [len(values), 1], "datatype": "BYTES", "data": values}
                       for name, values in columns.items()]}
    request = urllib.request.Request(f"{url}/v2/models/bertzoo/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        (output,) = json.loads(response.read())["outputs"]
    return [json.loads(value) for value in output["data"]]


def test_triton_answers_every_task_as_the_bertzoo_server(triton):
    url, artifact = triton
    sentences = ["a gorgeous, witty film", "dull and lifeless", "it rains"]
    a, b = ["How do I learn Python?", "A man plays guitar."], ["How can I learn Python?", "The sky is blue."]
    question, context = "When was the tower finished?", "The Eiffel Tower in Paris was finished in 1889 by Eiffel."
    with ServerThread(serve_config(artifact)) as running, BertzooClient(f"127.0.0.1:{running.port}") as client:
        sentiment = client.sentiment(sentences).results
        similarity = client.similarity(list(zip(a, b, strict=True))).results
        qa = client.qa([(question, context)]).results
        embed = client.embed(sentences).embeddings
    got = infer(url, "sentiment", sentences)
    assert [g["label"] for g in got] == [r.label for r in sentiment]
    np.testing.assert_allclose([g["probabilities"] for g in got], [list(r.probabilities) for r in sentiment], atol=1e-6)
    np.testing.assert_allclose([g["score"] for g in infer(url, "similarity", a, b)], [r.score for r in similarity],
                               atol=1e-5)
    (got,) = infer(url, "qa", [question], [context])
    assert (got["answer"], got["start_char"], got["no_answer"]) == (qa[0].answer, qa[0].start_char, qa[0].no_answer)
    np.testing.assert_allclose([g["values"] for g in infer(url, "embed", sentences)],
                               [list(e.values) for e in embed], atol=1e-6)


def test_concurrent_requests_each_get_their_own_answer_or_error(triton):
    url, _ = triton
    sentences = [f"sentence number {i} is {'good' if i % 2 else 'bad'}" for i in range(24)]
    alone = {s: infer(url, "embed", [s])[0]["values"] for s in sentences[:4]}

    def one(i: int):
        if i % 8 == 7:  # a bad request among good ones
            try:
                infer(url, "poetry", ["x"])
            except urllib.error.HTTPError as e:
                return json.loads(e.read())["error"]
            return "no error"
        return infer(url, "embed", [sentences[i]])[0]["values"]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(len(sentences))))
    for i, result in enumerate(results):
        if i % 8 == 7:
            assert "TASK 'poetry'" in result
        else:
            assert len(result) == len(alone[sentences[0]])
    for s, values in alone.items():
        np.testing.assert_allclose(results[sentences.index(s)], values, atol=1e-6)
