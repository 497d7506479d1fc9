"""The server under a load generator that costs almost no CPU: nghttp2's h2load (C) against our Python gRPC client, on
the same sentences, side by side. On 2 shared cores whatever the client burns the server lacks: this measures how
much of the gap to the in-process ceiling that is (RESULTS.md: a few percent at most).

    python -m benchmarks.serve_h2load ARTIFACT --data ../shared/data/ids-sst-dev.csv [--variants int8 fp32] \
        [--generators h2load h2load-http python] [--per-request 32] [--infinity VENV --infinity-models MODELS] \
        [-- --instances 2]
        # after --: flags for `bertzoo serve`; h2load-http: the same load over HTTP/1.1 (--http-port's routes)

h2load sends one fixed body per process, so the load is --groups h2load processes, each with its own sentence (the SST
dev sentences at evenly spaced quantiles of token length) and concurrency / groups connections of one stream each; the
Python client and the in-process ceiling get the same sentences, equally often. With ``--per-request K`` each h2load
body carries K sentences (its group's first, then the next groups' in turn) and rates count sentences. h2load counts
an HTTP 200 as a success even when gRPC fails in the trailers, so the server's own bertzoo_requests_total is read
before and after and every answer must be OK (but the calls in flight when the load stops, which are CANCELLED). Needs
`h2load` (Debian: apt-get install nghttp2-client).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from benchmarks.common.infinity_peer import INFINITY_ENGINES, infinity_rows, start_infinity
from benchmarks.common.processes import cpu_seconds, effective_config, free_port, scrape_metrics, start_bertzoo, stop
from benchmarks.common.served_variants import VARIANTS, in_process_ceiling
from benchmarks.common.server_loads import closed_loop, measured_load
from benchmarks.common.timing import machine
from bertzoo.artifact import load_manifest
from bertzoo.serving.load import load_items
from bertzoo.serving.proto import pb2
from bertzoo.tokenization import Tokenizer

RPC = {"sentiment": ("Sentiment", pb2.SentimentRequest), "embed": ("Embed", pb2.EmbedRequest)}


def quantile_sentences(artifact: str, sentences: list[str], groups: int) -> list[str]:
    """The sentences at the middle of each of ``groups`` equal slices of the token-length order."""
    manifest = load_manifest(artifact)
    tokenizer = Tokenizer.from_file(Path(artifact) / manifest["tokenizer"])
    return quantiles_by_length(tokenizer, sentences, manifest["limits"]["max_seq_length"], groups)


def quantiles_by_length(tokenizer: Tokenizer, sentences: list[str], max_length: int, groups: int) -> list[str]:
    """quantile_sentences for a model given by its tokenizer and sentence limit (a checkpoint has no manifest)."""
    lengths = [len(e.input_ids) for e in tokenizer.encode_sentences(sentences, max_length)]
    ordered = sorted(range(len(sentences)), key=lambda i: lengths[i])
    return [sentences[ordered[(2 * g + 1) * len(ordered) // (2 * groups)]] for g in range(groups)]


def ok_answers(metrics_port: int, task: str) -> dict[str, float]:
    """bertzoo_requests_total of ``task`` by status code (gRPC and HTTP together), from the server's Prometheus
    endpoint."""
    counts: dict[str, float] = {}
    for key, value in scrape_metrics(metrics_port).items():
        if found := re.fullmatch(rf'bertzoo_requests_total{{code="(\w+)",protocol="\w+",task="{task}"}}', key):
            counts[found.group(1)] = counts.get(found.group(1), 0.0) + value
    return counts


def h2load(url: str, bodies: list[bytes], headers: list[str], concurrency: int, seconds: int, workdir: Path,
           http1: bool = False) -> dict:
    """One h2load process per body, all at once for ``seconds`` after a 3 s warm-up, ``concurrency`` connections in
    all; their summed rate, and the cores they used. Any 4xx or 5xx answer is an error."""
    commands = []
    for g, body in enumerate(bodies):
        path = workdir / f"body-{g}.bin"
        path.write_bytes(body)
        commands.append(["h2load", *(["--h1"] if http1 else []), "-D", str(seconds), "--warm-up-time", "3",
                         "-c", str(concurrency // len(bodies)), "-m", "1", "-d", str(path),
                         *(x for h in headers for x in ("-H", h)), url])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    processes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands]
    outputs = [p.communicate()[0] for p in processes]
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rate, failed, latencies = 0.0, 0, []
    for out in outputs:
        found = re.search(r"finished in .*?, ([\d.]+) req/s", out)
        counts = re.search(r"requests: .*? (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", out)
        codes = re.search(r"status codes: \d+ 2xx, \d+ 3xx, (\d+) 4xx, (\d+) 5xx", out)
        latency = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
        if not (found and counts and codes and latency):
            raise RuntimeError(f"unreadable h2load output:\n{out}")
        if any(int(x) for x in codes.groups()):
            raise RuntimeError(f"{url}: error answers:\n{out}")
        rate += float(found.group(1))
        failed += sum(int(x) for x in counts.groups()[1:])
        latencies.append(latency.group(3))
    cores = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / wall
    return {"items_per_s": rate, "failed": failed, "mean_latency_per_group": latencies, "load_generator_cores": cores,
            "wall_s": wall}


def with_server_cores(pid: int, load) -> dict:
    """``load()``'s summary with the cores the server ``pid`` used meanwhile (measured_load also charges this
    process's own CPU to the load generator, which for h2load runs elsewhere)."""
    server0, t0 = cpu_seconds(pid), time.perf_counter()
    summary = load()
    return {**summary, "server_cores": (cpu_seconds(pid) - server0) / (time.perf_counter() - t0)}


