"""`bertzoo serve --frontends N`: what the request path can carry with N front-end processes, side by side in one run.

    python -m benchmarks.serve_frontends --probe DIR [--artifact ARTIFACT] [--data ../shared/data/ids-sst-dev.csv] \
        [--frontends 1 2] [--rounds 3] [--json FILE]

1. **Front-end capacity**, on a *front-end probe*: a 1-layer, hidden-32 model with random weights (built into DIR by
   this script if absent, exported like any other; its answers mean nothing), whose engine costs next to nothing, so
   a server's rate is what its request path can do. For each N of --frontends, alternating over --rounds: a fresh
   server, one-sentence Sentiment calls from h2load (C: almost no CPU of its own, nghttp2-client) at --concurrency
   connections, and the CPU seconds per request of the front ends, the engine and the parent (by process name), and
   of the load generator.
2. With --artifact (a real model's `bertzoo export --int8` output): each of --variants under the same load, against
   its in-process ceiling (served_variants.in_process_ceiling), with one and two engine instances, at each N.
3. With --artifact and --defaults: Embed, `bertzoo serve ARTIFACT` with no engine flags (what `auto` picks here)
   against the old defaults (ONNX Runtime fp32, one instance, one process) and, with --infinity, the peer
   infinity-emb at each of its CPU engines under the same h2load load (serve_h2load.infinity_h2load_rows).
4. With --run (a `bertzoo train` checkpoint) on a GPU: the torch engine on CUDA (fp16, CUDA graphs) served at each N
   of --frontends under --gpu-concurrency connections, against that engine's in-process ceiling on the same sentences
   (gpu_check.cuda_ceiling); then a lone request (benchmarks/lone_request.py) with N = 1 and with `auto`, of one SST
   sentence and of one 128-token text; with --gpu-engines, engine replicas (``--engines``) at the largest N, and
   with --gpu-per-request, requests of that many sentences (Embed and Sentiment) at each replica count. Runs first,
   before the probe.

Every answer is checked OK on the server's own counters (serve_h2load.serve_once's rule).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common.processes import effective_config, free_port, start_bertzoo, stat_cpu_seconds, stop
from benchmarks.common.served_variants import VARIANTS, in_process_ceiling
from benchmarks.common.timing import machine
from benchmarks.serve_h2load import (
    RPC,
    grpc_bodies,
    h2load,
    http_bodies,
    infinity_h2load_rows,
    ok_answers,
    per_sentence,
    quantile_sentences,
    quantiles_by_length,
    request_texts,
)
from bertzoo.atomic import atomic_write_text
from bertzoo.serving.load import load_items

# Part 3's servers: what `bertzoo serve ARTIFACT` ran before its defaults followed the machine, and what it runs now.
DEFAULTS = {"old defaults": ["--backend", "onnxruntime", "--variant", "fp32", "--instances", "1", "--frontends", "1"],
            "new defaults (auto)": []}
PROBE_ENCODER = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                 "max_position_embeddings": 512}


def random_run(directory: Path, encoder_overrides: dict | None = None) -> Path:
    """A checkpoint in ``directory``/run with random weights, of the default backbone's shape or with
    ``encoder_overrides``, trained 1 step on the bundled samples: for speed figures, which do not depend on the
    weights' values, on a machine a trained model's weights would have to travel to (each call to the GPU
    machine carries 64 MiB). Kept if already there."""
    run = directory / "run"
    if (run / "LATEST").exists():
        return run
    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.train import train

    train(TrainConfig(out_dir=str(run), random_init=True, encoder_overrides=encoder_overrides or {}, limit_per_task=8,
                      batch_size=4, max_steps=1, progress=False, eval_every_epoch=False))
    return run


def build_probe(directory: Path) -> Path:
    """The front-end probe's artifact in ``directory``/artifact: a tiny model (PROBE_ENCODER), random weights."""
    artifact = directory / "artifact"
    if (artifact / "manifest.json").exists():
        return artifact
    from bertzoo.export.exporter import ExportOptions, export_checkpoint

    export_checkpoint(random_run(directory, PROBE_ENCODER), artifact, ExportOptions(parity_limit=4))
    return artifact


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cpu_by_role(pid: int) -> dict[str, float]:
    """CPU seconds so far of the server ``pid`` itself ("parent": with N = 1 the whole server), its front ends and
    its engine (its children, told apart by the names they give themselves)."""
    roles = {"parent": stat_cpu_seconds(Path(f"/proc/{pid}/stat")), "frontends": 0.0, "engine": 0.0}
    children = Path(f"/proc/{pid}/task/{pid}/children")
    for child in children.read_text().split() if children.exists() else []:
        name = process_name(int(child))
        role = "engine" if name.startswith("bertzoo-engine") else "frontends" if name.startswith("bertzoo-fe-") else None
        if role is not None:
            roles[role] += stat_cpu_seconds(Path(f"/proc/{child}/stat"))
    return roles


