"""`bertzoo serve ARTIFACT` with no engine flags against every engine forced, and the peer, on this machine, one run.

    python -m benchmarks.serve_defaults ARTIFACT --data ../shared/data/ids-sst-dev.csv \
        [--infinity VENV --infinity-models MODELS] [--rounds 2] [--json results/serve_defaults_DATE_CPU.json]

ARTIFACT is a `bertzoo export --optimize --int8` output. Each server in turn, alternating over --rounds (the 2-core
VMs drift 3-10% between runs): a fresh `bertzoo serve` with --instances auto and --frontends auto, --concurrency
closed-loop gRPC clients (64) sending one SST dev sentence per Embed request, sentences/s. The servers:

- "auto": no engine flags. Its first start on the artifact measures the engines (serving/engine_choice.py) into a
  cache of its own (removed first, so the run includes a first start); the seconds it took to answer are recorded;
- every engine forced: ONNX Runtime fp32, optimized, int8; OpenVINO fp32 and, where the CPU has native bf16, bf16.
  Each row records whether it keeps fp32-level agreement as `auto` judges it (its row in the engine choice's table);
- with --infinity: infinity-emb at each of its CPU engines answering /embeddings to its own HTTP load generator of the
  same shape (infinity_peer.py).

The goals it reports: `auto` within 5% of the fastest forced engine at fp32-level agreement, and >= 2x
infinity's best fp32 engine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common.infinity_peer import infinity_rows
from benchmarks.common.processes import effective_config, free_port, start_bertzoo, stop
from benchmarks.common.server_loads import closed_loop
from benchmarks.common.timing import machine
from bertzoo.serving.client import BertzooClient
from bertzoo.serving.load import load_items

FORCED = {"onnxruntime fp32": ["--backend", "onnxruntime", "--variant", "fp32"],
          "onnxruntime optimized": ["--backend", "onnxruntime", "--variant", "optimized"],
          "onnxruntime int8": ["--backend", "onnxruntime", "--variant", "int8"],
          "openvino fp32": ["--backend", "openvino", "--precision", "fp32"],
          "openvino bf16": ["--backend", "openvino", "--precision", "bf16"]}


def served(artifact: str, flags: list[str], sentences: list[str], args: argparse.Namespace) -> dict:
    """A fresh server with ``flags`` under the closed loop: its rate, latency, start-up seconds and what it serves."""
    port, began = free_port(), time.perf_counter()
    process = start_bertzoo(artifact, port, *flags)
    started_s = time.perf_counter() - began
    try:
        with BertzooClient(f"127.0.0.1:{port}") as client:
            info = client.model_info()
        row = closed_loop(port, "embed", sentences, args.concurrency, args.seconds)
    finally:
        stop(process)
    return {**row, "start_s": started_s, "backend": info.backend, "variant": info.variant,
            "precision": info.precision, "engine_choice": list(info.engine_choice),
            "server_settings": effective_config(process)}  # every auto resolved: instances, front ends, engines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--data", default=None, help="SST sentences (default: the bundled sample)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--infinity", default=None, metavar="VENV", help="benchmarks/peers/infinity_setup.sh's venv")
    parser.add_argument("--infinity-models", default=None, metavar="MODELS")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sentences = load_items("sentiment", args.data)
    results: dict = {"machine": machine(), "command": " ".join(sys.argv), "rounds": [], "infinity": {}}
    print(json.dumps(results["machine"]), flush=True)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["XDG_CACHE_HOME"] = cache  # the auto server's first start measures; the servers inherit it
        for round_ in range(args.rounds):
            for name, flags in {"auto": [], **FORCED}.items():
                try:
                    row = served(args.artifact, flags, sentences, args)
                except RuntimeError as e:  # an engine this machine lacks (e.g. bf16 without native bf16)
                    print(f"{name}: not served here ({e})", flush=True)
                    continue
                results["rounds"].append({"round": round_, "server": name, **row})
                print(f"round {round_ + 1}, {name}: {row['items_per_s']:.1f} sentences/s (p50 {row['p50_ms']:.0f} "
                      f"ms, started in {row['start_s']:.1f} s; {row['backend']} {row['variant']})", flush=True)
    if args.infinity:
        results["infinity"] = infinity_rows(args.infinity, args.infinity_models, sentences, args.concurrency,
                                            args.seconds)
    summarize(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


def summarize(results: dict) -> None:
    """Each server's median over rounds; auto against the fastest forced engine at fp32-level agreement, and
    against infinity's best fp32 engine."""
    by_server: dict[str, list[float]] = {}
    for row in results["rounds"]:
        by_server.setdefault(row["server"], []).append(row["items_per_s"])
    medians = {name: statistics.median(rates) for name, rates in by_server.items()}
    auto_rows = [r for r in results["rounds"] if r["server"] == "auto"]
    table = auto_rows[0]["engine_choice"] if auto_rows else []
    eligible = [name for name in FORCED if name in medians
                and any(line.startswith(name + ",") and "sentences/s" in line for line in table)]
    summary = {"median_sentences_per_s": medians, "fp32_level": eligible}
    if eligible and "auto" in medians:
        best = max(eligible, key=medians.get)
        summary["auto_vs_fastest_fp32_level"] = {"fastest": best, "ratio": medians["auto"] / medians[best]}
    fp32_peers = {k: v["items_per_s"] for k, v in results["infinity"].items() if "int8" not in k}
    if fp32_peers and "auto" in medians:
        summary["auto_vs_infinity_best_fp32"] = medians["auto"] / max(fp32_peers.values())
    results["summary"] = summary
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    main()
