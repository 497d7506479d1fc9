"""The padded encoders as Triton's ONNX Runtime backend loads them on a CPU: with every optimization (Triton's default,
and what `bertzoo export --triton` asked for before) against the basic level its configs now ask for, the int8 graph
written with ONNX Runtime's other fusions already made (export/ort_tools.bake_cpu_graph). Triton does not run here,
so the same ONNX Runtime sessions run in-process, one thread each, on length-sorted batches of the data's sentences
padded to each batch's longest, as a Triton client sends them. Alternating rounds; prints each arm's best pass, its
speed-up, and which fused ops each arm's graph holds after loading.

    python benchmarks/padded_graph_fusions.py ARTIFACT --data ../shared/data/ids-sst-dev.csv

ARTIFACT: an export with ``--int8 --triton`` (it holds ``encoder.padded.onnx`` and the baked
``encoder.padded.int8.onnx``). The int8 graph as it was before baking is quantized again here, from the padded fp32
graph, by the export's own function.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import tempfile
import time
from pathlib import Path

import onnx
import onnxruntime as ort
from timing import machine

from bertzoo.artifact import load_manifest
from bertzoo.export.ort_tools import quantize_int8
from bertzoo.pipeline import length_sorted_batches
from bertzoo.serving.load import load_items
from bertzoo.tokenization import Tokenizer, pad_batch

FUSED = ("SkipLayerNormalization", "BiasGelu", "LayerNormalization", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
         "FusedMatMul", "Attention")
LEVELS = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}


def session(path: Path, level: str, threads: int, dump: Path) -> tuple[ort.InferenceSession, dict[str, int]]:
    """A CPU session on ``path`` at ``level``, and the fused ops of the graph it runs."""
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.optimized_model_filepath = str(dump)
    made = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ops = collections.Counter(n.op_type for n in onnx.load(str(dump)).graph.node)
    return made, {op: ops[op] for op in FUSED if ops[op]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--data", required=True, help="sentences (as `bertzoo serve`'s load generator reads them)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--limit", type=int, default=640, help="sentences per pass")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()

    manifest = load_manifest(args.artifact)
    files = manifest["graphs"]["encoder"]["files"]
    if "padded_int8" not in files:
        parser.error(f"{args.artifact}: no padded int8 encoder; export with --int8 --triton")
    tokenizer = Tokenizer.from_file(args.artifact / manifest["tokenizer"])
    sentences = [s for s in load_items("sentiment", args.data)][: args.limit]
    encodings = tokenizer.encode_sentences(sentences, manifest["limits"]["max_seq_length"])
    batches = [pad_batch([encodings[i] for i in idx], tokenizer.pad_id)
               for idx in length_sorted_batches([len(e.input_ids) for e in encodings], args.batch_size)]

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        logging.disable(logging.WARNING)  # the quantizer's advice to pre-process, as in the export
        try:
            quantize_int8(args.artifact / files["padded_fp32"], tmp / "unbaked.int8.onnx")
        finally:
            logging.disable(logging.NOTSET)
        fp32_before, int8_before = "fp32, every optimization (before)", "int8, every optimization (before)"
        arms = {  # name: (graph, level, the arm its speed-up is against)
            fp32_before: (args.artifact / files["padded_fp32"], "all", fp32_before),
            "fp32, basic level (as shipped)": (args.artifact / files["padded_fp32"], "basic", fp32_before),
            int8_before: (tmp / "unbaked.int8.onnx", "all", int8_before),
            "int8 baked, basic level (as shipped)": (args.artifact / files["padded_int8"], "basic", int8_before),
        }
        sessions, ops = {}, {}
        for i, (name, (path, level, _)) in enumerate(arms.items()):
            sessions[name], ops[name] = session(path, level, args.threads, tmp / f"loaded{i}.onnx")
            print(f"{name}: {ops[name]}", flush=True)
    for made in sessions.values():
        made.run(None, batches[-1])  # warm-up on the widest batch
    seconds: dict[str, list[float]] = {name: [] for name in sessions}
    for r in range(args.rounds):
        for name in (list(sessions) if r % 2 == 0 else list(reversed(sessions))):
            started = time.perf_counter()
            for inputs in batches:
                sessions[name].run(None, inputs)
            seconds[name].append(time.perf_counter() - started)
    results = {"machine": machine(), "onnxruntime": ort.__version__, "sentences": len(sentences),
               "batch_size": args.batch_size, "threads": args.threads, "arms": {}}
    print(json.dumps(results["machine"]))
    for name in sessions:
        best = min(seconds[name])
        speedup = min(seconds[arms[name][2]]) / best
        results["arms"][name] = {"seconds": seconds[name], "sentences_per_s": len(sentences) / best,
                                 "speedup": speedup, "fused_ops": ops[name]}
        print(f"{name:40s} {len(sentences) / best:7.1f} sentences/s  x{speedup:.3f}  "
              f"rounds {' '.join(f'{s:.3f}' for s in seconds[name])} s")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
