"""Parity measures, torch-free: how far one engine's outputs are from a reference engine's, on tensors and on real
dev examples, and the bounds per precision an engine must meet (``BOUNDS``).

``bertzoo export`` gates every exported variant against the PyTorch model with them (export/gates.py); ``bertzoo
serve`` gates an engine that compiles the artifact itself (OpenVINO) against the artifact's own fp32 ONNX Runtime
engine before it reports ready.

The class-agreement bound is a statement about the rate, measured on a sample: a gate fails when the sample shows, at
95% one-sided confidence, that the rate is below the bound (the Wilson interval's upper end is under it). On a few
dozen items one flip is several points, so a point estimate under the bound proves nothing (75 of 80 = 93.75% is
consistent with 95%); on the few hundred items of real dev data the interval is a point or two wide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertzoo import pipeline
from bertzoo import tasks as T
from bertzoo.tokenization import Tokenizer


@dataclass(frozen=True)
class Bounds:
    tensor_max_abs: float  # encoder states and head outputs
    same_class: float  # share of sentiment / paraphrase items with the same predicted class (at least)
    pearson_delta: float  # |STS Pearson change| (at most)
    f1_delta: float  # |QA F1 change|, F1 in percent (at most)


BOUNDS = {
    "fp32": Bounds(tensor_max_abs=1e-3, same_class=0.995, pearson_delta=0.002, f1_delta=0.5),
    # Fused kernels reorder float sums: same task bounds, a little more room on raw tensors.
    "optimized": Bounds(tensor_max_abs=5e-3, same_class=0.995, pearson_delta=0.002, f1_delta=0.5),
    # int8 weights move states by a few hundredths to tenths; what users care about are the task bounds.
    "int8": Bounds(tensor_max_abs=1.0, same_class=0.95, pearson_delta=0.02, f1_delta=3.0),
    "fp16": Bounds(tensor_max_abs=5e-2, same_class=0.99, pearson_delta=0.005, f1_delta=1.0),
    # bf16 keeps 8 bits of mantissa to fp16's 11, so raw states move more (softmax and SSAF alike, on an H100); the
    # task bounds are fp16's, and bf16 met them there.
    "bf16": Bounds(tensor_max_abs=0.25, same_class=0.99, pearson_delta=0.005, f1_delta=1.0),
}

TENSOR_SHAPES = ((1, 32), (8, 128), (32, 64), (3, 17))  # (batch, seq): the benchmark grid plus an odd length


def _sample_batch(batch: int, seq: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, min(vocab, 29000), size=(batch, seq), dtype=np.int64)
    ids[:, 0] = 101  # [CLS]
    mask = np.ones((batch, seq), dtype=np.int64)
    for row in range(1, batch, 2):  # every other row padded, so masking is exercised
        mask[row, max(2, seq // 2 + row % 7):] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


CONFIDENCE_Z = 1.645  # one-sided 95%


def wilson_interval(agree: int, n: int, z: float = CONFIDENCE_Z) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ``agree / n``."""
    if n == 0:
        return 0.0, 1.0
    p = agree / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def tensor_parity(reference: pipeline.Backend, candidate: pipeline.Backend, tasks: Sequence[str], vocab: int
                  ) -> dict[str, float]:
    """Max abs difference of encoder states (real positions) and of each head's outputs, over TENSOR_SHAPES."""
    worst = {"encoder": 0.0, **{t: 0.0 for t in tasks}}
    for i, (b, t) in enumerate(TENSOR_SHAPES):
        batch = _sample_batch(b, t, vocab, seed=i)
        ref, got = reference.encode(batch), candidate.encode(batch)
        real = batch["attention_mask"].astype(bool)
        worst["encoder"] = max(worst["encoder"], float(np.abs(ref[real] - got[real]).max()))
        mask = batch["attention_mask"]
        for task in tasks:
            # Heads get the reference states, so this measures the head graph alone.
            if task in pipeline.PAIR_TASKS:
                inputs = {"states_a": ref, "mask_a": mask, "states_b": ref[::-1].copy(), "mask_b": mask[::-1].copy()}
            else:
                inputs = {"states": ref, "mask": mask}
            for r, g in zip(reference.head(task, inputs), candidate.head(task, inputs), strict=True):
                if task == "qa":  # masked positions hold the dtype's minimum in both: compare real ones
                    r, g = r[real], g[real]
                worst[task] = max(worst[task], float(np.abs(r - g).max()))
    return worst


