"""Faults and shutdowns of `bertzoo serve ARTIFACT --frontends 2`, each against a fresh server on loopback, one run:

    python -m benchmarks.reliability ARTIFACT [--fuzz-passes 5] [--soak-minutes 10] [--json OUT.json]

1. SIGTERM with 3 Health.Watch streams open: seconds to exit, the exit code, what the watchers were told;
2. SIGKILL of the engine process with watchers open: seconds until the server exits, its code, and whether the
   resource tracker found a leaked semaphore;
3. queue full (``--max-queue 8``): a flood of --flood-clients closed-loop clients in a process of its own (`bertzoo
   bench-serve`), and 100 probes one at a time on channels of their own (so on both front ends): the refusals'
   latency (p50, p99), how many probes were accepted, and the load average beside it;
4. the engine process's memory (VmRSS) idle, after each of --fuzz-passes passes of hostile requests (every RPC, 0 to
   max-items + 2 items, empty, control and invisible characters, texts at the 20,000-character limit, long QA
   contexts), then every 30 s of a --soak-minutes soak of the same;
5. a front end killed under 32 clients on connections of their own: seconds until both front ends hold at least a
   quarter of them again (``--max-connection-age 2``);
6. two `authorization` entries, right then wrong: the status code;
7. the engine's memory at its ceiling: idle after ``--warmup-largest`` (every engine ran its largest batches) at the
   default token budget and at 4,096, against the default warm-up, with the seconds to SERVING.

Every server runs on loopback ports and is stopped by its own PID; nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc

from benchmarks.common.processes import HealthWatchers, connections, free_port, memory_mb, steady_calls
from benchmarks.common.timing import machine
from bertzoo.serving.client import BertzooClient, channel_options
from bertzoo.serving.proto import pb2, pb2_grpc

CHARS = ["", " ", "\n\t ", "\x00", "\u200b", "\ufeff", "🙂" * 50, "[CLS] [SEP] [PAD]", "é" * 300]


class Server:
    """`bertzoo serve ARTIFACT --frontends 2 FLAGS` on loopback, its output kept."""

    def __init__(self, artifact: str, *flags: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bertzoo", "serve", artifact, "--host", "127.0.0.1", "--port", str(self.port),
             "--metrics-port", "0", "--http-port", "0", "--frontends", "2", *flags], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        with BertzooClient(self.target, options=channel_options(retries=False)) as client:
            client.wait_ready(timeout=300)
        time.sleep(1.0)  # every front end SERVING

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def children(self, prefix: str) -> list[int]:
        pids = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return [int(p) for p in pids if Path(f"/proc/{p}/comm").read_text().startswith(prefix)]

    def stop(self) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return code, self.process.communicate()[0]


def drain_with_watchers(artifact: str) -> dict:
    server = Server(artifact)
    watchers = HealthWatchers(server.target)
    began = time.monotonic()
    code, _ = server.stop()
    took = time.monotonic() - began
    return {"exit_code": code, "exit_s": took, "watchers": watchers.close()}


def engine_killed(artifact: str) -> dict:
    server = Server(artifact)
    watchers = HealthWatchers(server.target)
    [engine] = server.children("bertzoo-engine")
    began = time.monotonic()
    os.kill(engine, signal.SIGKILL)
    code = server.process.wait(60)
    took = time.monotonic() - began
    output = server.stop()[1]
    return {"exit_code": code, "exit_s": took, "watchers": watchers.close(),
            "leaked_semaphore": "leaked semaphore" in output}


def queue_full(artifact: str, flood_clients: int, data: str | None) -> dict:
    server = Server(artifact, "--max-queue", "8")
    flood = subprocess.Popen([sys.executable, "-m", "bertzoo", "bench-serve", "--target", server.target,
                              "--concurrency", str(flood_clients), "--duration", "40",
                              *(["--input", data] if data else [])],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(8.0)  # the flood at full speed
    load_before = os.getloadavg()[0]
    refused, accepted_ms, errors = [], [], {}
    for k in range(100):
        options = [*channel_options(retries=False), ("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(server.target, options=options) as channel:
            stub = pb2_grpc.BertzooStub(channel)
            stub.ModelInfo(pb2.ModelInfoRequest(), timeout=10)  # connected: the probe times the call alone
            began = time.perf_counter()
            try:
                stub.Sentiment(pb2.SentimentRequest(texts=[f"probe {k}"]), timeout=10)
                accepted_ms.append(1000 * (time.perf_counter() - began))
            except grpc.RpcError as e:
                took = 1000 * (time.perf_counter() - began)
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    refused.append(took)
                else:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1
        time.sleep(0.05)
    load_after = os.getloadavg()[0]
    flood.kill()
    flood.wait()
    server.stop()
    refused.sort()
    return {"flood_clients": flood_clients, "refused": len(refused), "accepted": len(accepted_ms), "errors": errors,
            "refusal_p50_ms": statistics.median(refused) if refused else None,
            "refusal_p99_ms": refused[min(len(refused) - 1, int(0.99 * len(refused)))] if refused else None,
            "accepted_ms": accepted_ms, "load_average_1min": [load_before, load_after]}


def hostile_request(rng: random.Random, max_items: int) -> tuple[str, list]:
    def text() -> str:
        pick = rng.random()
        if pick < 0.3:
            return rng.choice(CHARS)
        if pick < 0.5:
            return rng.choice("aé🙂\u200b字") * rng.randint(19_990, 20_010)  # at the character limit
        return "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(0, 400)))

    rpc = rng.choice(["sentiment", "embed", "paraphrase", "similarity", "qa"])
    count = rng.randint(0, max_items + 2)
    if rpc in ("sentiment", "embed"):
        return rpc, [text() for _ in range(count)]
    return rpc, [(text(), text()) for _ in range(count)]


def fuzz_pass(target: str, seed: int, requests: int, max_items: int) -> dict:
    rng, codes = random.Random(seed), {}
    with BertzooClient(target, options=channel_options(retries=False), timeout=60) as client:
        for _ in range(requests):
            rpc, items = hostile_request(rng, max_items)
            try:
                getattr(client, rpc)(items)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
    return codes


def memory(artifact: str, passes: int, soak_minutes: float, requests: int) -> dict:
    server = Server(artifact, "--max-items", "16")
    [engine] = server.children("bertzoo-engine")
    rss = [("idle", memory_mb(engine)["VmRSS"])]
    codes: dict = {"passes": [], "soak": {}}  # the status codes answered: per pass, and summed over the soak
    for k in range(passes):
        codes["passes"].append(fuzz_pass(server.target, k, requests, 16))
        rss.append((f"after pass {k + 1}", memory_mb(engine)["VmRSS"]))
        print(f"  engine RSS {rss[-1]}", flush=True)
    began, k = time.monotonic(), passes
    while time.monotonic() - began < 60 * soak_minutes:
        tick = time.monotonic()
        while time.monotonic() - tick < 30:
            for code, n in fuzz_pass(server.target, k, 20, 16).items():
                codes["soak"][code] = codes["soak"].get(code, 0) + n
            k += 1
        rss.append((f"soak {(time.monotonic() - began) / 60:.1f} min", memory_mb(engine)["VmRSS"]))
        print(f"  engine RSS {rss[-1]}", flush=True)
    server.stop()
    return {"engine_rss_mb": rss, "codes": codes}


def memory_ceiling(artifact: str) -> dict:
    """The engine's memory at its ceiling (``--warmup-largest``: every engine has run its largest batches) against
    after the default warm-up, at the default token budget and a quarter of it, with the time to SERVING."""
    rows = []
    for flags in ([], ["--warmup-largest"], ["--warmup-largest", "--max-batch-tokens", "4096"]):
        began = time.monotonic()
        server = Server(artifact, *flags)
        ready = time.monotonic() - began - 1.0  # Server waits 1 s after the first SERVING
        [engine] = server.children("bertzoo-engine")
        rows.append({"flags": flags, "seconds_to_serving": round(ready, 1),
                     "engine_rss_mb": round(memory_mb(engine)["VmRSS"])})
        server.stop()
    return {"rows": rows}


def reconnect_after_restart(artifact: str) -> dict:
    server = Server(artifact, "--max-connection-age", "2")
    with steady_calls(server.target, 32):
        time.sleep(2.0)
        victim = server.children("bertzoo-fe-")[0]
        os.kill(victim, signal.SIGKILL)
        began, shares, took = time.monotonic(), {}, None
        while time.monotonic() - began < 30:
            time.sleep(0.25)
            shares = {pid: connections(pid, server.port) for pid in server.children("bertzoo-fe-") if pid != victim}
            if len(shares) == 2 and min(shares.values()) >= 8:
                took = time.monotonic() - began
                break
    server.stop()
    return {"seconds_to_a_quarter_each": took, "connections": list(shares.values())}


def duplicate_authorization(artifact: str) -> dict:
    server = Server(artifact, "--auth-token", "s3cret")
    with grpc.insecure_channel(server.target) as channel:
        try:
            pb2_grpc.BertzooStub(channel).ModelInfo(pb2.ModelInfoRequest(), timeout=10, metadata=[
                ("authorization", "Bearer s3cret"), ("authorization", "Bearer wrong")])
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
    server.stop()
    return {"right_then_wrong": code}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--data", default=None, help="the flood's sentences (default: the bundled sample)")
    parser.add_argument("--flood-clients", type=int, default=24)
    parser.add_argument("--fuzz-passes", type=int, default=5)
    parser.add_argument("--fuzz-requests", type=int, default=300, help="hostile requests per pass")
    parser.add_argument("--soak-minutes", type=float, default=10.0)
    parser.add_argument("--parts", nargs="+", default=None, metavar="PART",
                        help="run only these (sigterm_with_watchers, engine_killed_with_watchers, queue_full, "
                             "reconnect_after_front_end_restart, duplicate_authorization, memory, memory_ceiling)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: dict = {"machine": machine(), "command": " ".join(sys.argv)}
    print(json.dumps(results["machine"]), flush=True)
    for name, run in (("sigterm_with_watchers", lambda: drain_with_watchers(args.artifact)),
                      ("engine_killed_with_watchers", lambda: engine_killed(args.artifact)),
                      ("queue_full", lambda: queue_full(args.artifact, args.flood_clients, args.data)),
                      ("reconnect_after_front_end_restart", lambda: reconnect_after_restart(args.artifact)),
                      ("duplicate_authorization", lambda: duplicate_authorization(args.artifact)),
                      ("memory", lambda: memory(args.artifact, args.fuzz_passes, args.soak_minutes,
                                                args.fuzz_requests)),
                      ("memory_ceiling", lambda: memory_ceiling(args.artifact))):
        if args.parts and name not in args.parts:
            continue
        results[name] = run()
        shown = {k: v for k, v in results[name].items() if k not in ("accepted_ms", "codes")}
        print(f"{name}: {json.dumps(shown)}", flush=True)
        if args.json:  # kept as it grows
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
