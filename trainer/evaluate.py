"""Running a PyTorch model over examples: predictions and official metrics per task.

The inference path itself (batching, pre- and post-processing) is ``bertzoo.pipeline``, shared with the export's
parity checks and the server; the model runs on the PyTorch backend, ``create_backend("torch", ...)`` of the backend
table in ``bertzoo.serving.backends``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertzoo import pipeline
from bertzoo import tasks as T
from bertzoo.qa import SpanPrediction
from bertzoo.serving.backends import create_backend
from bertzoo.tokenization import Tokenizer

from .heads import MultitaskModel


def predict_outputs(model: MultitaskModel, task: str, examples: Sequence, tokenizer: Tokenizer, limits: T.Limits,
                    batch_size: int = 64, device: torch.device | None = None, allow_impossible: bool = True,
                    progress: str | None = None) -> np.ndarray | list[SpanPrediction]:
    """Head outputs for sentence and pair tasks, decoded spans for QA (see ``bertzoo.pipeline.predict``)."""
    return pipeline.predict(create_backend("torch", model, device=device), task, examples, tokenizer, limits, batch_size,
                            allow_impossible, model.config.qa_null_threshold, progress)


def evaluate(model: MultitaskModel, splits: dict[str, Sequence], tokenizer: Tokenizer, limits: T.Limits,
             batch_size: int = 64, progress: bool = False) -> dict[str, dict[str, float]]:
    was_training = model.training
    try:
        backend = create_backend("torch", model)
        return {task: pipeline.score(backend, task, examples, tokenizer, limits, batch_size,
                                     model.config.qa_null_threshold, progress=f"eval {task}" if progress else None)
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
