"""Triton Inference Server's C++ front end against `bertzoo serve`'s Python one, on the same engine: alternating rounds
of the in-process ceiling, `bertzoo serve` and Triton, each ratio taken within its round.

    bash benchmarks/peers/triton_setup.sh /tmp/triton-venv
    python benchmarks/serve_triton.py ARTIFACT --triton /tmp/triton-venv --data ../shared/data/ids-sst-dev.csv \
        [--variants fp32,int8 --task embed --rounds 6 --seconds 15 --out RUN.json]

ARTIFACT is a `bertzoo export --optimize --int8 --triton` output. Triton is the build nvidia-pytriton carries (the
only one a machine without containers can install; peers/triton_setup.sh), which has the Python backend and no
onnxruntime backend: it serves the repository's ``bertzoo`` model (export/triton_python_model.py) with ENGINE
onnxruntime, so both servers run the same engine (the artifact's graph on bertzoo's ONNX Runtime backend, two
single-threaded instances) and differ in what sits in front of it:

- `bertzoo serve --instances 2`: grpcio's asyncio server, bertzoo's batcher, two engine threads in one process;
- Triton: its C++ gRPC server and dynamic batcher, two Python-backend instances (processes), each handed every
  request that arrived while it was busy, their rows run as one batch.

Both answer ``--concurrency`` closed-loop clients sending one SST dev sentence per request (unary, each client its own
connection; Embed, or Sentiment with ``--task sentiment``), from this process. Before the rounds, both servers answer
the same sentences and their answers are compared. Per round and variant: the ceiling at its fastest setting (chosen
once, as serve_goals.py does), then the two servers in an order that reverses every other round. Printed: each
server's rate against the ceiling and Triton's against bertzoo's, mean +- 95% t-interval over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import struct
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
from intervals import mean_ci
from processes import free_port, start, start_bertzoo, stop
from served_variants import VARIANTS, ceiling_at, in_process_ceiling
from server_loads import closed_loop, measured_load
from timing import machine

# Triton's gRPC messages and stub (bertzoo[test] installs tritonclient; the gRPC extra is not needed)
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bertzoo.export.triton_repo import in_process_engine_config
from bertzoo.serving.client import BertzooClient
from bertzoo.serving.load import LoadReport, load_items

SERVERS = ("bertzoo", "triton")


def start_triton(args, variant: str, folder: Path) -> tuple:
    """tritonserver on loopback with a repository of the ``bertzoo`` model alone, once it is ready: (process, gRPC
    port, HTTP port)."""
    repository = folder / variant
    shutil.rmtree(repository, ignore_errors=True)
    shutil.copytree(Path(args.artifact) / "triton" / "bertzoo", repository / "bertzoo")
    config = repository / "bertzoo" / "config.pbtxt"
    config.write_text(in_process_engine_config(config.read_text(), Path(args.artifact), variant, args.instances,
                                               args.threads // args.instances, str(Path(args.triton).resolve())))
    grpc_port, http_port = free_port(), free_port()
    venv = Path(args.triton)

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as response:
            return response.status == 200

    process = start([str(venv / "bin" / "tritonserver"), "--model-repository", str(repository),
                     "--backend-directory", str(venv / "backends"), "--grpc-address", "127.0.0.1",
                     "--grpc-port", str(grpc_port), "--http-address", "127.0.0.1", "--http-port", str(http_port),
                     "--allow-metrics", "false", "--exit-timeout-secs", "5", "--log-info", "false"], ready)
    return process, grpc_port, http_port


def infer_requests(task: str, sentences: list[str]) -> list:
    """One ModelInferRequest per sentence: TASK and TEXT_A, one row each, BYTES serialized as Triton's raw input
    contents (a little-endian 4-byte length, then the bytes)."""
    requests = []
    for sentence in sentences:
        request = service_pb2.ModelInferRequest(model_name="bertzoo")
        for name, text in (("TASK", task), ("TEXT_A", sentence)):
            tensor = request.inputs.add(name=name, datatype="BYTES")
            tensor.shape.extend([1, 1])
            data = text.encode("utf-8")
            request.raw_input_contents.append(struct.pack("<I", len(data)) + data)
        requests.append(request)
    return requests


async def triton_load(port: int, requests: list, concurrency: int, duration: float, task: str) -> dict:
    """The closed loop of serving.load.run_load, on Triton's ModelInfer: each client its own connection."""
    source = itertools.cycle(requests)
    report = LoadReport(task, concurrency, 1)
    stop_at = time.perf_counter() + duration

    async def client() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            infer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    await infer(next(source), timeout=30)
                except grpc.aio.AioRpcError as e:
                    report.codes[e.code().name] += 1
                else:
                    report.latencies.append(time.perf_counter() - t0)
                    report.codes["OK"] += 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    report.seconds = time.perf_counter() - started
    return report.summary()


