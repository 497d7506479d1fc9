"""Running a PyTorch model over examples: predictions and official metrics per task.

The inference path itself (batching, pre- and post-processing) is ``bertzoo.pipeline``, shared with the export's
parity checks and the server; this module only adapts the PyTorch model to the pipeline's backend interface.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertzoo import pipeline
from bertzoo import tasks as T
from bertzoo.qa import SpanPrediction
from bertzoo.tokenization import Tokenizer

from .heads import MultitaskModel

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class TorchBackend:
    """The PyTorch reference backend: numpy in, numpy out, as ``bertzoo.pipeline.Backend`` asks.

    ``precision`` fp16 / bf16 casts the encoder's weights to that type (so use it on a model of its own, as the
    server does); the heads are small and stay float32, fed the encoder's states as float32, as on every engine.
    ``cuda_graphs`` replays the encoder as captured CUDA graphs (trainer/cuda_graphs.py), for a model on a GPU.
    """

    def __init__(self, model: MultitaskModel, device: torch.device | None = None, precision: str = "fp32",
                 cuda_graphs: bool = False) -> None:
        if precision not in DTYPES:
            raise ValueError(f"precision must be one of {tuple(DTYPES)}, got {precision!r}")
        self.model = model
        self.device = device or next(model.parameters()).device
        self.precision = precision
        self.dtype = DTYPES[precision]
        if self.dtype != torch.float32:
            model.encoder.to(self.dtype)
        self.graphs = None
        if cuda_graphs:
            if self.device.type != "cuda":
                raise ValueError(f"CUDA graphs need a model on a CUDA device, this one is on {self.device}")
            from .cuda_graphs import GraphedEncoder

            model.eval()
            self.graphs = GraphedEncoder(self._encode_tensors, self.device)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    @torch.no_grad()
    def _encode_tensors(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.encode(inputs)

    @torch.no_grad()
    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        self.model.eval()
        if self.graphs is not None and (states := self.graphs.encode(batch)) is not None:
            return states
        return self._encode_tensors({k: self._tensor(v) for k, v in batch.items()}).float().cpu().numpy()

    @torch.no_grad()
    def head(self, task: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        self.model.eval()
        # By name: the heads' forward parameters are the graph input names (states, mask, states_a, ...).
        out = self.model.heads[task](**{k: self._tensor(v) for k, v in inputs.items()})
        return tuple(o.float().cpu().numpy() for o in (out if isinstance(out, tuple) else (out,)))


def predict_outputs(model: MultitaskModel, task: str, examples: Sequence, tokenizer: Tokenizer, limits: T.Limits,
                    batch_size: int = 64, device: torch.device | None = None, allow_impossible: bool = True,
                    progress: str | None = None) -> np.ndarray | list[SpanPrediction]:
    """Head outputs for sentence and pair tasks, decoded spans for QA (see ``bertzoo.pipeline.predict``)."""
    return pipeline.predict(TorchBackend(model, device), task, examples, tokenizer, limits, batch_size,
                            allow_impossible, model.config.qa_null_threshold, progress)


def evaluate(model: MultitaskModel, splits: dict[str, Sequence], tokenizer: Tokenizer, limits: T.Limits,
             batch_size: int = 64, progress: bool = False) -> dict[str, dict[str, float]]:
    was_training = model.training
    try:
        backend = TorchBackend(model)
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
