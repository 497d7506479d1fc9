"""What the zoo's training-time additions cost per step, with their spread: SSAF, AG and SSA against the baseline, on
one task (SST-5 sentiment), the real backbone and data, in rounds that alternate the presets' order.

    python benchmarks/zoo_step_cost.py --data ../shared/data --out /tmp/zoo_cost [--steps 60] [--rounds 2]

Each (round, preset) is one `bertzoo train --preset NAME --tasks sentiment` child process; its training log gives the
median step time (data to optimizer step) of every window of 10 steps. A preset's cost is reported as the median of
its windows over all rounds divided by the baseline's, with the range of the per-window ratios (each window against
the baseline's median of the same round). SSA's probing rounds (--ssa-probe-limit sentences each) land in one step
per round, which moves no window's median: the figure is the cost of its extra attention layer and loss.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from timing import machine

PRESETS = ("baseline", "ssaf", "ag", "ssa")


def run(preset: str, out: Path, args) -> list[float]:
    """The per-window median step times (ms) of one training run."""
    command = [str(Path(sys.executable).with_name("bertzoo")), "train", "--preset", preset, "--tasks", "sentiment",
               "--data", args.data, "--out", str(out), "--max-steps", str(args.steps), "--log-every", "10",
               "--batch-size", str(args.batch_size), "--no-eval", "--no-progress", "--seed", "0"]
    if preset == "ssa":
        command += ["--set", f"ssa_probe_limit={args.ssa_probe_limit}"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [r["step_ms"]["sentiment"] for r in records if "step_ms" in r and "sentiment" in r["step_ms"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--ssa-probe-limit", type=int, default=100)
    args = parser.parse_args()
    windows: dict[str, list[list[float]]] = {p: [] for p in PRESETS}
    for r in range(args.rounds):
        for preset in PRESETS if r % 2 == 0 else reversed(PRESETS):  # alternating order: drift falls on all alike
            windows[preset].append(run(preset, Path(args.out) / f"{preset}-{r}", args))
            print(f"round {r} {preset}: window medians {windows[preset][-1]} ms", flush=True)
    base = statistics.median(w for rnd in windows["baseline"] for w in rnd)
    results = {**machine(), "steps": args.steps, "rounds": args.rounds, "batch_size": args.batch_size, "presets": {}}
    print("\n| preset | median step ms | / baseline | range of window ratios |\n|---|---|---|---|")
    for preset, rounds in windows.items():
        ratios = [w / statistics.median(windows["baseline"][r]) for r, rnd in enumerate(rounds) for w in rnd]
        median = statistics.median(w for rnd in rounds for w in rnd)
        results["presets"][preset] = {"median_ms": median, "ratio": median / base, "ratio_min": min(ratios),
                                      "ratio_max": max(ratios), "windows_ms": rounds}
        print(f"| {preset} | {median:.0f} | {median / base:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |")
    Path(args.out, "zoo_step_cost.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
