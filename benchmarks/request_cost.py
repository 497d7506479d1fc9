"""What one costly request does to everyone else, side by side in one run: the server with its long-request lane
(the default) against the same server with the lane and the cost limit turned off.

    python benchmarks/request_cost.py ARTIFACT [--variant fp32] [--out results.json]

For each server (a `bertzoo serve` subprocess, all cores):

1. a one-sentence Sentiment request every 20 ms, alone: p50 / p99;
2. the same while worst-case QA requests run back to back (one item, the context ``"a " * 10000``: 40 windows of
   384 tokens): p50 / p99, and the ratio to (1);
3. a worst-case request with a 2 s deadline: how long the server kept computing for it after the deadline (its
   CPU still busy);
4. resident memory (VmRSS) at start, after the worst-case requests, and its peak (VmHWM);
5. with the lane on: a request over the cost limit (8 contexts of 20,000 characters) is refused, and how fast;
6. a queue held full (--max-queue 4; 64 clients send 64 sentences a request and retry refusals with backoff, as the
   bertzoo client does): the latency of the RESOURCE_EXHAUSTED answers a probe gets (one sentence every 20 ms).

The client runs on the same cores as the server (a small machine): every figure pays for it equally.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
from processes import cpu_seconds, memory_mb, start_bertzoo
from timing import machine

from bertzoo.serving.client import AsyncBertzooClient, BertzooClient, channel_options
from bertzoo.serving.config import ServeConfig
from bertzoo.serving.proto import pb2

SMALL = "a gripping, funny and moving film."
WORST = ("what is it?", "a " * 10000)
COSTLY = [("what is it?", "b " * 10000)] * 8
# The flood's requests are as large as the server's default --max-items allows: each is a batch of its own, so the
# queue drains one request per batch and the retrying clients refill it at once: the probe finds it full (with 8
# sentences a request, a batch took the whole queue at once and the probe found room about half the time).
FLOOD_TEXTS = ServeConfig.max_items


def start_server(artifact: str, variant: str, port: int, *extra: str) -> subprocess.Popen:
    return start_bertzoo(artifact, port, "--variant", variant, *extra)


def small_latencies(client: BertzooClient, n: int = 250, every: float = 0.02, limit_s: float = 40.0) -> list[float]:
    """``n`` one-sentence requests, one every ``every`` seconds (or as soon as the last is answered), for at most
    ``limit_s`` seconds."""
    latencies = []
    stop_at = time.perf_counter() + limit_s
    for _ in range(n):
        if time.perf_counter() > stop_at:
            break
        started = time.perf_counter()
        client.sentiment([SMALL], timeout=60)
        latencies.append(time.perf_counter() - started)
        time.sleep(max(0.0, every - (time.perf_counter() - started)))
    return latencies


def pct(latencies: list[float]) -> dict[str, float]:
    p50, p99 = np.percentile(np.asarray(latencies) * 1000, (50, 99))
    return {"p50_ms": round(float(p50), 2), "p99_ms": round(float(p99), 2), "n": len(latencies)}


def worst_case_phase(client: BertzooClient, target: str) -> dict:
    """Small requests while worst-case requests run back to back on another connection."""
    stop, done, times = threading.Event(), [0], []

    def worst_loop() -> None:
        with BertzooClient(target, options=channel_options(retries=False)) as worst:
            while not stop.is_set():
                started = time.perf_counter()
                worst.qa([WORST], timeout=600)
                times.append(time.perf_counter() - started)
                done[0] += 1

    thread = threading.Thread(target=worst_loop)
    thread.start()
    time.sleep(1.0)  # the first worst-case request is running
    latencies = small_latencies(client)
    stop.set()
    thread.join()
    return {**pct(latencies), "worst_case_requests_done": done[0],
            "worst_case_seconds": [round(t, 2) for t in times]}


def deadline_phase(target: str, pid: int) -> dict:
    """A worst-case request with a 2 s deadline; then how long the server's CPU stayed busy (over half a core)."""
    with BertzooClient(target, options=channel_options(retries=False)) as client:
        started = time.perf_counter()
        try:
            client.qa([WORST], timeout=2.0)
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
        expired = time.perf_counter()
    last_busy, before, at = expired, cpu_seconds(pid), time.perf_counter()
    while time.perf_counter() - last_busy < 2.0:  # idle for 2 s: nothing runs for the request any more
        time.sleep(0.1)
        used, now = cpu_seconds(pid), time.perf_counter()
        if (used - before) / (now - at) > 0.5:
            last_busy = now
        before, at = used, now
    return {"code": code, "answered_after_s": round(expired - started, 2),
            "computed_after_deadline_s": round(last_busy - expired, 2)}


def costly_phase(target: str) -> dict:
    with BertzooClient(target, options=channel_options(retries=False)) as client:
        started = time.perf_counter()
        try:
            client.qa(COSTLY, timeout=600)
            return {"code": "OK", "seconds": round(time.perf_counter() - started, 2)}
        except grpc.RpcError as e:
            return {"code": e.code().name, "ms": round(1000 * (time.perf_counter() - started), 1),
                    "details": e.details()}


