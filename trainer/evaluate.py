"""Running a model over examples: predictions and official metrics per task.

Pre-processing (tokenization, QA windows) and post-processing (probabilities, span decoding) come from the torch-free
core in ``bertzoo.tasks``, the same functions serving uses, so the scores here are the scores a served model gets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertzoo import tasks as T
from bertzoo.qa import SpanPrediction
from bertzoo.tokenization import Encoding, Tokenizer, pad_batch

from .heads import MultitaskModel


def _to_device(arrays: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}


def _length_sorted_batches(encodings: Sequence[Encoding], batch_size: int) -> list[np.ndarray]:
    # Sorting by length before batching keeps padding (wasted compute) small; results are put back in input order.
    order = np.argsort([len(e.input_ids) for e in encodings], kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


@torch.no_grad()
def encode_states(model: MultitaskModel, encodings: Sequence[Encoding], pad_id: int, batch_size: int,
                  device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Token states and masks for each encoding, in input order (each trimmed to its own length)."""
    out: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(encodings)
    for idx in _length_sorted_batches(encodings, batch_size):
        batch = _to_device(pad_batch([encodings[i] for i in idx], pad_id), device)
        states = model.encode(batch).float()
        for row, i in enumerate(idx):
            n = len(encodings[i].input_ids)
            out[i] = (states[row, :n], batch["attention_mask"][row, :n])
    return out  # type: ignore[return-value]


def _stack(items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    states = torch.nn.utils.rnn.pad_sequence([s for s, _ in items], batch_first=True)
    masks = torch.nn.utils.rnn.pad_sequence([m for _, m in items], batch_first=True)
    return states, masks


@torch.no_grad()
def predict_outputs(model: MultitaskModel, task: str, examples: Sequence, tokenizer: Tokenizer, limits: T.Limits,
                    batch_size: int = 64, device: torch.device | None = None, allow_impossible: bool = True
                    ) -> np.ndarray | list[SpanPrediction]:
    """Head outputs for sentence and pair tasks (logits / scores, numpy), decoded spans for QA (with
    ``allow_impossible=False`` the best span even where "no answer" wins, as scoring needs)."""
    device = device or next(model.parameters()).device
    model.eval()
    head = model.heads[task]
    if task == "qa":
        return _predict_qa(model, examples, tokenizer, limits, batch_size, device, allow_impossible)
    if task == "sentiment":
        states = encode_states(model, T.encode_sentences(tokenizer, [e.text for e in examples], limits),
                               tokenizer.pad_id, batch_size, device)
        chunks = [head(*_stack(states[i:i + batch_size])) for i in range(0, len(states), batch_size)]
    else:
        a, b = T.encode_pairs_separately(tokenizer, [e.text_a for e in examples], [e.text_b for e in examples], limits)
        states = encode_states(model, a + b, tokenizer.pad_id, batch_size, device)
        sa, sb = states[: len(a)], states[len(a):]
        chunks = [head(*_stack(sa[i:i + batch_size]), *_stack(sb[i:i + batch_size]))
                  for i in range(0, len(sa), batch_size)]
    return torch.cat(chunks).float().cpu().numpy() if chunks else np.zeros((0,))


def _predict_qa(model: MultitaskModel, examples: Sequence, tokenizer: Tokenizer, limits: T.Limits,
                batch_size: int, device: torch.device, allow_impossible: bool) -> list[SpanPrediction]:
    windows, owner = [], []
    for i, e in enumerate(examples):
        for w in T.encode_qa(tokenizer, e.question, e.context, limits):
            windows.append(w)
            owner.append(i)
    starts: list[np.ndarray | None] = [None] * len(windows)
    ends: list[np.ndarray | None] = [None] * len(windows)
    for idx in _length_sorted_batches(windows, batch_size):
        batch = _to_device(pad_batch([windows[i] for i in idx], tokenizer.pad_id), device)
        start, end = model("qa", batch)
        start, end = start.float().cpu().numpy(), end.float().cpu().numpy()
        for row, i in enumerate(idx):
            n = len(windows[i].input_ids)
            starts[i], ends[i] = start[row, :n], end[row, :n]
    per_example: list[list[int]] = [[] for _ in examples]
    for w, i in enumerate(owner):
        per_example[i].append(w)
    return [
        T.postprocess_qa(e.context, [windows[w] for w in ws], [starts[w] for w in ws], [ends[w] for w in ws], limits,
                         allow_impossible=allow_impossible, null_threshold=model.config.qa_null_threshold)
        for e, ws in zip(examples, per_example, strict=True)
    ]


def evaluate_task(model: MultitaskModel, task: str, examples: Sequence, tokenizer: Tokenizer, limits: T.Limits,
                  batch_size: int = 64) -> dict[str, float]:
    outputs = predict_outputs(model, task, examples, tokenizer, limits, batch_size, allow_impossible=False)
    if task == "sentiment":
        return T.score_sentiment(np.asarray(outputs).argmax(-1), examples)
    if task == "paraphrase":
        return T.score_paraphrase(T.postprocess_paraphrase(outputs), examples)
    if task == "similarity":
        return T.score_similarity(T.postprocess_similarity(outputs), examples)
    return T.score_qa({e.id: p for e, p in zip(examples, outputs, strict=True)}, examples,
                      null_threshold=model.config.qa_null_threshold)


def evaluate(model: MultitaskModel, splits: dict[str, Sequence], tokenizer: Tokenizer, limits: T.Limits,
             batch_size: int = 64) -> dict[str, dict[str, float]]:
    was_training = model.training
    try:
        return {task: evaluate_task(model, task, examples, tokenizer, limits, batch_size)
                for task, examples in splits.items()}
    finally:
        model.train(was_training)


def format_metrics(metrics: dict[str, dict[str, float]]) -> str:
    """A small fixed-width table: task, metric, value."""
    lines = [f"{'task':<12} {'metric':<22} {'value':>10}", "-" * 46]
    for task, values in metrics.items():
        for name, value in values.items():
            shown = f"{value:10.0f}" if name == "n" or name.endswith("_total") or name == "total" else f"{value:10.4f}"
            lines.append(f"{task:<12} {name:<22} {shown}")
    return "\n".join(lines)
