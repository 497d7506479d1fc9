"""Exported encoders against PyTorch eager, side by side in one run (ratios, not absolute times, are the result).

    python -m benchmarks.export_speed CHECKPOINT --data ../shared/data [--work /tmp/export_bench]

1. ``bertzoo export CHECKPOINT --optimize --int8`` with the parity gates on ``--data``'s dev sets (the accuracy
   deltas printed at the end are the manifest's parity report).
2. Encoder latency medians on the batch x length grid for PyTorch eager (fused SDPA), ONNX Runtime fp32, optimized
   and int8, each as a ratio to PyTorch.
3. The same weights with sparsegen-lin attention (SSAF, lambda -3) against softmax in ONNX Runtime at b8/s128, with
   the generic SparsegenLin function body (TopK), the ONNX Runtime formulation (the fallback), and the native kernel
   (export/ort_kernel, what the server uses where it can build it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from benchmarks.common.timing import machine, median_ms
from bertzoo.artifact import load_manifest
from bertzoo.export import ort_kernel
from bertzoo.export.exporter import ExportOptions, export_checkpoint
from bertzoo.export.onnx_graphs import export_graphs
from bertzoo.export.sparsegen_onnx import with_ort_formulation
from bertzoo.serving.backends import session_options
from bertzoo.serving.backends.base import encoder_feed
from bertzoo.trainer.checkpoint import load_model
from bertzoo.trainer.heads import ModelConfig, MultitaskModel
from bertzoo.trainer.model import EncoderConfig

GRID = ((1, 32), (8, 128), (32, 64))


def batch(b: int, t: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(b * 1000 + t)
    ids = rng.integers(1000, 29000, size=(b, t), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def session(model: onnx.ModelProto, threads: int, library: Path | None = None) -> ort.InferenceSession:
    # Spinning on: the benchmark process has the cores to itself, as an in-process user would.
    options = session_options(threads, spinning=True)
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])


def repeats_for(b: int, t: int) -> int:
    return max(5, min(50, 20000 // (b * t)))


def grid(model: MultitaskModel, artifact: Path, threads: int) -> None:
    torch.set_num_threads(threads)
    sessions = {name: session(with_ort_formulation(onnx.load(str(artifact / file))), threads)
                for name, file in (("ort fp32", "encoder.onnx"), ("ort optimized", "encoder.opt.onnx"),
                                   ("ort int8", "encoder.int8.onnx"))}
    print(f"\n## encoder latency, median ms (ratio to PyTorch eager), {threads} threads")
    print(f"| b x s | pytorch eager | {' | '.join(sessions)} |")
    print(f"|---|---|{'---|' * len(sessions)}")
    for b, t in GRID:
        feed = batch(b, t)
        tensors = {k: torch.from_numpy(v) for k, v in feed.items()}
        n = repeats_for(b, t)
        with torch.no_grad():
            base = median_ms(lambda x=tensors: model.encoder(x["input_ids"], x["attention_mask"], x["token_type_ids"]),
                             n)
        cells = []
        for s in sessions.values():
            inputs = encoder_feed(feed, [i.name for i in s.get_inputs()])  # packed where the graph is
            ms = median_ms(lambda s=s, inputs=inputs: s.run(None, inputs), n)
            cells.append(f"{ms:.2f} ({ms / base:.2f}x)")
        print(f"| b{b}/s{t} | {base:.2f} | {' | '.join(cells)} |")


def ssaf_against_softmax(model: MultitaskModel, work: Path, threads: int, lam: float = -3.0) -> None:
    encoder = EncoderConfig.from_dict(model.config.encoder.to_dict(), attention="sparsegen_lin", sparsegen_lambda=lam)
    ssaf = MultitaskModel(ModelConfig(**{**model.config.__dict__, "encoder": encoder}))
    ssaf.load_state_dict(model.state_dict())
    export_graphs(ssaf, work / "ssaf")
    generic = onnx.load(str(work / "ssaf" / "encoder.onnx"))
    softmax = onnx.load(str(work / "artifact" / "encoder.onnx"))
    candidates = {
        "softmax": session(softmax, threads),
        "ssaf, generic TopK body": session(generic, threads),
        "ssaf, ORT formulation": session(with_ort_formulation(generic), threads),
    }
    library = ort_kernel.library()
    if library is not None:
        candidates["ssaf, native kernel"] = session(generic, threads, library)
    else:
        print(f"native kernel unavailable: {ort_kernel.unavailable_reason()}")
    feed = encoder_feed(batch(8, 128), [i.name for i in softmax.graph.input])
    for s in candidates.values():  # warm-up
        s.run(None, feed)
    # Interleaved rounds: each round runs every candidate once, so drift in machine speed hits all of them alike.
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(15):
        for name, s in candidates.items():
            started = time.perf_counter()
            s.run(None, feed)
            times[name].append((time.perf_counter() - started) * 1000)
    results = {name: statistics.median(t) for name, t in times.items()}
    print(f"\n## SSAF (sparsegen-lin, lambda {lam}) against softmax, ONNX Runtime fp32, b8/s128, {threads} threads")
    print("| encoder | median ms | ratio to softmax |\n|---|---|---|")
    for name, ms in results.items():
        print(f"| {name} | {ms:.1f} | {ms / results['softmax']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--data", default=None, help="dev data for the parity gates (default: bundled samples)")
    parser.add_argument("--parity-limit", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default=None, help="where to write the artifacts (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true", help="reuse the artifact already in --work (skip the export)")
    parser.add_argument("--skip-grid", action="store_true", help="only the SSAF against softmax comparison")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="export_bench."))
    print(f"onnxruntime {ort.__version__}, torch {torch.__version__}, artifacts in {work}; machine: {machine()}")
    if args.reuse and (work / "artifact").is_dir():
        manifest = load_manifest(work / "artifact")
        print("export: reusing the artifact in --work")
    else:
        started = time.perf_counter()
        manifest = export_checkpoint(args.checkpoint, work / "artifact", ExportOptions(
            optimize=True, int8=True, data_dir=args.data, parity_limit=args.parity_limit, force=True))
        print(f"export with parity gates: {time.perf_counter() - started:.0f} s")
    print(f"fused: {manifest['reports']['optimize']}")
    print("\n## parity (task level on dev examples, tensor level max abs diff)")
    for variant, report in manifest["parity"].items():
        tasks = "; ".join(f"{t} " + ", ".join(f"{k} {v:.4g}" for k, v in r.items()) for t, r in report["tasks"].items())
        print(f"- {variant}: encoder max abs {report['tensor_max_abs']['encoder']:.2e}; {tasks}")
    model, _, _ = load_model(args.checkpoint)
    model = model.float().eval()
    if not args.skip_grid:
        grid(model, work / "artifact", args.threads)
    ssaf_against_softmax(model, work, args.threads)


if __name__ == "__main__":
    main()
