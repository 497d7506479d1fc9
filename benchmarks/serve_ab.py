"""Two ways of starting `bertzoo serve`, side by side: alternating rounds of the same closed-loop load, so the machine's
drift falls on both equally. For server-side levers worth a few percent, which one run of each cannot show.

    python -m benchmarks.serve_ab ARTIFACT --data ../shared/data/ids-sst-dev.csv \
        --arm this="python -m bertzoo" --arm before="/tmp/venv-before/bin/bertzoo" \
        --rounds 4 --seconds 15 -- --variant int8 --instances 2

(``/tmp/venv-before``: another commit's build installed in its own virtual environment.)

``--rate R`` replaces the closed loop by an open one: Sentiment requests sent at R per second whatever the answers,
for the latency at a given load (p50, p99 and their ratio) rather than the rate at saturation.

Each arm is a command that stands for ``bertzoo``, to which ``serve ARTIFACT --host ... --port ... --metrics-port ...``
and the flags after ``--`` are appended (an environment variable goes in front with ``env NAME=VALUE``). Round r runs
the arms in order, round r + 1 in reverse. Prints every round and, per arm, the mean and its ratio to the first
arm's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from benchmarks.common.processes import free_port, start_bertzoo, stop
from benchmarks.common.server_loads import closed_loop, measured_load, open_loop
from benchmarks.common.timing import machine
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
    parser.add_argument("artifact")
    parser.add_argument("--data", required=True)
    parser.add_argument("--arm", action="append", required=True, metavar="NAME=COMMAND",
                        help="an arm's name and command prefix (twice or more)")
    parser.add_argument("--task", default="sentiment", choices=["sentiment", "embed"])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=float, default=None,
                        help="requests/s of an open loop (Sentiment) instead of --concurrency closed-loop clients")
    parser.add_argument("--out", default=None, help="write every round as JSON")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.serve_flags = argv[split + 1:]  # after --: flags for every arm's `serve`
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


if __name__ == "__main__":
    sys.exit(main())
