"""Two ways of starting `bertzoo serve`, side by side: alternating rounds of the same closed-loop load, so the machine's
drift falls on both equally. For server-side levers worth a few percent, which one run of each cannot show.

    python -m benchmarks.serve_ab ARTIFACT --data ../shared/data/ids-sst-dev.csv \
        --arm this="python -m bertzoo" --arm before="/tmp/venv-before/bin/bertzoo" \
        --rounds 4 --seconds 15 -- --variant int8 --instances 2

(``/tmp/venv-before``: another commit's build installed in its own virtual environment.)

``--rate R`` replaces the closed loop by an open one: Sentiment requests sent at R per second whatever the answers,
for the latency at a given load (p50, p99 and their ratio) rather than the rate at saturation.

``--in-process`` compares the engine alone, in this process, instead of servers (benchmarks/common/engine_ab.py): two
exports of one checkpoint, or with ``--denormals`` the engine threads flushing denormal floats or not:

    python -m benchmarks.serve_ab BEFORE_ARTIFACT AFTER_ARTIFACT --in-process --data ../shared/data/ids-sst-dev.csv
    python -m benchmarks.serve_ab ARTIFACT [ARTIFACT ...] --in-process --denormals --data ../shared/data/ids-sst-dev.csv

Each arm is a command that stands for ``bertzoo``, to which ``serve ARTIFACT --host ... --port ... --metrics-port ...``
and the flags after ``--`` are appended (an environment variable goes in front with ``env NAME=VALUE``). Round r runs
the arms in order, round r + 1 in reverse. Prints every round and, per arm, the mean and its ratio to the first
arm's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from benchmarks.common import engine_ab
from benchmarks.common.processes import free_port, start_bertzoo, stop
from benchmarks.common.server_loads import closed_loop, measured_load, open_loop
from benchmarks.common.timing import machine
from bertzoo.atomic import atomic_write_text
from bertzoo.serving.load import load_items


def one_round(launcher: list[str], artifact: str, flags: list[str], task: str, items: list, concurrency: int,
              seconds: float, rate: float | None) -> dict:
    port = free_port()
    process = start_bertzoo(artifact, port, *flags, launcher=launcher)
    try:
        if rate is not None:
            return measured_load(process.pid, lambda: open_loop(port, items, rate, seconds))
        return measured_load(process.pid, lambda: closed_loop(port, task, items, concurrency, seconds))
    finally:
        stop(process)


def _joined(values: list[float], digits: int) -> str:
    return " ".join(f"{v:.{digits}f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="+", metavar="ARTIFACT")
    parser.add_argument("--data", required=True)
    parser.add_argument("--arm", action="append", default=[], metavar="NAME=COMMAND",
                        help="an arm's name and command prefix (twice or more)")
    parser.add_argument("--task", default="sentiment", choices=["sentiment", "embed"])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=float, default=None,
                        help="requests/s of an open loop (Sentiment) instead of --concurrency closed-loop clients")
    parser.add_argument("--out", default=None, help="write every round as JSON")
    parser.add_argument("--in-process", action="store_true", help="the engine alone: two exports' encoders, or "
                        "with --denormals one export's with the engine threads flushing denormals or not")
    parser.add_argument("--denormals", action="store_true")
    parser.add_argument("--variants", nargs="+", default=list(engine_ab.VARIANTS), help="with --in-process")
    parser.add_argument("--batch", type=int, default=32, help="with --in-process: rows a batch")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.serve_flags = argv[split + 1:]  # after --: flags for every arm's `serve`
    if args.in_process:
        return in_process(parser, args)
    if len(args.artifacts) != 1:
        parser.error("servers are compared on one ARTIFACT (two or more: --in-process)")
    args.artifact = args.artifacts[0]
    arms = {}
    for arm in args.arm:
        name, sep, command = arm.partition("=")
        if not sep or not command.strip():
            parser.error(f"--arm {arm!r}: expected NAME=COMMAND")
        arms[name] = shlex.split(command)
    if len(arms) < 2:
        parser.error("give at least two --arm")
    if args.rate is not None and args.task != "sentiment":
        parser.error("--rate sends Sentiment requests: leave --task at sentiment")
    items = load_items(args.task, args.data)
    print(json.dumps(machine()), flush=True)
    rounds: dict[str, list[dict]] = {name: [] for name in arms}
    for r in range(args.rounds):
        for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:
            summary = one_round(arms[name], args.artifact, args.serve_flags, args.task, items, args.concurrency,
                                args.seconds, args.rate)
            rounds[name].append(summary)
            print(f"round {r} {name}: {summary['items_per_s']:.1f} {args.task} items/s, p50 {summary['p50_ms']:.1f} "
                  f"ms, p99 {summary['p99_ms']:.1f} ms, server {summary['server_cores']:.2f} cores, load generator "
                  f"{summary['load_generator_cores']:.2f}", flush=True)
    if args.rate is not None:  # the latencies are the result: the rate is the one sent
        for name, results in rounds.items():
            p50s, p99s = [s["p50_ms"] for s in results], [s["p99_ms"] for s in results]
            ratios = [b / a for a, b in zip(p50s, p99s, strict=True)]
            print(f"{name}: p50 {_joined(p50s, 1)} ms; p99 {_joined(p99s, 1)} ms; p99/p50 {_joined(ratios, 2)} "
                  f"(mean {sum(ratios) / len(ratios):.2f})")
    first = None
    for name, results in rounds.items():
        rates = [s["items_per_s"] for s in results]
        mean = sum(rates) / len(rates)
        first = first or mean
        print(f"{name}: mean {mean:.1f}/s ({mean / first:.3f}x {next(iter(arms))}), rounds "
              f"{', '.join(f'{x:.1f}' for x in rates)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine(), "arms": {n: shlex.join(c) for n, c in arms.items()},
                       "serve_flags": args.serve_flags, "rounds": rounds}, f, indent=2)


def in_process(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.arm or args.serve_flags:
        parser.error("--in-process compares artifacts or --denormals, not --arm commands or serve flags")
    if args.denormals:
        arms = [[(f"{Path(a).name} flush off", a, False), (f"{Path(a).name} flush on", a, True)] for a in args.artifacts]
    elif len(args.artifacts) == 2:
        arms = [[("before", args.artifacts[0], True), ("after", args.artifacts[1], True)]]
    else:
        parser.error("--in-process compares two artifacts (BEFORE AFTER), or with --denormals any number")
    sentences = load_items("sentiment", args.data)
    threads = os.cpu_count() or 1
    print(json.dumps(machine()), flush=True)
    results = {"machine": machine(), "threads": threads, "batch": args.batch, "sentences": len(sentences),
               "softmax_us": engine_ab.softmax_costs() if args.denormals else None, "rates": []}
    for pair in arms:
        results["rates"] += engine_ab.compare(pair, args.variants, sentences, args.rounds, threads, args.batch)
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
