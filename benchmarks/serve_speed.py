"""The server against its in-process ceiling, the machine's compute ceiling and the peer servers, side by side in one run.

    python benchmarks/serve_speed.py ARTIFACT CHECKPOINT --data ../shared/data/ids-sst-dev.csv \
        [--infinity VENV --infinity-models MODELS]   # from benchmarks/peers/infinity_setup.sh

ARTIFACT is a `bertzoo export --optimize --int8` output of CHECKPOINT. With --concurrency closed-loop clients (64)
sending one SST dev sentence per request, in this order:

1. the machine: the peak rate of one large fp32 and int8 matrix product on these cores (benchmarks/ceiling.py);
2. the in-process ceiling of each encoder variant (--variants: ONNX Runtime's fp32, optimized and int8 graphs, and
   where OpenVINO is installed its fp32 and, on a CPU with native bf16, bf16): the server's own batch computation
   (the same backend, heads and pooling) on every sentence in length-sorted batches, no transport, for Sentiment
   and for Embed; the best over the settings that could be fastest here (ceiling.in_process_rates: one engine on
   all threads or one per thread, batches of 16 or 64 rows, rows padded to their longest or as the server pads
   them, ONNX Runtime's spinning on or off). "Ceiling as served" is the best of the settings that pad as the
   server does: the two ratios tell what the padding rule costs from what the serving itself costs;
3. `bertzoo serve` with each variant (and each --instances count), answering Sentiment and Embed, called unary and
   (--modes) over streams (SentimentStream, EmbedStream: each client's requests on one call): sentences/s against
   that ceiling, the useful encoder work (unpadded tokens, in FLOPs) against the matrix-product peak of its
   precision, the CPU the server and the load generator each used (they share the cores), and from the server's
   metrics its batches' padding efficiency (real tokens / padded tokens) and rows per batch;
4. with --infinity: infinity-emb 0.0.78 on the same MiniLM at its CPU engines (torch; optimum = ONNX Runtime, fp32
   graph-optimized and int8), answering /embeddings to an HTTP load generator of the same shape
   (benchmarks/peers/http_load.py, run with the peer's Python);
5. a plain gRPC server that runs the PyTorch model eagerly, one request at a time (this file, ``--plain-server``);
6. the fp32 server at half its saturation throughput (open loop, requests sent at a fixed rate), and a mixed load of
   all five RPCs at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from concurrent import futures
from dataclasses import asdict
from pathlib import Path

import grpc
import numpy as np
from ceiling import encoder_flops, gemm_peak_gflops
from infinity_peer import infinity_rows
from processes import answers_sentiment, free_port, memory_mb, scrape_metrics, start, start_bertzoo, stop
from served_variants import FP32_VARIANTS, TASKS, VARIANTS, default_variants, in_process_ceiling
from server_loads import closed_loop, measured_load, open_loop
from timing import machine

from bertzoo.data import SentenceExample
from bertzoo.serving.load import load_items, run_load
from bertzoo.serving.proto import pb2, pb2_grpc

HALF_SATURATION_RUNS = 3


def batch_counters(metrics_port: int) -> dict[str, float]:
    """The server's batch counters from its /metrics: batches, encoder rows and padded tokens so far."""
    totals = {"bertzoo_batch_size_count": 0.0, "bertzoo_batch_size_sum": 0.0, "bertzoo_batch_tokens_sum": 0.0}
    for key, value in scrape_metrics(metrics_port).items():
        if (name := key.split("{")[0]) in totals:
            totals[name] += value
    return totals


