"""What a lone request costs beyond the engine: one client, one SST sentence per Sentiment call, one call at a time,
the client's clock against the response's Timing fields (the server's own account of its stages).

    python -m benchmarks.lone_request ARTIFACT [--data ../shared/data/ids-sst-dev.csv] [--variants fp32 int8] \
        [--requests 400] [--launcher "/tmp/venv-before/bin/bertzoo"] [--json FILE] [-- more `bertzoo serve` flags]

``--launcher``: the command that stands for ``bertzoo`` (default: this Python's), to measure another build's server
with the same client.

Per variant, medians in ms: the client's round trip, the server's total, and its queue, tokenize and inference
(the engine's batch: encoder and heads) stages; "client - inference" is what the request path adds to the engine's
own time. A bare RPC (health) gives the transport's floor on this machine. The server's CPU milliseconds per request,
by thread (the event loop is the main thread; the rest grouped by name), tell work from waiting: a thread that burns
CPU beyond the request's work (an engine's pool spinning after a batch) takes a core from the request path.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common.processes import effective_config, free_port, start_bertzoo, stop, thread_cpu_seconds
from benchmarks.common.timing import machine
from bertzoo.serving.client import BertzooClient
from bertzoo.serving.load import load_items

FIELDS = ("client", "total", "queue", "tokenize", "inference")


def lone_requests(artifact: str, flags: list[str], texts: list[str], launcher: list[str] | None = None
                  ) -> dict[str, float]:
    port = free_port()
    process = start_bertzoo(artifact, port, *flags, launcher=launcher)
    try:
        with BertzooClient(f"127.0.0.1:{port}") as client:
            for text in texts[:50]:  # warm-up
                client.sentiment([text])
            rows = []
            threads_before = thread_cpu_seconds(process.pid)
            for text in texts:
                started = time.perf_counter()
                timing = client.sentiment([text]).timing
                rows.append((time.perf_counter() - started, timing.total_seconds, timing.queue_seconds,
                             timing.tokenize_seconds, timing.inference_seconds))
            threads_after = thread_cpu_seconds(process.pid)
            health = []
            for _ in range(200):
                started = time.perf_counter()
                client.health()
                health.append(time.perf_counter() - started)
    finally:
        stop(process)
    medians = {name: 1000 * statistics.median(row[k] for row in rows) for k, name in enumerate(FIELDS)}
    return {**medians, "client_minus_inference": medians["client"] - medians["inference"],
            "health_rpc": 1000 * statistics.median(health),
            "server_cpu_ms_per_request": cpu_per_request(process.pid, threads_before, threads_after, len(rows)),
            "server_settings": effective_config(process)}  # what each auto resolved to


def cpu_per_request(pid: int, before: dict, after: dict, requests: int) -> dict[str, float]:
    """CPU ms per request: in all, on the event loop (the main thread), and per name of the other threads."""
    spent: dict[str, float] = {"all": 0.0}
    for tid, (name, seconds) in after.items():
        used = seconds - before.get(tid, (name, 0.0))[1]
        group = "event loop" if tid == pid else name
        spent[group] = spent.get(group, 0.0) + used
        spent["all"] += used
    return {group: round(1000 * seconds / requests, 3) for group, seconds in sorted(spent.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--data", default=None)
    parser.add_argument("--variants", nargs="+", default=["fp32", "int8"], help="auto: no engine flags at all")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--launcher", default=None, help="the command that stands for bertzoo (default: this Python's)")
    parser.add_argument("--json", default=None)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    texts = load_items("sentiment", args.data)[:args.requests]
    results = {"machine": machine(), "requests": len(texts), "serve_flags": argv[split + 1:], "launcher": args.launcher,
               "variants": {}}
    print(json.dumps(results["machine"]), flush=True)
    for variant in args.variants:
        flags = [] if variant == "auto" else ["--variant", variant]  # auto: what `bertzoo serve ARTIFACT` picks
        row = lone_requests(args.artifact, [*flags, *argv[split + 1:]], texts,
                            shlex.split(args.launcher) if args.launcher else None)
        results["variants"][variant] = row
        print(f"{variant:10} client {row['client']:.2f} ms | server total {row['total']:.2f}, queue {row['queue']:.2f}, "
              f"tokenize {row['tokenize']:.2f}, inference {row['inference']:.2f} | client - inference "
              f"{row['client_minus_inference']:.2f} | health RPC {row['health_rpc']:.2f}", flush=True)
        cpu = row["server_cpu_ms_per_request"]
        print(f"{'':10} server CPU ms per request: " + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items() if v),
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
