"""The server against what it costs and against what a user would otherwise write, side by side in one run.

    python benchmarks/serve_speed.py ARTIFACT CHECKPOINT --data ../shared/data/ids-sst-dev.csv

ARTIFACT is a `bertzoo export --int8` output of CHECKPOINT. With 64 concurrent clients sending one SST dev sentence
per request (closed loop, `bertzoo.serving.load`):

1. in-process batched ceiling: the same ONNX Runtime backend through `bertzoo.pipeline.predict` in batches of 64, no
   gRPC (fp32 and int8);
2. `bertzoo serve` with the fp32 and the int8 encoder;
3. a plain gRPC server that runs the PyTorch model eagerly, one request at a time (this file, ``--plain-server``);
4. latency at half the fp32 server's saturation throughput (open loop, requests sent at a fixed rate);
5. a mixed load: all five RPCs at once;
6. the server's peak resident memory (VmHWM).

Server and load generator share this machine's cores: every server is measured under the same load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from concurrent import futures
from dataclasses import asdict
from pathlib import Path

import grpc
import numpy as np

from bertzoo.data import SentenceExample
from bertzoo.serving.load import load_items, run_load
from bertzoo.serving.proto import pb2, pb2_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_process_ceiling(artifact: str, variant: str, sentences: list[str], threads: int) -> float:
    """Sentences per second through the backend + shared pipeline, batches of 64, no transport."""
    from bertzoo import pipeline
    from bertzoo.artifact import load_manifest
    from bertzoo.serving.backends import create_backend
    from bertzoo.tasks import Limits
    from bertzoo.tokenization import Tokenizer

    manifest = load_manifest(artifact)
    # Spinning on: with the cores to itself this is the backend's best (the server turns it off, see --ort-spinning).
    backend = create_backend("onnxruntime", artifact, variant=variant, threads=threads, manifest=manifest,
                             spinning=True)
    tokenizer = Tokenizer.from_file(Path(artifact) / manifest["tokenizer"])
    limits = Limits(**manifest["limits"])
    examples = [SentenceExample(str(i), s, None) for i, s in enumerate(sentences)]
    pipeline.predict(backend, "sentiment", examples[:64], tokenizer, limits, 64)  # warm-up
    started = time.perf_counter()
    pipeline.predict(backend, "sentiment", examples, tokenizer, limits, 64)
    return len(examples) / (time.perf_counter() - started)


def start(command: list[str], port: int) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    deadline = time.time() + 300
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[:3]} exited: {process.stderr.read()[-2000:]}")
        try:
            pb2_grpc.BertzooStub(channel).ModelInfo(pb2.ModelInfoRequest(), timeout=2)
            return process
        except grpc.RpcError:
            time.sleep(1)
    raise TimeoutError(f"{command[:3]} did not answer within 300 s")


def peak_rss_mib(process: subprocess.Popen) -> float:
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def closed_loop(port: int, task: str, items: list, concurrency: int, duration: float) -> dict:
    return asyncio.run(run_load(f"127.0.0.1:{port}", task, items, concurrency=concurrency, duration=duration)).summary()


async def _open_loop(port: int, sentences: list[str], rate: float, duration: float) -> dict:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb2_grpc.BertzooStub(channel)
    latencies: list[float] = []
    errors = 0

    async def one(text: str) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        try:
            await stub.Sentiment(pb2.SentimentRequest(texts=[text]), timeout=30)
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
        def ModelInfo(self, request, context):  # noqa: N802 (gRPC method names)
            return pb2.ModelInfoResponse()

        def Sentiment(self, request, context):  # noqa: N802
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("checkpoint")
    parser.add_argument("--data", required=True, help="SST dev file (ids-sst-dev.csv); its folder feeds the mixed load")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--plain-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_server:
        return plain_server(args.checkpoint, args.port)
    sentences = load_items("sentiment", args.data)
    print(f"{len(sentences)} sentences from {args.data}; {args.concurrency} clients; {args.duration:.0f} s per load; "
          f"{args.threads} backend threads; {os.cpu_count()} cores shared with the load generator")
    rows = {}
    for variant in ("fp32", "int8"):
        rows[f"in-process ceiling, {variant}"] = in_process_ceiling(args.artifact, variant, sentences, args.threads)
    bertzoo = [str(Path(sys.executable).with_name("bertzoo")), "serve", args.artifact, "--metrics-port", "0",
               "--threads", str(args.threads)]
    servers = {f"bertzoo serve, {v}": [*bertzoo, "--variant", v] for v in ("fp32", "int8")}
    # The batcher's padding, side by side: to the batch's longest sequence (the default) or to its length bucket.
    servers["bertzoo serve, fp32, --pad-to bucket"] = [*bertzoo, "--variant", "fp32", "--pad-to", "bucket"]
    servers["plain gRPC + PyTorch eager, one request at a time"] = [sys.executable, __file__, args.artifact,
                                                                   args.checkpoint, "--data", args.data,
                                                                   "--plain-server"]
    summaries, extra = {}, {}
    for name, command in servers.items():
        port = free_port()
        process = start([*command, "--port", str(port)], port)
        try:
            summaries[name] = closed_loop(port, "sentiment", sentences, args.concurrency, args.duration)
            rows[name] = summaries[name]["items_per_s"]
            if name == "bertzoo serve, fp32":
                half = rows[name] / 2
                extra["half saturation"] = asyncio.run(_open_loop(port, sentences, half, args.duration))
                extra["mixed"] = mixed(port, Path(args.data).parent, args.concurrency, args.duration)
            extra[f"peak RSS MiB, {name}"] = peak_rss_mib(process)
        finally:
            stop(process)
    plain = rows["plain gRPC + PyTorch eager, one request at a time"]
    print("\n| setup | sentences/s | / in-process ceiling | / plain PyTorch server | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|---|")
    for name, value in rows.items():
        variant = "int8" if "int8" in name else "fp32"
        s = summaries.get(name, {})
        ceiling = rows[f"in-process ceiling, {variant}"]
        lat = f"{s['p50_ms']:.1f} | {s['p99_ms']:.1f} | {sum(s['errors'].values())}" if s else "- | - | -"
        print(f"| {name} | {value:.1f} | {value / ceiling:.2f} | {value / plain:.2f} | {lat} |")
    h = extra["half saturation"]
    print(f"\nfp32 server at half saturation ({h['rate']:.1f} requests/s, open loop, {h['sent']} sent, "
          f"{h['errors']} errors): p50 {h['p50_ms']:.1f} ms, p99 {h['p99_ms']:.1f} ms")
    print("\nmixed load on the fp32 server (all five RPCs at once):")
    for task, s in extra["mixed"].items():
        print(f"- {task}: {s['items_per_s']:.1f} items/s, p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms, "
              f"errors {s['errors'] or 'none'}")
    for key, value in extra.items():
        if key.startswith("peak RSS"):
            print(f"{key}: {value:.0f}")


if __name__ == "__main__":
    main()
