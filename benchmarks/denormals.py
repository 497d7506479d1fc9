"""ONNX Runtime with denormal floats flushed to zero (what the server's engine threads do, bertzoo.cpu.flush_denormals)
against without, side by side: alternating rounds in one run, so the machine's drift falls on both equally.

    python -m benchmarks.denormals ARTIFACT [ARTIFACT ...] --data ../shared/data/ids-sst-dev.csv \
        [--rounds 3] [--json F]

Per artifact and ONNX Runtime encoder variant (fp32, optimized, int8: those it has), the in-process rate
(benchmarks/common/ceiling.py: the server's own batch computation, Sentiment, on every sentence of ``--data``, padded
as the server pads, one engine on every core, batches of ``--batch``) with flushing on and off: the measuring
threads (and the one that builds the engine, whose mode ONNX Runtime's pool threads follow) flush as a server's
engine threads do, or not.
Also ONNX Runtime's Softmax alone over attention scores [32, 12, 40, 40] with 7 columns of each row masked (the
additive mask's large negative score) or none: where the cost comes from.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common.ceiling import in_process_rates
from benchmarks.common.timing import machine
from bertzoo.artifact import load_manifest
from bertzoo.atomic import atomic_write_text
from bertzoo.cpu import flush_denormals, set_flush_denormals
from bertzoo.serving.backends import ort as ort_backend
from bertzoo.serving.load import load_items

VARIANTS = ("fp32", "optimized", "int8")
SETTING = "1 engine(s), batches of {rows}, padded as the server pads, spinning off"


def in_thread(function, *args):
    """``function(*args)`` on a new thread that starts with flushing off (as a server's worker does before its first
    batch), so neither arm inherits the other's mode."""
    result: list = []

    def run() -> None:
        set_flush_denormals(False)
        result.append(function(*args))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return result[0]


def softmax_us(masked: bool, flush: bool, repeats: int = 300) -> float:
    """Median microseconds of ONNX Runtime's Softmax over [32, 12, 40, 40] scores, the last 7 columns masked or not."""
    import onnx.helper as helper
    import onnxruntime as ort

    shape = [32, 12, 40, 40]
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
                              [helper.make_tensor_value_info("x", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), ort_backend.session_options(flush_denormals=flush),
                                   providers=["CPUExecutionProvider"])
    if flush:
        flush_denormals()
    scores = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    if masked:
        scores[..., -7:] = np.finfo(np.float32).min  # the exported graph's additive mask
    times = []
    for k in range(repeats + 20):
        started = time.perf_counter()
        session.run(None, {"x": scores})
        if k >= 20:
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def served_rate(artifact: str, variant: str, flush: bool, sentences: list[str], threads: int, rows: int) -> float:
    """Sentences/s of the server's batch computation (Sentiment) on ``variant``, flushing or not."""
    found = in_process_rates(artifact, "onnxruntime", {"variant": variant}, sentences, threads, tasks=("sentiment",),
                             batch_sizes=(rows,), only=SETTING.format(rows=rows), flush=flush)
    return next(iter(found.values()))["rate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifacts", nargs="+")
    parser.add_argument("--data", required=True, help="a Sentiment CSV (ids-sst-dev.csv)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="rows a batch (the server's --max-batch-size)")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: every core)")
    parser.add_argument("--json")
    args = parser.parse_args()
    threads = args.threads or os.cpu_count() or 1
    sentences = load_items("sentiment", args.data)
    results: dict = {"machine": machine(), "threads": threads, "batch": args.batch, "sentences": len(sentences),
                     "softmax_us": {}, "rates": []}
    for masked in (False, True):
        for flush in (False, True):
            label = f"{'masked' if masked else 'unmasked'}, flush {'on' if flush else 'off'}"
            results["softmax_us"][label] = in_thread(softmax_us, masked, flush)
            print(f"softmax [32, 12, 40, 40] {label}: {results['softmax_us'][label]:.0f} us", flush=True)
    for artifact in args.artifacts:
        files = load_manifest(artifact)["graphs"]["encoder"]["files"]
        for variant in (v for v in VARIANTS if v in files):
            for round_ in range(args.rounds):
                for flush in ((False, True) if round_ % 2 == 0 else (True, False)):
                    rate = in_thread(served_rate, artifact, variant, flush, sentences, threads, args.batch)
                    results["rates"].append({"artifact": artifact, "variant": variant, "round": round_,
                                             "flush": flush, "sentences_per_s": rate})
                    print(f"{Path(artifact).name} {variant} round {round_ + 1} flush {'on ' if flush else 'off'}: "
                          f"{rate:.1f} sentences/s", flush=True)
            on = [r["sentences_per_s"] for r in results["rates"] if r["variant"] == variant and r["flush"]
                  and r["artifact"] == artifact]
            off = [r["sentences_per_s"] for r in results["rates"] if r["variant"] == variant and not r["flush"]
                   and r["artifact"] == artifact]
            ratios = sorted(a / b for a, b in zip(on, off, strict=True))
            print(f"{Path(artifact).name} {variant}: on/off {ratios[0]:.3f}-{ratios[-1]:.3f} (per round)", flush=True)
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
