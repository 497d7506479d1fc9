"""A closed-loop HTTP load generator for a peer's OpenAI-style ``/embeddings`` endpoint: the HTTP counterpart of
``bertzoo.serving.load.run_load`` (N clients, each on a connection of its own, sending its next request when the last
is answered), run with the peer's own Python (it needs aiohttp, which bertzoo does not):

    VENV/bin/python benchmarks/peers/http_load.py URL MODEL SENTENCES.txt --concurrency 64 --duration 20

Prints one JSON object: items/s, p50/p99 latency, errors, and the CPU seconds this load generator itself used, so a
comparison can state what the client cost on shared cores.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import resource
import time

import aiohttp
import numpy as np


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run(url: str, model: str, sentences: list[str], concurrency: int, duration: float) -> dict:
    source = itertools.cycle(sentences)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    started = time.perf_counter()
    stop_at = started + duration

    async def client() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    async with session.post(url, json={"model": model, "input": [next(source)]},
                                            timeout=aiohttp.ClientTimeout(total=30)) as response:
                        body = await response.json()
                        if response.status != 200 or not body.get("data"):
                            errors[str(response.status)] = errors.get(str(response.status), 0) + 1
                            continue
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                    continue
                latencies.append(time.perf_counter() - t0)

    cpu_before = cpu_seconds()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    lat = np.asarray(latencies) * 1000
    return {"items_per_s": len(latencies) / seconds, "ok": len(latencies), "errors": errors, "seconds": seconds,
            "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
            "load_generator_cpu_s": cpu_seconds() - cpu_before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="e.g. http://127.0.0.1:7997/embeddings")
    parser.add_argument("model", help="the model name the server expects in the request")
    parser.add_argument("sentences", help="a text file, one sentence per line")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    with open(args.sentences, encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f if line.strip()]
    print(json.dumps(asyncio.run(run(args.url, args.model, sentences, args.concurrency, args.duration))))


if __name__ == "__main__":
    main()
