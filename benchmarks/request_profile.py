"""Where a request's cost goes in `bertzoo serve` under load: CPU per request by stage, from a sampling profile of the
running server, beside the wall-clock stages the server itself measures.

    python benchmarks/request_profile.py ARTIFACT --data ../shared/data/ids-sst-dev.csv [--variant int8] \
        [--task embed] [--stream] [--py-spy PATH]

The server runs with --concurrency closed-loop clients (64) sending one SST dev sentence per request, each in a unary
call or, with --stream, over one call of the task's streaming twin per client. Over the measured window:

- CPU seconds of every thread of the server, from /proc (exact): its Python threads (event loop, tokenizer pool,
  model worker) and its native threads (ONNX Runtime's intra-op pool, gRPC core's own threads);
- a py-spy profile of the Python threads (sampled without stopping the process), each sample put in one stage by
  what its stack holds: backend (ONNX Runtime), batch assembly (padding), post-processing (heads' outputs, pooling),
  tokenization, metrics (prometheus_client), queue (the batcher's scheduling), the RPC handler (validation,
  protobuf messages), gRPC (the aio server), the asyncio loop, other. A stage's share of the Python threads' samples
  times their CPU seconds is its CPU; the native threads are added to backend (ONNX Runtime's pool) and gRPC (its
  core's threads, which name themselves);
- the server's own histograms (queue, tokenize, inference, request seconds; batch sizes and padded tokens), scraped
  before and after, for the wall-clock view.

py-spy is a profiler, not a bertzoo dependency: `pip install py-spy` anywhere and pass its path (default: on PATH).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from processes import free_port, scrape_metrics, series_sum, start_bertzoo, stat_cpu_seconds, stop
from timing import machine

from bertzoo.serving.load import load_items, run_load

# (stage, what a frame's "function (file)" contains): the first stage any frame of a stack matches. Order matters:
# padding calls the tokenization module and the backend is called from the batch runner.
STAGES = [
    ("batch assembly", ("prepare_inputs",)),
    ("backend (ONNX Runtime)", ("onnxruntime", "backends/ort.py")),
    ("metrics", ("prometheus_client",)),
    ("tokenization", ("tokenization.py", "tokenizers")),
    ("post-processing", ("pool_embeddings", "postprocess_", "run_batch", "select (", "engine.py")),
    ("queue (batcher)", ("batcher.py",)),
    ("RPC handler (validation, protobuf)", ("servicer.py", "tasks_service.py", "google/protobuf")),
    ("gRPC (aio server)", ("grpc",)),
    ("asyncio loop", ("asyncio",)),
]


def stage_of(stack: str) -> str:
    for stage, needles in STAGES:
        if any(needle in stack for needle in needles):
            return stage
    return "other"


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (thread name, CPU seconds) for every thread of ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            out[int(task.name)] = (name, stat_cpu_seconds(task / "stat"))
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return out


def python_threads(py_spy: str, pid: int) -> dict[int, str]:
    """os thread id -> Python thread name, from ``py-spy dump --json``."""
    dump = json.loads(subprocess.run([py_spy, "dump", "--pid", str(pid), "--json"], check=True, capture_output=True,
                                     text=True).stdout)
    threads = dump[0]["threads"] if isinstance(dump, list) and dump and "threads" in dump[0] else dump
    return {t["os_thread_id"]: t.get("thread_name") or "?" for t in threads if t.get("os_thread_id")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--data", required=True, help="SST dev file (ids-sst-dev.csv)")
    parser.add_argument("--variant", default="int8")
    parser.add_argument("--task", default="embed", choices=("sentiment", "embed"))
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), help="the py-spy executable")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--out", help="also write the results as JSON here")
    parser.add_argument("--instances", type=int, default=1, help="`bertzoo serve --instances`")
    parser.add_argument("--stream", action="store_true", help="each client's requests over one *Stream call")
    args = parser.parse_args()
    if not args.py_spy:
        parser.error("py-spy not found: pip install py-spy, or pass --py-spy PATH")
    sentences = load_items("sentiment", args.data)
    port, metrics_port = free_port(), free_port()
    server = start_bertzoo(args.artifact, port, "--variant", args.variant, "--threads", str(args.threads),
                           "--instances", str(args.instances), metrics_port=metrics_port)
    target = f"127.0.0.1:{port}"
    try:
        asyncio.run(run_load(target, args.task, sentences, concurrency=args.concurrency, duration=3,
                             stream=args.stream))  # warm-up
        py_tids = python_threads(args.py_spy, server.pid)
        profile = Path(f"/tmp/bertzoo-profile-{server.pid}.txt")
        spy = subprocess.Popen([args.py_spy, "record", "--pid", str(server.pid), "--rate", str(args.rate),
                                "--duration", str(int(args.seconds)), "--format", "raw", "--nonblocking",
                                "--output", str(profile)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        before, metrics_before, t0 = thread_cpu(server.pid), scrape_metrics(metrics_port), time.perf_counter()
        load = asyncio.run(run_load(target, args.task, sentences, concurrency=args.concurrency,
                                    duration=args.seconds, stream=args.stream)).summary()
        after, metrics_after, wall = thread_cpu(server.pid), scrape_metrics(metrics_port), time.perf_counter() - t0
        spy.wait(120)
    finally:
        stop(server)
    samples: Counter = Counter()
    for line in profile.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples[stage_of(stack)] += int(count)
    profile.unlink()
    cpu = {tid: (name, after[tid][1] - before.get(tid, (name, 0.0))[1]) for tid, (name, _) in after.items()}
    python_cpu = sum(c for tid, (_, c) in cpu.items() if tid in py_tids)
    native = defaultdict(float)
    for tid, (name, c) in cpu.items():
        if tid not in py_tids:
            native["gRPC (aio server)" if name.startswith(("grpc", "default-exec", "resolver")) else
                   "backend (ONNX Runtime)"] += c
    total_samples = sum(samples.values())
    stages = {stage: python_cpu * n / total_samples for stage, n in samples.items()}
    for stage, c in native.items():
        stages[stage] = stages.get(stage, 0.0) + c
    requests = load["ok"]
    delta = {k: metrics_after.get(k, 0.0) - metrics_before.get(k, 0.0) for k in metrics_after}
    wall_ms = {name: 1000 * series_sum(delta, f"bertzoo_{name}_seconds_sum", task=args.task)
               / max(series_sum(delta, f"bertzoo_{name}_seconds_count", task=args.task), 1.0)
               for name in ("queue", "tokenize", "inference", "request")}
    batches = max(series_sum(delta, "bertzoo_batch_size_count"), 1.0)
    results = {**machine(), "variant": args.variant, "instances": args.instances, "task": args.task, "stream": args.stream,
               "concurrency": args.concurrency,
               "load": load, "server_cpu_s": sum(c for _, c in cpu.values()), "wall_s": wall,
               "cpu_ms_per_request": {s: 1000 * c / requests for s, c in sorted(stages.items(), key=lambda x: -x[1])},
               "threads_cpu_s": {f"{name} ({'python: ' + py_tids[tid] if tid in py_tids else 'native'})": c
                                 for tid, (name, c) in sorted(cpu.items(), key=lambda x: -x[1][1]) if c > 0.05},
               "wall_ms_per_request": wall_ms,
               "mean_batch_rows": series_sum(delta, "bertzoo_batch_size_sum") / batches,
               "mean_padded_tokens_per_row": series_sum(delta, "bertzoo_batch_tokens_sum")
               / max(series_sum(delta, "bertzoo_batch_size_sum"), 1.0),
               "profile_samples": total_samples}
    print(f"{args.variant} {args.task}, --instances {args.instances}, {args.concurrency} clients: "
          f"{load['items_per_s']:.1f} requests/s, p50 {load['p50_ms']:.1f} ms, p99 {load['p99_ms']:.1f} ms; "
          f"server CPU {results['server_cpu_s'] / wall:.2f} cores; batches of {results['mean_batch_rows']:.1f} rows "
          f"padded to {results['mean_padded_tokens_per_row']:.1f} tokens")
    total = sum(results["cpu_ms_per_request"].values())
    print("\n| stage | CPU ms per request | share |\n|---|---|---|")
    for stage, ms in results["cpu_ms_per_request"].items():
        print(f"| {stage} | {ms:.3f} | {ms / total:.1%} |")
    print(f"| total | {total:.3f} | |")
    print("\nthreads (CPU seconds): " + ", ".join(f"{k} {v:.1f}" for k, v in results["threads_cpu_s"].items()))
    print("wall ms per request (the server's histograms): " + ", ".join(f"{k} {v:.2f}" for k, v in wall_ms.items()))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
