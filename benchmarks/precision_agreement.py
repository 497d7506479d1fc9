"""How closely each faster engine/precision agrees with ONNX Runtime fp32 on the real dev sets of every task, so
`bertzoo serve` picks a faster default precision only where it keeps fp32-level agreement.

    python -m benchmarks.precision_agreement ARTIFACT --data DATA [--limit N] [--json FILE]

The reference is the artifact's fp32 encoder on ONNX Runtime (the graph the export gated against PyTorch). Candidates:
ONNX Runtime `optimized` and `int8` (where the artifact has them), OpenVINO fp32 and, where the CPU computes bf16
natively (bertzoo.cpu.native_bf16), OpenVINO bf16; every engine made by `create_backend`, as `bertzoo serve` makes
it. The measures are the parity gates' own (bertzoo.parity_measures): encoder states' max abs difference on random inputs of
several shapes (`tensor_parity`), and on each task's dev split as `bertzoo eval --data` loads it (`load_split`; the
first N with --limit) through `bertzoo.pipeline` (`task_parity`): the same-class rate of sentiment and paraphrase
(with its 95% Wilson interval), and the change of STS Pearson and of SQuAD F1. Each row says which bounds it misses:
its own precision's (the gates' `BOUNDS`) and fp32's task bounds, the "fp32-level agreement" a default must keep.
The reference's encoder runs once per batch: its states are kept for the candidates of the same task (about 1.2 GB
for 4,000 SQuAD questions), so a row's seconds for the first candidate include the reference's. On 2 cores,
`--limit 1200` takes ~3 min and `--limit 4000` ~11 min (peak 9 GB resident); most of it is QA.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.common.timing import machine
from bertzoo.artifact import load_manifest
from bertzoo.cpu import native_bf16
from bertzoo.datafiles import load_split
from bertzoo.parity_measures import BOUNDS, missed_bounds, task_parity, tensor_parity
from bertzoo.pipeline import Backend
from bertzoo.serving.backends import BackendUnavailable, check_available, create_backend
from bertzoo.tasks import Limits
from bertzoo.tokenization import Tokenizer


class KeptStates:
    """The reference engine with its encoder outputs kept by input, so each candidate is compared with states the
    reference computed once (ONNX Runtime on the CPU gives the same states for the same batch)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.states: dict[bytes, np.ndarray] = {}

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        digest = hashlib.sha1()
        for name in sorted(batch):
            digest.update(name.encode() + str(batch[name].shape).encode() + batch[name].tobytes())
        key = digest.digest()
        if key not in self.states:
            self.states[key] = self.inner.encode(batch)
        return self.states[key]

    def head(self, task: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        return self.inner.head(task, inputs)


def candidates(artifact: str, manifest: dict, threads: int | None, cache_dir: str | None
               ) -> tuple[list[tuple[str, str, Backend]], list[str]]:
    """(engine, precision, backend) for each candidate this artifact and machine allow, and why any was left out."""
    made: list[tuple[str, str, Backend]] = []
    left_out: list[str] = []
    for variant in ("optimized", "int8"):
        if variant in manifest["graphs"]["encoder"]["files"]:
            made.append(("onnxruntime", variant, create_backend("onnxruntime", artifact, variant=variant,
                                                                threads=threads, manifest=manifest)))
        else:
            left_out.append(f"onnxruntime/{variant}: not in the artifact (export with --optimize / --int8)")
    try:
        check_available("openvino", "cpu")
    except BackendUnavailable as e:
        return made, [*left_out, f"openvino: {e}"]
    for precision in ("fp32", "bf16"):
        if precision == "bf16" and not native_bf16():
            left_out.append("openvino/bf16: this CPU has no native bf16 (AVX-512 BF16 or AMX)")
            continue
        try:
            made.append(("openvino", precision, create_backend("openvino", artifact, precision=precision,
                                                               threads=threads, manifest=manifest,
                                                               cache_dir=cache_dir)))
        except BackendUnavailable as e:  # e.g. an operator OpenVINO's reader does not know
            left_out.append(f"openvino/{precision}: {e}")
    return made, left_out


def measure_text(result: dict) -> str:
    if "same_class" in result:
        return (f"same class {result['same_class']:.2%} (95% {result['same_class_low']:.2%}-"
                f"{result['same_class_high']:.2%})")
    metric = "pearson" if "pearson_delta" in result else "f1"
    text = (f"{metric} {result[f'{metric}_reference']:.4f} -> {result[f'{metric}_exported']:.4f}, "
            f"delta {result[f'{metric}_delta']:.4f}")
    if "HasAns_f1_delta" in result:
        text += (f"; HasAns f1 {result['HasAns_f1_reference']:.4f} -> {result['HasAns_f1_exported']:.4f}, "
                 f"delta {result['HasAns_f1_delta']:.4f}")
    return text


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", help="a `bertzoo export` output (--optimize --int8 for every ONNX Runtime row)")
    parser.add_argument("--data", required=True, help="data folder in the standard layout (dev files)")
    parser.add_argument("--limit", type=int, default=None, help="the first N dev examples of each task")
    parser.add_argument("--threads", type=int, default=None, help="engine threads (default: every core)")
    parser.add_argument("--batch-size", type=int, default=32, help="as the export's parity gates (32)")
    parser.add_argument("--openvino-cache", default=None, help="OpenVINO's model cache (default: the server's)")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    manifest = load_manifest(args.artifact)
    tokenizer = Tokenizer.from_file(Path(args.artifact) / manifest["tokenizer"])
    limits = Limits(**manifest["limits"])
    tasks = list(manifest["model"]["tasks"])
    null_threshold = float(manifest["model"].get("qa_null_threshold", 0.0))
    skipped: list[str] = []
    splits = {task: load_split(args.data, task, "dev", skipped=skipped)[:args.limit] for task in tasks}
    reference = KeptStates(create_backend("onnxruntime", args.artifact, variant="fp32", threads=args.threads,
                                          manifest=manifest))
    engines, left_out = candidates(args.artifact, manifest, args.threads, args.openvino_cache)
    rows = []
    for engine, precision, backend in engines:
        tensors = tensor_parity(reference.inner, backend, tasks, int(manifest["model"]["encoder"]["vocab_size"]))
        rows.append({"engine": engine, "precision": precision, "bounds": BOUNDS[precision].__dict__,
                     "tensor_max_abs": tensors, "tasks": {}, "seconds": {}})
    for task, examples in splits.items():  # task by task, so only one task's reference states are kept at a time
        reference.states.clear()
        for row, (_, _, backend) in zip(rows, engines, strict=True):
            task_started = time.perf_counter()
            row["tasks"].update(task_parity(reference, backend, {task: examples}, tokenizer, limits, null_threshold,
                                            batch_size=args.batch_size))
            row["seconds"][task] = round(time.perf_counter() - task_started, 1)
            name = f"{row['engine']}/{row['precision']}"
            print(f"{name:22} {task:10} n={len(examples):5}  {measure_text(row['tasks'][task]):48} "
                  f"encoder max abs {row['tensor_max_abs']['encoder']:.1e}  ({row['seconds'][task]:.0f} s)",
                  flush=True)
    reference.states.clear()
    for row in rows:
        row["failures"] = missed_bounds(BOUNDS[row["precision"]], row["tensor_max_abs"], row["tasks"])
        row["fp32_level_failures"] = missed_bounds(BOUNDS["fp32"], {}, row["tasks"])  # the task bounds alone
        verdict = "; ".join(row["fp32_level_failures"]) or "keeps fp32-level task agreement"
        print(f"{row['engine'] + '/' + row['precision']:22} {verdict}", flush=True)
    for reason in left_out:
        print(f"left out: {reason}", flush=True)
    report = {**machine(), "artifact": str(args.artifact), "data": str(args.data), "limit": args.limit,
              "threads": args.threads, "batch_size": args.batch_size, "reference": "onnxruntime/fp32",
              "examples": {task: len(examples) for task, examples in splits.items()}, "skipped_rows": len(skipped),
              "rows": rows, "left_out": left_out, "seconds": round(time.perf_counter() - started, 1)}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
