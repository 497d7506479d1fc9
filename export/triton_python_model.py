"""The ``bertzoo`` model of the Triton repository (Triton's Python backend; copied there as ``bertzoo/1/model.py``).

A Triton client sends text and gets each task's answer: TASK (one of sentiment, paraphrase, similarity, qa, embed),
TEXT_A (the texts, the first sentences of pairs, or the questions) and, for pairs and QA, TEXT_B (second sentences, or
contexts). ANSWER holds one JSON object per item with the field names of bertzoo's own RPC results. Inside, this
model tokenizes with bertzoo's tokenizer, calls the repository's encoder and head models through Triton's business
logic scripting (BLS), and post-processes with ``bertzoo.tasks``: the hidden states move between models inside
Triton, never over the client's wire, and the encoder and heads keep Triton's dynamic batching across requests.
Lengths are ragged: each encoder call is padded to its own longest sequence (``bertzoo.pipeline``, the inference path
``bertzoo eval`` and ``bertzoo serve`` share, so the answers are theirs).

It needs the torch-free ``bertzoo`` package in Triton's Python environment (``pip install bertzoo``). Each request
gets its own response; a bad request gets an error response and never fails the others.
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


def answer(backend: BLSBackend, tokenizer: Tokenizer, settings: dict, task: str, texts_a: list[str],
           texts_b: list[str] | None) -> list[dict]:
    """One JSON-able result per item, as bertzoo's RPCs answer."""
    limits = T.Limits(**settings["limits"])
    if task not in (*settings["model"]["tasks"], "embed"):
        raise ValueError(f"TASK {task!r}: this model serves {', '.join(settings['model']['tasks'])} and embed")
    if task in ("paraphrase", "similarity", "qa") and (texts_b is None or len(texts_b) != len(texts_a)):
        raise ValueError(f"TASK {task} needs TEXT_B with one entry per TEXT_A entry")
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


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        here = Path(args["model_repository"]) / args["model_version"]
        self.settings = json.loads((here / SETTINGS).read_text())
        self.tokenizer = Tokenizer.from_file(here / "tokenizer.json")
        parameters = json.loads(args["model_config"]).get("parameters", {})
        encoder = parameters.get("ENCODER", {}).get("string_value", "bertzoo_encoder")
        self.backend = BLSBackend(self.settings, encoder)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                task = _texts(request, "TASK")[0]
                results = answer(self.backend, self.tokenizer, self.settings, task, _texts(request, "TEXT_A") or [],
                                 _texts(request, "TEXT_B"))
                encoded = np.array([json.dumps(r).encode("utf-8") for r in results], dtype=np.object_)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("ANSWER", encoded)]))
            except Exception as e:  # noqa: BLE001 - one request's error is that request's response
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))))
        return responses