def request_texts(sentences: list[str], per_request: int) -> list[list[str]]:
    """One request's texts per group: ``per_request`` sentences, group g's own first, then the next groups' in turn."""
    return [[sentences[(g + i) % len(sentences)] for i in range(per_request)] for g in range(len(sentences))]


def grpc_bodies(task: str, requests: list[list[str]]) -> list[bytes]:
    """One request per group, as gRPC frames it: a 0 byte, the length (4 bytes, big-endian), the message."""
    bodies = []
    for texts in requests:
        message = RPC[task][1](texts=texts).SerializeToString()
        bodies.append(b"\x00" + struct.pack(">I", len(message)) + message)
    return bodies


def http_bodies(task: str, requests: list[list[str]]) -> tuple[str, list[bytes]]:
    """The HTTP route and one JSON body per group: OpenAI's /v1/embeddings (the body infinity-emb gets) for
    embed, the RPC's own route otherwise."""
    if task == "embed":
        return "/v1/embeddings", [json.dumps({"model": "bertzoo", "input": texts}).encode() for texts in requests]
    return f"/{task}", [json.dumps({"texts": texts}).encode() for texts in requests]


def per_sentence(summary: dict, per_request: int) -> dict:
    """h2load's summary with its rate in sentences (``items_per_s``) beside requests."""
    return {**summary, "requests_per_s": summary["items_per_s"], "items_per_s": summary["items_per_s"] * per_request,
            "sentences_per_request": per_request}


def serve_once(args: argparse.Namespace, variant: str, task: str, generator: str, sentences: list[str],
               repeated: list[str], workdir: Path) -> dict:
    """A fresh server with ``variant``, loaded by ``generator`` (h2load over gRPC, h2load over HTTP/1.1, or our
    Python gRPC client); every answer OK."""
    port, metrics_port, http_port = free_port(), free_port(), free_port()
    process = start_bertzoo(args.artifact, port, *VARIANTS[variant][2], *args.serve_flags, "--http-port",
                            str(http_port), metrics_port=metrics_port)
    try:
        before = ok_answers(metrics_port, task)
        requests = request_texts(sentences, args.per_request)
        if generator == "h2load":
            summary = per_sentence(with_server_cores(process.pid, partial(
                h2load, f"http://127.0.0.1:{port}/bertzoo.v1.Bertzoo/{RPC[task][0]}", grpc_bodies(task, requests),
                ["content-type: application/grpc", "te: trailers"], args.concurrency, args.seconds, workdir)),
                args.per_request)
        elif generator == "h2load-http":
            route, bodies = http_bodies(task, requests)
            summary = per_sentence(with_server_cores(process.pid, partial(
                h2load, f"http://127.0.0.1:{http_port}{route}", bodies, ["content-type: application/json"],
                args.concurrency, args.seconds, workdir, http1=True)), args.per_request)
        else:
            summary = measured_load(process.pid, lambda: closed_loop(port, task, repeated, args.concurrency,
                                                                     args.seconds))
        after = ok_answers(metrics_port, task)
    finally:
        stop(process)
    settings = effective_config(process)
    codes = {c: after.get(c, 0) - before.get(c, 0) for c in after}
    # A load generator that stops at its deadline cancels the calls then in flight: at most one per connection.
    if any(n for c, n in codes.items() if c not in ("OK", "CANCELLED")) or codes.get("CANCELLED", 0) > args.concurrency:
        raise RuntimeError(f"{variant} {task} {generator}: answers other than OK: {codes}")
    return {**summary, "server_answers": codes, "server_settings": settings}


