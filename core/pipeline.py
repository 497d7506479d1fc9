"""Examples -> head outputs through any backend: the one inference path that evaluation, export parity checks and
serving share, so a model scores the same in ``bertzoo eval``, in the export's parity report and through the server.

A backend is anything with two methods (numpy in, numpy out): ``encode`` runs the encoder over a padded batch and
``head`` runs one task's head. Every backend (ONNX Runtime, OpenVINO, TensorRT, PyTorch) is in serving/backends/,
listed in its table ``BACKENDS`` and made by its ``create_backend``; Triton's model in export/triton_python_model.py
wraps Triton's own calls in the same protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
from tqdm import tqdm

from . import tasks as T
from .qa import SpanPrediction
from .tokenization import Encoding, QAWindow, Tokenizer, pad_batch

PAIR_TASKS = ("paraphrase", "similarity")


class Backend(Protocol):
    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """input_ids, attention_mask, token_type_ids [b, t] (int64) -> token states [b, t, hidden] (float32)."""
        ...

    def head(self, task: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """One task head. sentiment/qa: states, mask; pair tasks: states_a, mask_a, states_b, mask_b."""
        ...


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Index batches in order of length: sorting keeps padding (wasted compute) small."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def pad_states(items: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Stack per-sequence (states [t, h], mask [t]) into right-padded [b, T, h], [b, T]."""
    width = max(s.shape[0] for s, _ in items)
    states = np.zeros((len(items), width, items[0][0].shape[1]), dtype=np.float32)
    masks = np.zeros((len(items), width), dtype=np.int64)
    for row, (s, m) in enumerate(items):
        states[row, : s.shape[0]] = s
        masks[row, : m.shape[0]] = m
    return states, masks


class SilentBar:
    """What :func:`progress_bar` gives without a label: no tqdm at all. A tqdm bar, even disabled, makes tqdm's
    multiprocessing lock, a named semaphore in a server's spawned engine process that a SIGKILL would leak."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> SilentBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def progress_bar(label: str | None, total: int) -> tqdm | SilentBar:
    """A bar over encoded sequences, labelled e.g. "eval sentiment"; none without a label (tests, the server) and none
    when stderr is not a terminal (logs)."""
    if label is None:
        return SilentBar()
    return tqdm(total=total, desc=label, unit="seq", disable=None, leave=False, dynamic_ncols=True, mininterval=0.5)


def encode_states(backend: Backend, encodings: Sequence[Encoding | QAWindow], pad_id: int, batch_size: int,
                  progress: str | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Token states and masks for each encoding, in input order (each trimmed to its own length)."""
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(encodings)
    with progress_bar(progress, len(encodings)) as bar:
        for idx in length_sorted_batches([len(e.input_ids) for e in encodings], batch_size):
            batch = pad_batch([encodings[i] for i in idx], pad_id)
            states = backend.encode(batch)
            for row, i in enumerate(idx):
                n = len(encodings[i].input_ids)
                out[i] = (states[row, :n], batch["attention_mask"][row, :n])
            bar.update(len(idx))
    return out  # type: ignore[return-value]


def predict(backend: Backend, task: str, examples: Sequence, tokenizer: Tokenizer, limits: T.Limits,
            batch_size: int = 64, allow_impossible: bool = True, null_threshold: float = 0.0,
            progress: str | None = None) -> np.ndarray | list[SpanPrediction]:
    """Head outputs for sentence and pair tasks (logits / scores), decoded spans for QA (with
    ``allow_impossible=False`` the best span even where "no answer" wins, as scoring needs). ``progress``: the
    label of a progress bar."""
    if task == "qa":
        return _predict_qa(backend, examples, tokenizer, limits, batch_size, allow_impossible, null_threshold,
                           progress)
    if task == "sentiment":
        states = encode_states(backend, T.encode_sentences(tokenizer, [e.text for e in examples], limits),
                               tokenizer.pad_id, batch_size, progress)
        chunks = [backend.head(task, dict(zip(("states", "mask"), pad_states(states[i:i + batch_size]),
                                              strict=True)))[0]
                  for i in range(0, len(states), batch_size)]
    elif task in PAIR_TASKS:
        a, b = T.encode_pairs_separately(tokenizer, [e.text_a for e in examples], [e.text_b for e in examples], limits)
        states = encode_states(backend, a + b, tokenizer.pad_id, batch_size, progress)
        sa, sb = states[: len(a)], states[len(a):]
        chunks = []
        for i in range(0, len(sa), batch_size):
            (states_a, mask_a), (states_b, mask_b) = pad_states(sa[i:i + batch_size]), pad_states(sb[i:i + batch_size])
            chunks.append(backend.head(task, {"states_a": states_a, "mask_a": mask_a, "states_b": states_b,
                                              "mask_b": mask_b})[0])
    else:
        raise ValueError(f"unknown task {task!r}; tasks are {T.TASK_NAMES}")
    return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros((0,), dtype=np.float32)


def _predict_qa(backend: Backend, examples: Sequence, tokenizer: Tokenizer, limits: T.Limits, batch_size: int,
                allow_impossible: bool, null_threshold: float, progress: str | None) -> list[SpanPrediction]:
    windows, owner = [], []
    for i, e in enumerate(examples):
        for w in T.encode_qa(tokenizer, e.question, e.context, limits):
            windows.append(w)
            owner.append(i)
    starts: list[np.ndarray] = [np.zeros(0)] * len(windows)
    ends: list[np.ndarray] = [np.zeros(0)] * len(windows)
    with progress_bar(progress, len(windows)) as bar:
        for idx in length_sorted_batches([len(w.input_ids) for w in windows], batch_size):
            batch = pad_batch([windows[i] for i in idx], tokenizer.pad_id)
            states = backend.encode(batch)
            start, end = backend.head("qa", {"states": states, "mask": batch["attention_mask"]})
            for row, i in enumerate(idx):
                n = len(windows[i].input_ids)
                starts[i], ends[i] = start[row, :n], end[row, :n]
            bar.update(len(idx))
    per_example: list[list[int]] = [[] for _ in examples]
    for w, i in enumerate(owner):
        per_example[i].append(w)
    return [
        T.postprocess_qa(e.context, [windows[w] for w in ws], [starts[w] for w in ws], [ends[w] for w in ws], limits,
                         allow_impossible=allow_impossible, null_threshold=null_threshold)
        for e, ws in zip(examples, per_example, strict=True)
    ]


def score(backend: Backend, task: str, examples: Sequence, tokenizer: Tokenizer, limits: T.Limits,
          batch_size: int = 64, null_threshold: float = 0.0, progress: str | None = None) -> dict[str, float]:
    """The task's official metrics for ``examples`` (which carry gold labels)."""
    outputs = predict(backend, task, examples, tokenizer, limits, batch_size, allow_impossible=False,
                      progress=progress)
    if task == "sentiment":
        return T.score_sentiment(np.asarray(outputs).argmax(-1), examples)
    if task == "paraphrase":
        return T.score_paraphrase(T.postprocess_paraphrase(outputs), examples)
    if task == "similarity":
        return T.score_similarity(T.postprocess_similarity(outputs), examples)
    return T.score_qa({e.id: p for e, p in zip(examples, outputs, strict=True)}, examples,
                      null_threshold=null_threshold)
