"""The Triton repository's ``bertzoo`` Python model (text in, answers out) answers what bertzoo's server answers.

Here Triton's Python backend module (``triton_python_backend_utils``) is replaced by a small stand-in whose BLS calls
run the repository's own ONNX models on ONNX Runtime, as Triton's onnxruntime backend would: what is tested is
model.py's logic (inputs, tokenization, BLS calls, batching across requests, post-processing, one response per
request), on the real graphs. tests/test_triton_server.py runs the model in a real Triton; the configs' validity
against Triton's rules is tests/test_export.py's.
"""

from __future__ import annotations

import importlib
import json
import sys
import types

import numpy as np
import onnxruntime as ort
import pytest

from bertzoo.export.exporter import ExportOptions, export_checkpoint
from bertzoo.serving.client import BertzooClient
from bertzoo.serving.grpc_server import ServerThread
from conftest import serve_config


def triton_stand_in(repository):
    """The parts of triton_python_backend_utils model.py uses; BLS runs repository/<model>/1/model.onnx."""
    sessions: dict[str, ort.InferenceSession] = {}
    module = types.ModuleType("triton_python_backend_utils")

    class Tensor:
        def __init__(self, name, array):
            self._name, self._array = name, np.asarray(array)

        def name(self):
            return self._name

        def as_numpy(self):
            return self._array

    class TritonError:
        def __init__(self, message):
            self._message = message

        def message(self):
            return self._message

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self._outputs, self._error = output_tensors, error

        def output_tensors(self):
            return self._outputs

        def has_error(self):
            return self._error is not None

        def error(self):
            return self._error

    class InferenceRequest:
        def __init__(self, model_name, requested_output_names, inputs):
            self.model_name, self.outputs, self.inputs = model_name, requested_output_names, inputs

        def exec(self):
            if self.model_name not in sessions:
                sessions[self.model_name] = ort.InferenceSession(str(repository / self.model_name / "1" / "model.onnx"))
            values = sessions[self.model_name].run(self.outputs, {t.name(): t.as_numpy() for t in self.inputs})
            return InferenceResponse([Tensor(n, v) for n, v in zip(self.outputs, values, strict=True)])

    def by_name(holder, name):
        tensors = holder.inputs if isinstance(holder, Request) else holder.output_tensors()
        return next((t for t in tensors if t.name() == name), None)

    class Request:  # what Triton hands execute()
        def __init__(self, **inputs):
            # A batched model's inputs, as Triton shapes them: [rows, 1]
            self.inputs = [Tensor(k, np.array([s.encode() for s in v], dtype=np.object_).reshape(-1, 1))
                           for k, v in inputs.items()]

    module.Tensor, module.TritonError, module.InferenceResponse = Tensor, TritonError, InferenceResponse
    module.InferenceRequest, module.get_input_tensor_by_name, module.get_output_tensor_by_name = (
        InferenceRequest, by_name, by_name)
    return module, Request