def infinity_h2load_rows(args: argparse.Namespace, sentences: list[str], workdir: Path, per_request: int = 1) -> dict:
    """infinity-emb at each CPU engine under h2load over HTTP/1.1: its /embeddings, ``per_request`` sentences a
    request."""
    rows = {}
    for name, (engine, folder) in INFINITY_ENGINES.items():
        process, port, model = start_infinity(args.infinity, args.infinity_models, engine, folder)
        try:
            bodies = [json.dumps({"model": model, "input": texts}).encode()
                      for texts in request_texts(sentences, per_request)]
            rows[name] = per_sentence(with_server_cores(process.pid, partial(
                h2load, f"http://127.0.0.1:{port}/embeddings", bodies, ["content-type: application/json"],
                args.concurrency, args.seconds, workdir, http1=True)), per_request)
        finally:
            stop(process)
        print(f"{name:55} h2load {rows[name]['items_per_s']:7.1f}/s; server {rows[name]['server_cores']:.2f} cores, "
              f"load generator {rows[name]['load_generator_cores']:.2f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--data", required=True)
    parser.add_argument("--variants", nargs="+", default=["int8", "fp32"], choices=list(VARIANTS))
    parser.add_argument("--tasks", nargs="+", default=["sentiment", "embed"], choices=list(RPC))
    parser.add_argument("--generators", nargs="+", default=["h2load", "h2load-http", "python"],
                        choices=["h2load", "h2load-http", "python"],
                        help="h2load over gRPC, h2load over HTTP/1.1 (--http-port's routes), our Python gRPC client")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--per-request", type=int, default=1, help="sentences per h2load request (rates count "
                        "sentences); above 1, h2load generators only")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2, help="the in-process ceiling's threads (the machine's cores)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--infinity", default=None, metavar="VENV", help="also infinity-emb from this venv "
                        "(benchmarks/peers/infinity_setup.sh), under h2load and under our Python HTTP client")
    parser.add_argument("--infinity-models", default=None, metavar="MODELS")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)  # after --: more `bertzoo serve` flags
    args = parser.parse_args(argv[:split])
    args.serve_flags = argv[split + 1:]
    if args.per_request > 1 and "python" in args.generators:
        parser.error("--per-request above 1 is for the h2load generators: leave python out of --generators")
    if shutil.which("h2load") is None:
        sys.exit("h2load not found: apt-get install nghttp2-client")
    sentences = quantile_sentences(args.artifact, load_items("sentiment", args.data), args.groups)
    repeated = sentences * (1100 // len(sentences))  # about the dev set's size, each sentence equally often
    results = {"machine": machine(), "sentences": sentences, "per_request": args.per_request,
               "serve_flags": args.serve_flags, "rows": []}
    print(json.dumps(results["machine"]))
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            for task in args.tasks:
                # the best over the settings of ceiling.in_process_rates, as every serving benchmark takes it
                ceiling = in_process_ceiling(args.artifact, variant, repeated, args.threads, (task,))[task]["ceiling"]
                row = {"variant": variant, "task": task, "ceiling_per_s": ceiling}
                for generator in args.generators:
                    summary = serve_once(args, variant, task, generator, sentences, repeated, Path(tmp))
                    row[generator] = summary
                    print(f"{variant:10} {task:9} {generator:11} {summary['items_per_s']:7.1f}/s = "
                          f"{summary['items_per_s'] / ceiling:.2f} of the ceiling ({ceiling:.1f}/s); server "
                          f"{summary['server_cores']:.2f} cores, load generator {summary['load_generator_cores']:.2f}",
                          flush=True)
                results["rows"].append(row)
        if args.infinity:
            results["infinity"] = {"h2load": infinity_h2load_rows(args, sentences, Path(tmp), args.per_request)}
            if "python" in args.generators:
                results["infinity"]["python"] = infinity_rows(args.infinity, args.infinity_models, repeated,
                                                              args.concurrency, args.seconds)
            for name, row in results["infinity"].get("python", {}).items():
                print(f"{name:55} python {row['items_per_s']:7.1f}/s; server {row['server_cores']:.2f} cores, "
                      f"load generator {row['load_generator_cores']:.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