def served(artifact: str, flags: list[str], sentences: list[str], args: argparse.Namespace, workdir: Path,
           task: str = "sentiment", per_request: int = 1, http: bool = False) -> dict:
    """A fresh server with ``flags`` under h2load, ``per_request`` sentences a request, over gRPC or (``http``) its
    HTTP routes (serve_h2load.http_bodies): sentences/s (``items_per_s``) and requests/s, CPU per request by role,
    every answer OK."""
    port, metrics_port, http_port = free_port(), free_port(), free_port()
    process = start_bertzoo(artifact, port, *flags, "--http-port", str(http_port), metrics_port=metrics_port)
    try:
        time.sleep(1.0)  # every front end has turned SERVING (start_bertzoo returns at the first answer)
        before, cpu0, t0 = ok_answers(metrics_port, task), cpu_by_role(process.pid), time.perf_counter()
        requests = request_texts(sentences, per_request)
        if http:
            route, bodies = http_bodies(task, requests)
            summary = h2load(f"http://127.0.0.1:{http_port}{route}", bodies, ["content-type: application/json"],
                             args.concurrency, args.seconds, workdir, http1=True)
        else:
            summary = h2load(f"http://127.0.0.1:{port}/bertzoo.v1.Bertzoo/{RPC[task][0]}", grpc_bodies(task, requests),
                             ["content-type: application/grpc", "te: trailers"], args.concurrency, args.seconds,
                             workdir)
        summary = per_sentence(summary, per_request)
        wall, cpu1, after = time.perf_counter() - t0, cpu_by_role(process.pid), ok_answers(metrics_port, task)
    finally:
        stop(process)
    settings = effective_config(process)  # what each auto resolved to
    codes = {c: after.get(c, 0) - before.get(c, 0) for c in after}
    if any(n for c, n in codes.items() if c not in ("OK", "CANCELLED")) or codes.get("CANCELLED", 0) > args.concurrency:
        raise RuntimeError(f"{flags}: answers other than OK: {codes}")
    answered = codes.get("OK", 0)  # warm-up included: the CPU was measured over the same span
    cpu = {role: (cpu1[role] - cpu0[role]) for role in cpu0}
    return {**summary, "server_answers": codes, "server_settings": settings,
            "server_cores": sum(cpu.values()) / wall,
            "cpu_ms_per_request": {role: 1000 * seconds / answered for role, seconds in cpu.items()},
            "load_generator_ms_per_request": 1000 * summary["load_generator_cores"] * wall / answered}