@pytest.fixture(scope="module")
def text_model(tiny_artifact, tmp_path_factory, monkeypatch_module):
    run, _ = tiny_artifact
    artifact = tmp_path_factory.mktemp("triton") / "artifact"
    export_checkpoint(run, artifact, ExportOptions(triton=True, parity_limit=8))
    repository = artifact / "triton"
    stand_in, request = triton_stand_in(repository)
    monkeypatch_module.setitem(sys.modules, "triton_python_backend_utils", stand_in)
    module = importlib.import_module("bertzoo.export.triton_python_model")
    config = (repository / "bertzoo" / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and (repository / "bertzoo" / "1" / "model.py").is_file()
    return initialized(module, repository, {"ENCODER": "bertzoo_encoder"}), request, artifact


def initialized(module, repository, parameters: dict[str, str]):
    model = module.TritonPythonModel()
    model.initialize({"model_repository": str(repository / "bertzoo"), "model_version": "1",
                      "model_config": json.dumps({"parameters": {k: {"string_value": v}
                                                                 for k, v in parameters.items()}})})
    return model


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def answers(model, request, **inputs):
    (response,) = model.execute([request(**inputs)])
    assert not response.has_error(), response.error().message()
    return [json.loads(v) for v in response.output_tensors()[0].as_numpy().reshape(-1)]


def test_every_task_answers_as_the_bertzoo_server(text_model):
    model, request, artifact = text_model
    sentences = ["a gorgeous, witty film", "dull and lifeless", "it rains"]
    pairs = [("How do I learn Python?", "How can I learn Python?"), ("A man plays guitar.", "The sky is blue.")]
    question, context = "When was the tower finished?", "The Eiffel Tower in Paris was finished in 1889 by Eiffel."
    with ServerThread(serve_config(artifact)) as running, BertzooClient(f"127.0.0.1:{running.port}") as client:
        sentiment = client.sentiment(sentences).results
        paraphrase = client.paraphrase(pairs).results
        similarity = client.similarity(pairs).results
        qa = client.qa([(question, context)]).results
        embed = client.embed(sentences).embeddings
    got = answers(model, request, TASK=["sentiment"], TEXT_A=sentences)
    assert [g["label"] for g in got] == [r.label for r in sentiment]
    np.testing.assert_allclose([g["probabilities"] for g in got], [list(r.probabilities) for r in sentiment], atol=1e-5)
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    got = answers(model, request, TASK=["paraphrase"], TEXT_A=a, TEXT_B=b)
    np.testing.assert_allclose([g["probability"] for g in got], [r.probability for r in paraphrase], atol=1e-5)
    assert [g["is_paraphrase"] for g in got] == [r.is_paraphrase for r in paraphrase]
    got = answers(model, request, TASK=["similarity"], TEXT_A=a, TEXT_B=b)
    np.testing.assert_allclose([g["score"] for g in got], [r.score for r in similarity], atol=1e-5)
    (got,) = answers(model, request, TASK=["qa"], TEXT_A=[question], TEXT_B=[context])
    assert (got["answer"], got["start_char"], got["no_answer"]) == (qa[0].answer, qa[0].start_char, qa[0].no_answer)
    got = answers(model, request, TASK=["embed"], TEXT_A=sentences)
    np.testing.assert_allclose([g["values"] for g in got], [list(e.values) for e in embed], atol=1e-5)


def test_a_bad_request_gets_its_own_error_and_the_others_their_answers(text_model):
    model, request, _ = text_model
    good, unknown, unpaired = model.execute([request(TASK=["sentiment"], TEXT_A=["fine"]),
                                             request(TASK=["poetry"], TEXT_A=["x"]),
                                             request(TASK=["similarity"], TEXT_A=["a", "b"], TEXT_B=["c"])])
    assert not good.has_error() and len(good.output_tensors()[0].as_numpy()) == 1
    assert unknown.has_error() and "TASK 'poetry'" in unknown.error().message()
    assert unpaired.has_error() and "TEXT_B with one entry per TEXT_A entry" in unpaired.error().message()


def test_requests_that_arrive_together_share_one_encoder_batch_per_task(text_model):
    model, request, _ = text_model
    together = [request(TASK=["sentiment"] * 2, TEXT_A=["a gorgeous, witty film", "dull and lifeless"]),
                request(TASK=["embed"], TEXT_A=["it rains"]), request(TASK=["sentiment"], TEXT_A=["it rains"])]
    rows, encode = [], model.backend.encode
    model.backend.encode = lambda batch: rows.append(len(batch["input_ids"])) or encode(batch)
    try:
        batched = model.execute(together)
    finally:
        del model.backend.encode
    assert rows == [3, 1]  # both sentiment requests in one encoder call, then the embed request
    for response, alone in zip(batched, (model.execute([r])[0] for r in together), strict=True):
        got, want = ([json.loads(v) for v in r.output_tensors()[0].as_numpy().reshape(-1)] for r in (response, alone))
        key = "values" if "values" in want[0] else "probabilities"
        np.testing.assert_allclose([g[key] for g in got], [w[key] for w in want], atol=1e-5)


def test_a_request_that_fails_its_batch_gets_the_error_alone(text_model):
    model, request, _ = text_model
    encode = model.backend.encode

    def fragile(batch):  # an engine error that one request's input causes
        if (batch["attention_mask"].sum(axis=1) > 12).any():
            raise RuntimeError("longer than this engine takes")
        return encode(batch)

    model.backend.encode = fragile
    try:
        short, long, other = model.execute([request(TASK=["sentiment"], TEXT_A=["fine"]),
                                            request(TASK=["sentiment"], TEXT_A=["a very long sentence indeed " * 4]),
                                            request(TASK=["sentiment"], TEXT_A=["dull"])])
    finally:
        del model.backend.encode
    assert not short.has_error() and not other.has_error()
    assert long.has_error() and "longer than this engine takes" in long.error().message()


def test_the_in_process_engine_answers_as_the_repository_models(text_model):
    model, request, artifact = text_model
    module = sys.modules["bertzoo.export.triton_python_model"]
    local = initialized(module, artifact / "triton", {"ENGINE": "onnxruntime", "VARIANT": "fp32", "THREADS": "1"})
    a, b = ["How do I learn Python?", "A man plays guitar."], ["How can I learn Python?", "The sky is blue."]
    for inputs, key in ((dict(TASK=["sentiment"], TEXT_A=a), "probabilities"), (dict(TASK=["embed"], TEXT_A=b), "values"),
                        (dict(TASK=["similarity"], TEXT_A=a, TEXT_B=b), "score"),
                        (dict(TASK=["paraphrase"], TEXT_A=a, TEXT_B=b), "probability")):
        np.testing.assert_allclose([g[key] for g in answers(local, request, **inputs)],
                                   [g[key] for g in answers(model, request, **inputs)], atol=1e-5)
    with pytest.raises(ValueError, match="parameter ENGINE 'tvm': use bls or onnxruntime"):
        initialized(module, artifact / "triton", {"ENGINE": "tvm"})