def served(server: str, variant: str, args, sentences: list[str], folder: Path) -> dict:
    """One server with ``variant`` under the closed loop (after a 3 s warm-up)."""
    if server == "bertzoo":
        port = free_port()
        process = start_bertzoo(args.artifact, port, *VARIANTS[variant][2], "--threads", str(args.threads),
                                "--instances", str(args.instances))
        try:
            return measured_load(process.pid, lambda: closed_loop(port, args.task, sentences, args.concurrency,
                                                             args.seconds))
        finally:
            stop(process)
    process, port, _ = start_triton(args, variant, folder)
    requests = infer_requests(args.task, sentences)
    try:
        asyncio.run(triton_load(port, requests, args.concurrency, 3, args.task))
        return measured_load(process.pid, lambda: asyncio.run(triton_load(port, requests, args.concurrency, args.seconds,
                                                                     args.task)))
    finally:
        stop(process)


def answers_agree(args, variant: str, sentences: list[str], folder: Path) -> dict:
    """Both servers' answers to the same sentences, one per request: the largest difference between them."""
    port = free_port()
    process = start_bertzoo(args.artifact, port, *VARIANTS[variant][2])
    try:
        with BertzooClient(f"127.0.0.1:{port}") as client:
            if args.task == "embed":
                ours = np.array([list(client.embed([s]).embeddings[0].values) for s in sentences])
            else:
                ours = np.array([list(client.sentiment([s]).results[0].probabilities) for s in sentences])
    finally:
        stop(process)
    process, port, _ = start_triton(args, variant, folder)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
            key = "values" if args.task == "embed" else "probabilities"
            theirs = np.array([json.loads(infer(r).raw_output_contents[0][4:])[key]
                               for r in infer_requests(args.task, sentences)])
    finally:
        stop(process)
    return {"items": len(sentences), "max_abs_difference": float(np.abs(ours - theirs).max()),
            "same_argmax": float((ours.argmax(1) == theirs.argmax(1)).mean())}


def ratios(rounds: list[dict], variants: list[str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for variant in variants:
        for server in SERVERS:
            out[f"{variant} {server} of ceiling"] = [r[variant][server]["items_per_s"] / r[variant]["ceiling"]
                                                     for r in rounds]
        out[f"{variant} triton / bertzoo"] = [r[variant]["triton"]["items_per_s"] / r[variant]["bertzoo"]["items_per_s"]
                                              for r in rounds]
    return out


def report(values: dict[str, list[float]]) -> None:
    print("\n| ratio | rounds | mean +- 95% |\n|---|---|---|")
    for name, vals in values.items():
        mean, _, half = mean_ci(vals)
        print(f"| {name} | {' '.join(f'{v:.3f}' for v in vals)} | {mean:.3f} +- {half:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", help="a `bertzoo export --optimize --int8 --triton` output")
    parser.add_argument("--triton", required=True, metavar="VENV", help="peers/triton_setup.sh's virtual environment")
    parser.add_argument("--data", required=True, help="SST dev file (ids-sst-dev.csv)")
    parser.add_argument("--variants", default="fp32,int8", help="comma-separated, of fp32, optimized, int8")
    parser.add_argument("--task", default="embed", choices=("embed", "sentiment"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--agreement-items", type=int, default=200)
    parser.add_argument("--out", help="also write every round as JSON here")
    args = parser.parse_args()
    args.variants = args.variants.split(",")
    if unknown := [v for v in args.variants if v not in ("fp32", "optimized", "int8")]:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from fp32, optimized, int8")
    if not (Path(args.artifact) / "triton" / "bertzoo" / "config.pbtxt").is_file():
        parser.error(f"{args.artifact}: no triton/bertzoo model; export with --triton")
    if not (Path(args.triton) / "bin" / "tritonserver").exists():
        parser.error(f"{args.triton}: no bin/tritonserver; run benchmarks/peers/triton_setup.sh {args.triton}")
    sentences = load_items("sentiment", args.data)
    print(json.dumps(machine()), flush=True)
    settings, agreement, rounds = {}, {}, []
    with tempfile.TemporaryDirectory(prefix="bertzoo-triton-") as scratch:
        folder = Path(scratch)
        for variant in args.variants:
            agreement[variant] = answers_agree(args, variant, sentences[:args.agreement_items], folder)
            found = in_process_ceiling(args.artifact, variant, sentences, args.threads, tasks=(args.task,))[args.task]
            settings[variant] = found["best"]
            print(f"{variant}: answers {agreement[variant]}; ceiling {found['ceiling']:.1f}/s at {settings[variant]}",
                  flush=True)
        for r in range(args.rounds):
            results = {}
            for variant in args.variants if r % 2 == 0 else args.variants[::-1]:
                results[variant] = {"ceiling": ceiling_at(args.artifact, variant, sentences, args.threads, args.task,
                                                          settings[variant])}
                for server in SERVERS if r % 2 == 0 else SERVERS[::-1]:
                    s = results[variant][server] = served(server, variant, args, sentences, folder)
                    print(f"round {r} {variant} {server}: {s['items_per_s']:.1f}/s (ceiling "
                          f"{results[variant]['ceiling']:.1f}/s), p50 {s['p50_ms']:.0f} ms p99 {s['p99_ms']:.0f} ms, "
                          f"server {s['server_cores']:.2f} cores, load generator {s['load_generator_cores']:.2f}",
                          flush=True)
            rounds.append(results)
    values = ratios(rounds, args.variants)
    report(values)
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine(), "args": vars(args), "settings": settings,
                                              "agreement": agreement, "rounds": rounds, "ratios": values}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