def gpu_rows(args: argparse.Namespace, texts: list[str], workdir: Path, keep: Callable[[dict], None]) -> dict:
    """Part 4: the checkpoint --run on CUDA at each N against its in-process ceiling, and a lone request's p50.
    ``keep`` gets the results so far after each row (a GPU call's time limit can end the run before the last)."""
    from benchmarks.gpu_check import cuda_ceiling, load_run
    from benchmarks.lone_request import lone_requests

    _, tokenizer, config, _ = load_run(args.run)
    sentences = quantiles_by_length(tokenizer, texts, config.limits.max_seq_length, args.groups)
    found = cuda_ceiling(args.run, sentences * (1100 // len(sentences)), device=args.gpu_device)
    ceiling = found["best"]
    print(f"torch on {args.gpu_device}: in-process ceiling {ceiling:.1f}/s (median pass {found['median']:.1f}/s, "
          f"{len(found['passes'])} passes); the server's engine path {found['engine']['best']:.1f}/s (median "
          f"{found['engine']['median']:.1f}/s); the model alone {found['model']['best']:.1f}/s (median "
          f"{found['model']['median']:.1f}/s)", flush=True)
    if "engine_heads_eager" in found:
        print(f"  the engine path with the head after the encoder's graph, not in it: "
              f"{found['engine_heads_eager']['best']:.1f}/s (median {found['engine_heads_eager']['median']:.1f}/s)",
              flush=True)
    out: dict = {"ceiling_per_s": ceiling, "ceiling": found, "concurrency": args.gpu_concurrency, "rows": [],
                 "lone": {}, "device": args.gpu_device}
    engine = ["--backend", "torch", "--device", args.gpu_device]
    load = argparse.Namespace(**{**vars(args), "concurrency": args.gpu_concurrency})
    for n in args.frontends:
        row = served(args.run, [*engine, "--frontends", str(n)], sentences, load, workdir)
        out["rows"].append({"frontends": n, **row})
        keep(out)
        print(line(f"torch {args.gpu_device}, frontends {n}", row, ceiling), flush=True)
    # Engine replicas at the largest N, one sentence a request; then requests of --gpu-per-request sentences (Embed
    # and Sentiment) at each replica count, at --concurrency connections; rates in sentences/s against the ceiling.
    n, out["replica_rows"] = max(args.frontends), []
    for engines in args.gpu_engines:
        tries = [("sentiment", 1)] if engines > 1 else []
        tries += [(task, per) for per in args.gpu_per_request for task in ("embed", "sentiment")]
        for task, per in tries:
            flags = [*engine, "--frontends", str(n), "--engines", str(engines)]
            row = served(args.run, flags, sentences, load if per == 1 else args, workdir, task, per)
            out["replica_rows"].append({"frontends": n, "engines": engines, "task": task, **row})
            keep(out)
            print(line(f"torch {args.gpu_device}, {n} front ends, {engines} engines, {task} x{per}", row, ceiling),
                  flush=True)
    # With --gpu-http: Embed over gRPC and over HTTP's /v1/embeddings, one sentence and --gpu-per-request a request.
    out["http_rows"] = []
    for per, http in [(per, http) for per in ([1, *args.gpu_per_request] if args.gpu_http else [])
                      for http in (False, True)]:
        row = served(args.run, [*engine, "--frontends", str(n)], sentences, load if per == 1 else args, workdir,
                     "embed", per, http)
        out["http_rows"].append({"frontends": n, "protocol": "http" if http else "grpc", **row})
        keep(out)
        print(line(f"torch {args.gpu_device}, {n} front ends, Embed x{per} over {'HTTP' if http else 'gRPC'}", row, ceiling),
              flush=True)
    s128 = " ".join(texts[:40])[:2000]  # cut to the model's 128 tokens by the server, as in gpu_check.served
    for name, flags in () if args.skip_lone else (("frontends 1", ["--frontends", "1"]), ("auto", [])):
        for label, lone_texts in (("one sentence", texts[:400]), ("s128", [s128] * 400)):
            found = lone_requests(args.run, [*engine, *flags], lone_texts)
            out["lone"][f"{name}, {label}"] = found
            keep(out)
            print(f"lone request, {name}, {label}: client p50 {found['client']:.3f} ms, inference "
                  f"{found['inference']:.3f} ms, client - inference {found['client_minus_inference']:.3f} ms",
                  flush=True)
    return out


# The engine service's goals on an H200 (one run; ratios against the ceiling measured in the same run).
GPU_GOALS = {"ceiling_per_s": 100_000, "one_sentence_per_s": 20_000, "one_sentence_of_ceiling": 0.85,
             "per_request_32_sentences_per_s": 60_000, "lone_s128_client_ms": 1.5}


def gpu_goal_lines(gpu: dict) -> list[str]:
    """Each goal of GPU_GOALS against part 4's results: the best row measured, met or missed."""
    ceiling = gpu["ceiling_per_s"]
    one = [r for r in gpu["rows"] + gpu.get("replica_rows", []) if r.get("task", "sentiment") == "sentiment"
           and r.get("sentences_per_request", 1) == 1]
    many = [r for r in gpu.get("replica_rows", []) if r.get("sentences_per_request", 1) > 1]
    best_one = max((r["items_per_s"] for r in one), default=0.0)
    lone = [v["client"] for k, v in gpu.get("lone", {}).items() if k.endswith("s128")]
    checks = [("in-process ceiling", ceiling, GPU_GOALS["ceiling_per_s"], "/s", True),
              ("one-sentence requests", best_one, GPU_GOALS["one_sentence_per_s"], "/s", True),
              ("one-sentence requests against the ceiling", best_one / ceiling if ceiling else 0.0,
               GPU_GOALS["one_sentence_of_ceiling"], "", True)]
    for task in ("embed", "sentiment"):
        rate = max((r["items_per_s"] for r in many if r["task"] == task), default=0.0)
        checks.append((f"{task}, 32 sentences a request", rate, GPU_GOALS["per_request_32_sentences_per_s"],
                       " sentences/s", True))
    if lone:
        checks.append(("lone 128-token request, client p50", min(lone), GPU_GOALS["lone_s128_client_ms"], " ms",
                       False))
    return [f"goal: {name} {value:,.2f}{unit} against {goal:,}{unit}: "
            f"{'met' if (value >= goal if higher else value <= goal) else 'MISSED'}"
            for name, value, goal, unit, higher in checks]


def line(name: str, row: dict, ceiling: float | None = None) -> str:
    per = row["cpu_ms_per_request"]
    share = f" = {row['items_per_s'] / ceiling:.2f} of the ceiling" if ceiling else ""
    return (f"{name:34} {row['items_per_s']:7.1f}/s{share}; server {row['server_cores']:.2f} cores; CPU ms/request: "
            f"front ends {per['frontends']:.3f}, engine {per['engine']:.3f}, parent {per['parent']:.3f}, "
            f"load generator {row['load_generator_ms_per_request']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe", required=True, type=Path, help="the front-end probe's folder (built if absent)")
    parser.add_argument("--artifact", default=None, help="a real model's export (with --int8) for part 2")
    parser.add_argument("--variants", nargs="+", default=["fp32", "int8"], choices=["fp32", "optimized", "int8"])
    parser.add_argument("--data", default=None, help="SST sentences (default: the bundled sample)")
    parser.add_argument("--frontends", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="the in-process ceiling's threads (the machine's cores)")
    parser.add_argument("--skip-variants", action="store_true", help="leave out part 2")
    parser.add_argument("--defaults", action="store_true", help="part 3: the defaults, old and new")
    parser.add_argument("--infinity", default=None, metavar="VENV", help="part 3 against infinity-emb from this venv "
                        "(benchmarks/peers/infinity_setup.sh)")
    parser.add_argument("--infinity-models", default=None, metavar="MODELS")
    parser.add_argument("--run", default=None, help="part 4, on a GPU: a `bertzoo train` checkpoint")
    parser.add_argument("--gpu-concurrency", type=int, default=128, help="part 4's h2load connections")
    parser.add_argument("--skip-lone", action="store_true", help="part 4 without its lone requests")
    parser.add_argument("--gpu-engines", nargs="+", type=int, default=[], help="part 4: --engines counts to serve "
                        "at the largest --frontends (1 is the rows above)")
    parser.add_argument("--gpu-http", action="store_true", help="part 4: Embed over gRPC and over HTTP's "
                        "/v1/embeddings at the largest --frontends, one sentence and --gpu-per-request a request")
    parser.add_argument("--gpu-per-request", nargs="+", type=int, default=[],
                        help="part 4: requests of this many sentences at each --gpu-engines count")
    parser.add_argument("--gpu-device", default="cuda", choices=["cuda", "cpu"],
                        help="part 4's device; cpu: a dry run of the GPU steps on a machine without one")
    parser.add_argument("--skip-probe", action="store_true", help="leave out part 1 (the probe)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if shutil.which("h2load") is None:
        sys.exit("h2load not found: apt-get install nghttp2-client")
    texts = load_items("sentiment", args.data)
    results: dict = {"machine": machine(), "probe": [], "variants": [], "defaults": {}}
    print(json.dumps(results["machine"]), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.run:
            def keep(gpu: dict) -> None:  # kept even if a later row or part fails
                if args.json:
                    atomic_write_text(Path(args.json), json.dumps({**results, "gpu": gpu}, indent=1))

            results["gpu"] = gpu_rows(args, texts, Path(tmp), keep)
            results["gpu"]["goals"] = gpu_goal_lines(results["gpu"])
            print("\n".join(results["gpu"]["goals"]), flush=True)
            keep(results["gpu"])
        probe = None if args.skip_probe else str(build_probe(args.probe))
        if probe:
            sentences = quantile_sentences(probe, texts, args.groups)
        for round_ in range(args.rounds if probe else 0):
            for n in args.frontends:
                row = served(probe, ["--frontends", str(n), "--threads", "1"], sentences, args, Path(tmp))
                results["probe"].append({"round": round_, "frontends": n, **row})
                print(line(f"probe, frontends {n} (round {round_ + 1})", row), flush=True)
        if args.artifact and not args.skip_variants:
            sentences = quantile_sentences(args.artifact, texts, args.groups)
            repeated = sentences * (1100 // len(sentences))
            for variant in args.variants:
                ceiling = in_process_ceiling(args.artifact, variant, repeated, args.threads, ("sentiment",))
                rate = ceiling["sentiment"]["ceiling"]
                print(f"{variant}: in-process ceiling {rate:.1f}/s ({ceiling['sentiment']['best']})", flush=True)
                for instances in (1, 2):
                    for n in args.frontends:
                        flags = [*VARIANTS[variant][2], "--frontends", str(n), "--instances", str(instances)]
                        row = served(args.artifact, flags, sentences, args, Path(tmp))
                        results["variants"].append({"variant": variant, "instances": instances, "frontends": n,
                                                    "ceiling_per_s": rate, **row})
                        print(line(f"{variant}, instances {instances}, frontends {n}", row, rate), flush=True)
        if args.artifact and args.defaults:
            sentences = quantile_sentences(args.artifact, texts, args.groups)
            for name, flags in DEFAULTS.items():
                row = served(args.artifact, flags, sentences, args, Path(tmp), task="embed")
                results["defaults"][name] = row
                print(line(f"Embed, {name}", row), flush=True)
            if args.infinity:
                results["defaults"]["infinity"] = infinity_h2load_rows(args, sentences, Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
