"""The loads the serving benchmarks put on a server on loopback: a closed loop (clients that each send their next
request when the last is answered), an open loop (requests at a fixed rate whatever the answers, for latency at a
given load), and the CPU the server and this load generator used meanwhile, since on a small machine they share the
cores. Shared by serve_ab, serve_defaults, serve_goals and serve_h2load.
"""

from __future__ import annotations

import asyncio
import resource
import time

import grpc
import numpy as np

from benchmarks.common.processes import cpu_seconds
from bertzoo.serving.load import run_load
from bertzoo.serving.proto import pb2, pb2_grpc


def own_cpu_seconds() -> float:
    """CPU seconds (user and system) this process has used: the load generator's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measured_load(pid: int, load) -> dict:
    """Run ``load()`` (a closed or open loop; returns a summary with items_per_s) and add the CPU cores the server (``pid``)
    and this load generator used meanwhile."""
    server0, own0, t0 = cpu_seconds(pid), own_cpu_seconds(), time.perf_counter()
    summary = load()
    wall = time.perf_counter() - t0
    return {**summary, "server_cores": (cpu_seconds(pid) - server0) / wall,
            "load_generator_cores": (own_cpu_seconds() - own0) / wall}


def closed_loop(port: int, task: str, items: list, concurrency: int, duration: float, stream: bool = False) -> dict:
    """``concurrency`` clients calling ``task`` on loopback ``port`` with ``items`` for ``duration`` s (each client's
    requests over one stream with ``stream``), after a 3 s warm-up: bench-serve's summary (items_per_s, p50_ms, ...)."""
    target = f"127.0.0.1:{port}"
    asyncio.run(run_load(target, task, items, concurrency=concurrency, duration=3, stream=stream))  # warm-up
    return asyncio.run(run_load(target, task, items, concurrency=concurrency, duration=duration,
                                stream=stream)).summary()


def open_loop(port: int, sentences: list[str], rate: float, duration: float, task: str = "sentiment") -> dict:
    """Requests of one sentence each (Sentiment, or ``task="embed"`` Embed), sent at ``rate`` per second for
    ``duration`` s whatever the answers (after a 3 s warm-up at the same rate): p50 and p99 of their latency."""
    asyncio.run(_open_loop(port, sentences, rate, 3, task))
    summary = asyncio.run(_open_loop(port, sentences, rate, duration, task))
    return {**summary, "items_per_s": (summary["sent"] - summary["errors"]) / duration}


async def _open_loop(port: int, sentences: list[str], rate: float, duration: float, task: str) -> dict:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb2_grpc.BertzooStub(channel)
    method, request = {"sentiment": (stub.Sentiment, pb2.SentimentRequest),
                       "embed": (stub.Embed, pb2.EmbedRequest)}[task]
    latencies: list[float] = []
    errors = 0

    async def one(text: str) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        try:
            await method(request(texts=[text]), timeout=30)
            latencies.append(time.perf_counter() - t0)
        except grpc.aio.AioRpcError:
            errors += 1

    tasks, started, i = [], time.perf_counter(), 0
    while time.perf_counter() - started < duration:
        tasks.append(asyncio.create_task(one(sentences[i % len(sentences)])))
        i += 1
        await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
    await asyncio.gather(*tasks)
    await channel.close()
    lat = np.asarray(latencies) * 1000
    return {"rate": rate, "sent": i, "errors": errors, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99))}