async def flood(target: str, clients: int, seconds: float) -> int:
    """``clients`` clients sending FLOOD_TEXTS sentences a request, retrying refusals with backoff as the bertzoo
    client does by default; returns the requests answered."""
    answered = [0]
    stop_at = time.perf_counter() + seconds

    async def one() -> None:
        channel = AsyncBertzooClient(target, timeout=30)
        try:
            while time.perf_counter() < stop_at:
                try:
                    await channel.call("Sentiment", pb2.SentimentRequest(texts=[SMALL] * FLOOD_TEXTS))
                    answered[0] += 1
                except grpc.aio.AioRpcError:
                    pass
        finally:
            await channel.close()

    await asyncio.gather(*(one() for _ in range(clients)))
    return answered[0]


def queue_full_phase(target: str, flooders: int = 64, seconds: float = 10.0) -> dict:
    """The flood (:func:`flood`) in a process of its own keeps the queue full; from this process a probe without
    retries sends one sentence every 20 ms and times the RESOURCE_EXHAUSTED answers."""
    flooding = subprocess.Popen([sys.executable, __file__, "--flood", target, str(flooders), str(seconds + 2)],
                                stdout=subprocess.PIPE, text=True)
    refused, answered = [], 0
    time.sleep(2.0)  # the flood has started and filled the queue
    with BertzooClient(target, options=channel_options(retries=False)) as probe:
        stop_at = time.perf_counter() + seconds
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                probe.sentiment([SMALL], timeout=30)
                answered += 1
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    refused.append(time.perf_counter() - started)
            time.sleep(max(0.0, 0.02 - (time.perf_counter() - started)))
    flood_ok = int(flooding.communicate(timeout=120)[0].strip() or 0)
    return {**pct(refused), "probe_answered_ok": answered, "flood_requests_ok": flood_ok}


def measure(artifact: str, variant: str, name: str, extra: list[str], port: int, queue_full: bool) -> dict:
    target = f"127.0.0.1:{port}"
    server = start_server(artifact, variant, port, *extra)
    try:
        result: dict = {"server": name, "flags": extra, "memory_start_mb": memory_mb(server.pid)}
        with BertzooClient(target) as client:
            small_latencies(client, 50)  # warm the connection
            result["small_alone"] = pct(small_latencies(client))
            print(name, "small alone", result["small_alone"], flush=True)
            result["small_beside_worst_case"] = worst_case_phase(client, target)
            print(name, "beside worst case", result["small_beside_worst_case"], flush=True)
        result["p99_ratio"] = round(result["small_beside_worst_case"]["p99_ms"] / result["small_alone"]["p99_ms"], 2)
        result["memory_after_worst_case_mb"] = memory_mb(server.pid)
        result["deadline"] = deadline_phase(target, server.pid)
        print(name, "deadline", result["deadline"], flush=True)
        result["costly"] = costly_phase(target)
        print(name, "costly", {k: v for k, v in result["costly"].items() if k != "details"}, flush=True)
        result["memory_end_mb"] = memory_mb(server.pid)
        print(name, "memory", result["memory_start_mb"], result["memory_end_mb"], flush=True)
    finally:
        server.terminate()
        server.wait(60)
    if queue_full:
        result["queue_full_refusals"] = queue_full_round(artifact, variant, port, extra)
        print(name, "queue full", result["queue_full_refusals"], flush=True)
    return result


def queue_full_round(artifact: str, variant: str, port: int, extra: list[str], seconds: float = 10.0) -> dict:
    """:func:`queue_full_phase` against a fresh server with ``--max-queue 4``."""
    server = start_server(artifact, variant, port, *extra, "--max-queue", "4")
    try:
        return queue_full_phase(f"127.0.0.1:{port}", seconds=seconds)
    finally:
        server.terminate()
        server.wait(60)


def main() -> None:
    if sys.argv[1:2] == ["--flood"]:  # the flood's own process (queue_full_phase), yielding the cores to the server
        os.nice(19)  # and the probe, as a load generator on other machines would
        print(asyncio.run(flood(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--port", type=int, default=50731)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--queue-full-only", type=int, metavar="ROUNDS",
                        help="only (6), this many rounds of 20 s, each against a fresh server")
    args = parser.parse_args()
    results = {**machine(), "variant": args.variant, "servers": []}
    if args.queue_full_only:
        rounds = results["queue_full_rounds"] = []
        for _ in range(args.queue_full_only):
            rounds.append(queue_full_round(args.artifact, args.variant, args.port, [], 20.0))
            print("queue full", rounds[-1], flush=True)
        print(f"refusals p99 per round (ms): {[r['p99_ms'] for r in rounds]}")
    else:
        unlimited = str(10**9)
        for name, extra, queue_full in (("lane on (defaults)", [], True),
                                        ("lane and cost limit off", ["--long-request-tokens", unlimited,
                                                                     "--max-request-tokens", unlimited], False)):
            results["servers"].append(measure(args.artifact, args.variant, name, extra, args.port, queue_full))
        print(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