def task_parity(reference: pipeline.Backend, candidate: pipeline.Backend, splits: dict[str, Sequence],
                tokenizer: Tokenizer, limits: T.Limits, null_threshold: float, batch_size: int = 32,
                progress: str | None = None) -> dict[str, dict]:
    """Per task: the candidate's agreement with the reference (class tasks) or metric change (STS, QA).
    ``progress``: the candidate's name, to label progress bars with."""
    report: dict[str, dict] = {}
    for task, examples in splits.items():
        if not examples:
            continue
        ref_bar, got_bar = (f"parity {task}: reference", f"parity {task}: {progress}") if progress else (None, None)
        if task in ("sentiment", "paraphrase"):
            ref = pipeline.predict(reference, task, examples, tokenizer, limits, batch_size, progress=ref_bar)
            got = pipeline.predict(candidate, task, examples, tokenizer, limits, batch_size, progress=got_bar)
            if task == "sentiment":
                same = np.asarray(ref).argmax(-1) == np.asarray(got).argmax(-1)
            else:
                same = (T.postprocess_paraphrase(ref) >= 0.5) == (T.postprocess_paraphrase(got) >= 0.5)
            low, high = wilson_interval(int(same.sum()), len(same))
            report[task] = {"same_class": float(same.mean()), "same_class_low": low, "same_class_high": high,
                            "n": len(examples)}
        else:
            metric = "pearson" if task == "similarity" else "f1"
            ref_m = pipeline.score(reference, task, examples, tokenizer, limits, batch_size, null_threshold, ref_bar)
            got_m = pipeline.score(candidate, task, examples, tokenizer, limits, batch_size, null_threshold, got_bar)
            report[task] = {f"{metric}_reference": ref_m[metric], f"{metric}_exported": got_m[metric],
                            f"{metric}_delta": abs(got_m[metric] - ref_m[metric]), "n": len(examples)}
            if "HasAns_f1" in ref_m:  # SQuAD 2.0: the answerable questions' F1 too, where the reader shows
                report[task].update(HasAns_f1_reference=ref_m["HasAns_f1"], HasAns_f1_exported=got_m["HasAns_f1"],
                                    HasAns_f1_delta=abs(got_m["HasAns_f1"] - ref_m["HasAns_f1"]))
    return report


def missed_bounds(bounds: Bounds, tensors: dict[str, float], per_task: dict[str, dict]) -> list[str]:
    """One line per bound the measures miss; empty when all are met."""
    failures = [f"{name} max abs diff {v:.2e} > {bounds.tensor_max_abs:.0e}"
                for name, v in tensors.items() if v > bounds.tensor_max_abs]
    for task, r in per_task.items():
        if "same_class" in r and r.get("same_class_high", r["same_class"]) < bounds.same_class:
            failures.append(f"{task}: same class for {r['same_class']:.2%} of {r['n']} items (95% upper bound "
                            f"{r['same_class_high']:.2%}) < {bounds.same_class:.1%}")
        if r.get("pearson_delta", 0.0) > bounds.pearson_delta:
            failures.append(f"{task}: Pearson changed by {r['pearson_delta']:.4f} > {bounds.pearson_delta}")
        if r.get("f1_delta", 0.0) > bounds.f1_delta:
            failures.append(f"{task}: F1 changed by {r['f1_delta']:.2f} > {bounds.f1_delta}")
    return failures
