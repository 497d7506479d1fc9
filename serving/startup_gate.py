"""The start-up gate a backend that compiles the artifact itself (OpenVINO; ``startup_gate`` in its entry of
``serving.backends.BACKENDS``) passes before the server reports ready: measured against the artifact's fp32 ONNX
Runtime encoder (the graph the export gated against PyTorch) with the export's own measures and bounds per precision
(``bertzoo.parity_measures``): encoder states and head outputs on inputs of several shapes, and, on the bundled dev
samples (real dev rows), the share of sentiment and paraphrase items with the same class and the change in STS
Pearson and QA F1. A missed bound stops the server, naming what moved by how much."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from bertzoo.datafiles import load_split, samples_dir
from bertzoo.parity_measures import BOUNDS, missed_bounds, task_parity, tensor_parity
from bertzoo.pipeline import Backend
from bertzoo.tasks import Limits
from bertzoo.tokenization import Tokenizer

from .backends import BackendUnavailable, create_backend

log = logging.getLogger("bertzoo.serving")

ITEMS_PER_TASK = 128  # of the bundled dev samples: a few seconds per backend on 2 cores


class BackendParityError(BackendUnavailable):
    """The backend's outputs are too far from the artifact's reference: it must not serve."""


def check_backend(candidate: Backend, name: str, precision: str, directory: str | Path, manifest: dict,
                 tokenizer: Tokenizer, limits: Limits, threads: int | None = None) -> dict:
    """The report (measures next to bounds); raises BackendParityError where a bound is missed."""
    started = time.perf_counter()
    reference = create_backend("onnxruntime", directory, variant="fp32", threads=threads, manifest=manifest)
    tasks = list(manifest["model"]["tasks"])
    tensors = tensor_parity(reference, candidate, tasks, int(manifest["model"]["encoder"]["vocab_size"]))
    splits = {task: load_split(samples_dir(), task, "dev")[:ITEMS_PER_TASK] for task in tasks}
    per_task = task_parity(reference, candidate, splits, tokenizer, limits,
                           float(manifest["model"].get("qa_null_threshold", 0.0)))
    bounds = BOUNDS[precision]
    failures = missed_bounds(bounds, tensors, per_task)
    report = {"engine": name, "precision": precision, "reference": "onnxruntime fp32", "bounds": bounds.__dict__,
              "tensor_max_abs": tensors, "tasks": per_task, "passed": not failures, "failures": failures}
    if failures:
        raise BackendParityError(f"{name} {precision} does not reproduce the artifact's fp32 ONNX Runtime engine: "
                                + "; ".join(failures) + "; serve it with --backend onnxruntime or another precision")
    summary = ", ".join(f"{task} {_measure(r)}" for task, r in per_task.items())
    log.info("%s %s parity against onnxruntime fp32 passed in %.1f s: encoder states max abs %.1e (bound %.0e); %s",
             name, precision, time.perf_counter() - started, tensors["encoder"], bounds.tensor_max_abs, summary)
    return report


def _measure(result: dict) -> str:
    if "same_class" in result:
        return f"same class {result['same_class']:.1%} of {result['n']}"
    metric = "pearson" if "pearson_delta" in result else "f1"
    return f"{metric} change {result[f'{metric}_delta']:.4f}"
