"""The ``bertzoo`` model of the Triton repository (Triton's Python backend; copied there as ``bertzoo/1/model.py``).

A Triton client sends text and gets each task's answer. Every input carries one row per item (Triton's batch axis):
TASK (sentiment, paraphrase, similarity, qa or embed), TEXT_A (the texts, the first sentences of pairs, or the
questions) and, for pairs and QA, TEXT_B (second sentences, or contexts). ANSWER holds one JSON object per row with the
field names of bertzoo's own RPC results.

Triton's dynamic batcher hands ``execute`` every request that arrived while the instance was busy; their rows are
grouped by task and each task's rows run as one batch, so one-sentence requests share encoder calls as they do in
``bertzoo serve``. Tokenization and post-processing are bertzoo's own (``bertzoo.pipeline``, the inference path
``bertzoo eval`` and ``bertzoo serve`` share, so the answers are theirs). Each request gets its own response: a bad
request gets an error response and never fails the others.

The ENGINE parameter picks where the encoder and heads run:
- ``bls`` (default): the repository's own encoder and head models, called through Triton's business logic scripting
  (BLS) on Triton's onnxruntime (or tensorrt) backend; ENCODER names the encoder model (``bertzoo_encoder_int8`` for
  the int8 variant). The hidden states move between models inside Triton, never over the client's wire.
- ``onnxruntime``: the export artifact's graphs run in this model's own process on bertzoo's ONNX Runtime engine, the
  one ``bertzoo serve`` runs (packed tokens, its CPU settings), for a Triton built without the onnxruntime backend
  (PyTriton's). ARTIFACT is the artifact's directory (default: the one that holds this repository), VARIANT its
  encoder (fp32, optimized, int8), THREADS each instance's intra-op threads.

It needs bertzoo in Triton's Python environment (``pip install bertzoo``; with ENGINE ``onnxruntime``,
``pip install 'bertzoo[serve]'``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from bertzoo import pipeline
from bertzoo import tasks as T
from bertzoo.data import PairExample, QAExample, SentenceExample
from bertzoo.tokenization import Tokenizer

SETTINGS = "bertzoo.json"  # written beside this file: tasks, labels, limits, pooling, graph input and output names


class BLSBackend:
    """``bertzoo.pipeline.Backend`` on the repository's models, called through Triton (BLS)."""

    def __init__(self, settings: dict, encoder_model: str) -> None:
        self.graphs, self.encoder_model = settings["graphs"], encoder_model

    def _run(self, model: str, graph: str, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self.graphs[graph]["outputs"]
        request = pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs,
                                            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()])
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{model}: {response.error().message()}")
        return [pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs]

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        feed = {name: np.ascontiguousarray(batch[name], dtype=np.int64) for name in self.graphs["encoder"]["inputs"]}
        return self._run(self.encoder_model, "encoder", feed)[0]

    def head(self, task: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        feed = {k: np.ascontiguousarray(v, dtype=np.float32 if k.startswith("states") else np.int64)
                for k, v in inputs.items()}
        return tuple(self._run(f"bertzoo_head_{task}", task, feed))


def _texts(request, name: str) -> list[str] | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


def read_rows(request, tasks: tuple[str, ...]) -> list[tuple[str, str, str | None]]:
    """A request's rows as (task, text_a, text_b); ValueError names the input that is wrong."""
    return T.text_rows(_texts(request, "TASK") or [], _texts(request, "TEXT_A") or [], _texts(request, "TEXT_B"), tasks)


def answer(backend, tokenizer: Tokenizer, settings: dict, task: str, texts_a: list[str],
           texts_b: list[str] | None) -> list[dict]:
    """One JSON-able result per item, as bertzoo's RPCs answer."""
    limits = T.Limits(**settings["limits"])
    if task == "embed":
        from bertzoo.serving.engine import pool_embeddings

        states = pipeline.encode_states(backend, T.encode_sentences(tokenizer, texts_a, limits), tokenizer.pad_id, 64)
        pooled = pool_embeddings(*pipeline.pad_states(states), settings["model"]["pooling"])
        return [{"values": [float(x) for x in row]} for row in pooled]
    if task == "sentiment":
        examples = [SentenceExample(str(i), t, None) for i, t in enumerate(texts_a)]
    elif task == "qa":
        examples = [QAExample(str(i), q, c, (), (), False) for i, (q, c) in enumerate(zip(texts_a, texts_b, strict=True))]
    else:
        examples = [PairExample(str(i), a, b, None) for i, (a, b) in enumerate(zip(texts_a, texts_b, strict=True))]
    outputs = pipeline.predict(backend, task, examples, tokenizer, limits,
                               null_threshold=settings["model"]["qa_null_threshold"])
    return [asdict(r) for r in T.answers(task, outputs, settings["labels"]["sentiment"])]


def _parameter(config: dict, name: str, default: str) -> str:
    return config.get("parameters", {}).get(name, {}).get("string_value", default)


def make_backend(settings: dict, repository: Path, config: dict):
    engine = _parameter(config, "ENGINE", "bls")
    if engine == "bls":
        return BLSBackend(settings, _parameter(config, "ENCODER", "bertzoo_encoder"))
    if engine == "onnxruntime":
        from bertzoo.serving.backends.ort import OnnxRuntimeBackend

        artifact = (repository / _parameter(config, "ARTIFACT", "../..")).resolve()
        return OnnxRuntimeBackend(artifact, _parameter(config, "VARIANT", "fp32"),
                                  threads=int(_parameter(config, "THREADS", "1")))
    raise ValueError(f"parameter ENGINE {engine!r}: use bls or onnxruntime")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        repository = Path(args["model_repository"])
        here = repository / args["model_version"]
        self.settings = json.loads((here / SETTINGS).read_text())
        self.tokenizer = Tokenizer.from_file(here / "tokenizer.json")
        self.tasks = (*self.settings["model"]["tasks"], "embed")
        self.backend = make_backend(self.settings, repository, json.loads(args["model_config"]))

    def _answer(self, task: str, rows: list[tuple[str, str, str | None]]) -> list[dict]:
        return answer(self.backend, self.tokenizer, self.settings, task, [a for _, a, _ in rows],
                      [b for _, _, b in rows] if task in T.SECOND_TEXT_TASKS else None)

    def execute(self, requests: list) -> list:
        """One response per request. The rows of all requests are grouped by task and each task's rows answered as
        one batch; where a batch fails, its requests are answered one by one, so the error reaches only the request
        that caused it."""
        rows: list[list | None] = []
        errors: dict[int, str] = {}
        for k, request in enumerate(requests):
            try:
                rows.append(read_rows(request, self.tasks))
            except Exception as e:  # noqa: BLE001 - one request's error is that request's response
                rows.append(None)
                errors[k] = str(e)
        results: dict[tuple[int, int], dict] = {}
        for task in dict.fromkeys(row[0] for request_rows in rows if request_rows for row in request_rows):
            members = [(k, i) for k, request_rows in enumerate(rows) if request_rows
                       for i, row in enumerate(request_rows) if row[0] == task]
            try:
                results.update(zip(members, self._answer(task, [rows[k][i] for k, i in members]), strict=True))
            except Exception:  # noqa: BLE001 - find the request that failed the batch; the others keep their answers
                for k in dict.fromkeys(k for k, _ in members):
                    mine = [(k, i) for k2, i in members if k2 == k]
                    try:
                        results.update(zip(mine, self._answer(task, [rows[k][i] for _, i in mine]), strict=True))
                    except Exception as e:  # noqa: BLE001
                        errors[k] = str(e)
        responses = []
        for k, request_rows in enumerate(rows):
            if k in errors:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(errors[k])))
                continue
            encoded = np.array([json.dumps(results[(k, i)]).encode("utf-8") for i in range(len(request_rows))],
                               dtype=np.object_).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("ANSWER", encoded)]))
        return responses