def mixed(port: int, data_dir: Path, concurrency: int, duration: float) -> dict:
    from bertzoo.datafiles import find_files

    inputs = {t: load_items(t, find_files(data_dir, "sentiment" if t == "embed" else t, "dev")[0])
              for t in ("sentiment", "paraphrase", "similarity", "qa", "embed")}

    async def run() -> list:
        per_task = max(1, concurrency // len(inputs))
        return await asyncio.gather(*(run_load(f"127.0.0.1:{port}", t, items, concurrency=per_task, duration=duration)
                                      for t, items in inputs.items()))

    return {r.task: r.summary() for r in asyncio.run(run())}


def plain_server(checkpoint: str, port: int) -> None:
    """What a user would otherwise write: a gRPC servicer calling the PyTorch model per request, one at a time."""
    import torch

    from bertzoo import tasks as T
    from bertzoo.tokenization import Tokenizer
    from bertzoo.trainer.checkpoint import TOKENIZER, load_model
    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.evaluate import predict_outputs

    model, config, directory = load_model(checkpoint)
    tokenizer, train_config = Tokenizer.from_file(directory / TOKENIZER), TrainConfig.from_dict(config["train"])
    spec = T.task_spec("sentiment", train_config.sentiment_dataset)

    class Plain(pb2_grpc.BertzooServicer):
        def Sentiment(self, request, context):  # noqa: N802 (gRPC method names)
            examples = [SentenceExample(str(i), t, None) for i, t in enumerate(request.texts)]
            with torch.no_grad():
                logits = predict_outputs(model, "sentiment", examples, tokenizer, train_config.limits)
            results = [pb2.SentimentResult(**asdict(r)) for r in T.postprocess_sentiment(logits, spec)]
            return pb2.SentimentResponse(results=results)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    pb2_grpc.add_BertzooServicer_to_server(Plain(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def report(results: dict) -> None:
    peaks = results["gemm_peak_gflops"]
    print(f"\nGEMM peak, {results['threads']} threads: fp32 {peaks['fp32']:.0f} GFLOP/s, int8 {peaks['int8']:.0f}; "
          f"MiniLM does {results['mflop_per_token']:.1f} MFLOP per token on these sentences (mean "
          f"{results['mean_tokens']:.1f} tokens)")
    print("\n| setup | RPC | sentences/s | / in-process ceiling | / ceiling as served | / GEMM peak | p50 ms | "
          "p99 ms | server cores | load generator cores | padding efficiency | rows per batch | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in results["rows"]:
        cells = [row["setup"], row["rpc"], f"{row['items_per_s']:.1f}", _fmt(row.get("of_ceiling")),
                 _fmt(row.get("of_as_served_ceiling")), _fmt(row.get("of_gemm_peak")), _fmt(row.get("p50_ms"), 1),
                 _fmt(row.get("p99_ms"), 1), _fmt(row.get("server_cores")), _fmt(row.get("load_generator_cores")),
                 _fmt(row.get("padding_efficiency")), _fmt(row.get("mean_batch_rows"), 1),
                 str(row.get("errors", "-"))]
        print("| " + " | ".join(cells) + " |")
    for name, ratio in results.get("against_infinity", {}).items():
        print(f"{name}: {ratio:.2f}x")
    h = results["half_saturation"]
    print(f"\n{h['server']} at half saturation ({h['rate']:.1f} requests/s, open loop, {len(h['runs'])} runs):")
    for run in h["runs"]:
        print(f"- {run['sent']} sent, {run['errors']} errors: p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms, "
              f"p99/p50 {run['p99_ms'] / run['p50_ms']:.2f}")
    print("\nmixed load on that server (all five RPCs at once):")
    for task, s in results["mixed"].items():
        print(f"- {task}: {s['items_per_s']:.1f} items/s, p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms, "
              f"errors {s['errors'] or 'none'}")


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("checkpoint")
    parser.add_argument("--data", required=True, help="SST dev file (ids-sst-dev.csv); its folder feeds the mixed load")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--instances", default="1,2", help="`bertzoo serve --instances` counts to measure")
    parser.add_argument("--variants", help=f"comma-separated, of {', '.join(VARIANTS)} (default: ONNX Runtime's "
                        "three, and OpenVINO's where it is installed)")
    parser.add_argument("--modes", default="unary,stream", help="how bertzoo's clients call: unary (one call per "
                        "request), stream (each client's requests over one call of the *Stream RPC), or both")
    parser.add_argument("--infinity", metavar="VENV", help="infinity-emb's virtual environment (peer rows)")
    parser.add_argument("--infinity-models", metavar="MODELS", help="its model folders (peers/infinity_setup.sh)")
    parser.add_argument("--out", help="also write the results as JSON here")
    parser.add_argument("--plain-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_server:
        return plain_server(args.checkpoint, args.port)
    if bool(args.infinity) != bool(args.infinity_models):
        parser.error("--infinity and --infinity-models go together")
    variants = args.variants.split(",") if args.variants else default_variants()
    modes = args.modes.split(",")
    if not modes or set(modes) - {"unary", "stream"} or "unary" not in modes:
        parser.error("--modes: unary, or unary,stream (the half-saturation and mixed loads are unary)")
    if unknown := [v for v in variants if v not in VARIANTS]:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    from bertzoo.artifact import load_manifest
    from bertzoo.tokenization import Tokenizer

    manifest = load_manifest(args.artifact)
    encoder = manifest["model"]["encoder"]
    tokenizer = Tokenizer.from_file(Path(args.artifact) / manifest["tokenizer"])
    sentences = load_items("sentiment", args.data)
    lengths = [len(e.input_ids) for e in tokenizer.encode_sentences(sentences, manifest["limits"]["max_seq_length"])]
    flop = encoder_flops([(1, n) for n in lengths], encoder["num_hidden_layers"], encoder["hidden_size"],
                         encoder["intermediate_size"])
    flop_per_sentence = flop / len(sentences)
    print(f"{len(sentences)} sentences from {args.data}; {args.concurrency} clients; {args.duration:.0f} s per load; "
          f"{args.threads} backend threads; {os.cpu_count()} cores shared with the load generator", flush=True)
    results: dict = {**machine(), "threads": args.threads, "concurrency": args.concurrency,
                     "mean_tokens": float(np.mean(lengths)), "mflop_per_token": flop / sum(lengths) / 1e6,
                     "gemm_peak_gflops": {"fp32": 0.0, "int8": 0.0}, "rows": []}

    def measure_gemm_peaks() -> None:
        """The peaks are the best seen: measured before each variant and at the end, since one short measurement
        can land on a moment the machine is busy elsewhere (a shared VM)."""
        for precision, peak in results["gemm_peak_gflops"].items():
            results["gemm_peak_gflops"][precision] = max(peak, gemm_peak_gflops(args.threads, precision))

    instance_counts = [int(n) for n in args.instances.split(",")]
    ceilings: dict = {}

    def add(setup: str, rpc: str, items_per_s: float, variant: str | None = None, **extra) -> dict:
        precision = VARIANTS[variant][3] if variant else "int8" if setup.endswith("int8") else "fp32"
        row = {"setup": setup, "rpc": rpc, "items_per_s": items_per_s, "useful_gflops": items_per_s * flop_per_sentence
               / 1e9, "gemm_precision": precision, **extra}
        if variant is not None and "in-process" not in setup:
            row["of_ceiling"] = items_per_s / ceilings[(variant, rpc)]["ceiling"]
            row["of_as_served_ceiling"] = items_per_s / ceilings[(variant, rpc)]["as_served"]
        results["rows"].append(row)
        return row

    for variant in variants:  # each variant's ceiling measured just before its servers: the machine drifts
        measure_gemm_peaks()
        for task, found in in_process_ceiling(args.artifact, variant, sentences, args.threads).items():
            ceilings[(variant, task)] = found
            for setting, f in found["settings"].items():
                add(f"in-process, {variant}, {setting}", task, f["rate"], variant,
                    padding_efficiency=f["padding_efficiency"])
        for instances in instance_counts:
            name, port, metrics_port = f"bertzoo serve, {variant}, --instances {instances}", free_port(), free_port()
            server = start_bertzoo(args.artifact, port, *VARIANTS[variant][2], "--threads", str(args.threads),
                                   "--instances", str(instances), metrics_port=metrics_port)
            try:
                for task, stream in ((t, mode == "stream") for t in TASKS for mode in modes):
                    before = batch_counters(metrics_port)
                    s = measured_load(server.pid, lambda t=task, p=port, m=stream: closed_loop(
                        p, t, sentences, args.concurrency, args.duration, m))
                    batches = {k: v - before[k] for k, v in batch_counters(metrics_port).items()}
                    # the load cycles through the sentences, so the served rows average the set's mean length
                    add(name + (", streams" if stream else ""), task, s["items_per_s"], variant, p50_ms=s["p50_ms"],
                        p99_ms=s["p99_ms"],
                        server_cores=s["server_cores"], load_generator_cores=s["load_generator_cores"],
                        errors=sum(s["errors"].values()), padding_efficiency=batches["bertzoo_batch_size_sum"]
                        * results["mean_tokens"] / max(batches["bertzoo_batch_tokens_sum"], 1.0),
                        mean_batch_rows=batches["bertzoo_batch_size_sum"] / max(batches["bertzoo_batch_size_count"], 1))
                    print(f"{name}, {task}{' over streams' if stream else ''}: {s['items_per_s']:.1f} sentences/s",
                          flush=True)
                if variant == variants[0] and instances == instance_counts[-1]:
                    half = next(r["items_per_s"] for r in results["rows"] if r["setup"] == name
                                and r["rpc"] == "sentiment") / 2  # its unary Sentiment saturation
                    # The tail ratio moves a lot between runs on a shared VM: three runs, each after a warm-up.
                    results["half_saturation"] = {"server": name, "rate": half, "runs": [
                        open_loop(port, sentences, half, args.duration) for _ in range(HALF_SATURATION_RUNS)]}
                    results["mixed"] = mixed(port, Path(args.data).parent, args.concurrency, args.duration)
                results[f"peak_rss_mb, {name}"] = memory_mb(server.pid)["VmHWM"]
            finally:
                stop(server)
    if args.infinity:
        peers = infinity_rows(args.infinity, args.infinity_models, sentences, args.concurrency, args.duration)
        for name, s in peers.items():
            add(name, "embed", s["items_per_s"], p50_ms=s["p50_ms"], p99_ms=s["p99_ms"],
                server_cores=s["server_cores"], load_generator_cores=s["load_generator_cores"],
                errors=sum(s["errors"].values()))
        best_fp32 = max(s["items_per_s"] for name, s in peers.items() if "fp32" in name)
        best_any = max(v["items_per_s"] for v in peers.values())

        def best_served(variant: str, stream: bool) -> float:
            return max(r["items_per_s"] for r in results["rows"] if r["rpc"] == "embed" and r["setup"].startswith(
                f"bertzoo serve, {variant},") and r["setup"].endswith(", streams") == stream)

        against = results["against_infinity"] = {}
        for stream in (mode == "stream" for mode in modes):
            how = "Embed over streams" if stream else "Embed"
            for variant in variants:
                against[f"bertzoo {how} {variant} / infinity's best fp32"] = best_served(variant, stream) / best_fp32
                if variant not in FP32_VARIANTS:
                    against[f"bertzoo {how} {variant} / infinity's best (any precision)"] = (
                        best_served(variant, stream) / best_any)
            if fp32 := [v for v in variants if v in FP32_VARIANTS]:
                against[f"bertzoo {how}, best fp32 variant / infinity's best fp32"] = max(
                    best_served(v, stream) for v in fp32) / best_fp32
    port = free_port()
    plain = start([sys.executable, __file__, args.artifact, args.checkpoint, "--data", args.data, "--plain-server",
                   "--port", str(port)], lambda: answers_sentiment(port))
    try:
        s = measured_load(plain.pid, lambda: closed_loop(port, "sentiment", sentences, args.concurrency,
                                                         args.duration))
        add("plain gRPC + PyTorch eager, one request at a time", "sentiment", s["items_per_s"], p50_ms=s["p50_ms"],
            p99_ms=s["p99_ms"], server_cores=s["server_cores"], load_generator_cores=s["load_generator_cores"],
            errors=sum(s["errors"].values()))
    finally:
        stop(plain)
    measure_gemm_peaks()
    for row in results["rows"]:  # against the best peak of the run
        row["of_gemm_peak"] = row["useful_gflops"] / results["gemm_peak_gflops"][row.pop("gemm_precision")]
    report(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
