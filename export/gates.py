"""The export's parity gates: an exported variant goes into the artifact only if it reproduces the PyTorch model.

Two levels, each with bounds stated per precision (``bertzoo.parity_measures.BOUNDS``, where the measures live):
- tensor: encoder states (real, non-padding positions) and every head's outputs on inputs of several shapes, max abs
  difference against PyTorch;
- task: on real dev examples, through the same ``bertzoo.pipeline`` the server uses: the share of sentiment and
  paraphrase items with the same predicted class, the change in STS Pearson and in QA F1.

A class-agreement bound holds unless the sample shows, at 95% one-sided confidence, that the rate is under it (see
``bertzoo.parity_measures``). The report (measured values next to their bounds) goes into the manifest; a missed bound fails
the export.
"""

from __future__ import annotations

from collections.abc import Sequence

from bertzoo import pipeline
from bertzoo import tasks as T
from bertzoo.parity_measures import BOUNDS, missed_bounds, task_parity, tensor_parity
from bertzoo.serving.backends import create_backend
from bertzoo.tokenization import Tokenizer
from bertzoo.trainer.heads import MultitaskModel


class ParityError(RuntimeError):
    def __init__(self, message: str, report: dict) -> None:
        super().__init__(message)
        self.report = report


def check(model: MultitaskModel, candidate: pipeline.Backend, precision: str, splits: dict[str, Sequence],
          tokenizer: Tokenizer, limits: T.Limits, progress: bool = False) -> dict:
    """Measure ``candidate`` against the PyTorch model; returns the report, raises ParityError if a bound is missed."""
    bounds = BOUNDS[precision]
    reference = create_backend("torch", model.float().eval(), device="cpu")
    tasks = list(model.heads)
    tensors = tensor_parity(reference, candidate, tasks, model.config.encoder.vocab_size)
    per_task = task_parity(reference, candidate, splits, tokenizer, limits, model.config.qa_null_threshold,
                           progress=precision if progress else None)
    failures = missed_bounds(bounds, tensors, per_task)
    report = {"precision": precision, "bounds": bounds.__dict__, "tensor_max_abs": tensors, "tasks": per_task,
              "passed": not failures, "failures": failures}
    if failures:
        raise ParityError(f"{precision} parity failed: " + "; ".join(failures), report)
    return report
