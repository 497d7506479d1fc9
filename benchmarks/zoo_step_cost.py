"""What the zoo's training-time additions cost per step, with their spread: SSAF, AG and SSA against the baseline, on
one task (SST-5 sentiment), the real backbone and data, in rounds that alternate the arms' order.

    python -m benchmarks.zoo_step_cost --data ../shared/data --out /tmp/zoo_cost [--steps 60] [--rounds 2]
    python -m benchmarks.zoo_step_cost --data ../shared/data --out /tmp/bf16_cost --arms baseline,bf16 --task qa

Each (round, arm) is one `bertzoo train` child process with the arm's options on one task (``--task``, sentiment by
default); its training log gives the median step time (data to optimizer step) of every window of 10 steps. An
arm's cost is reported as the median of its windows over all rounds divided by the baseline's, with the range of the
per-window ratios (each window against the baseline's median of the same round). SSA's probing rounds
(--ssa-probe-limit sentences each) land in one step per round, which moves no window's median: the figure is the
cost of its extra attention layer and loss. The ``bf16`` arm is the baseline with bf16 autocast (``--precision
bf16``), for what it saves on a CPU with native bf16. The ``padded`` arm is the baseline with the encoder on the
padded batch (``--set pack_tokens=false``), for what packing the tokens saves.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common.timing import machine

ARMS = {"baseline": ("--preset", "baseline"), "ssaf": ("--preset", "ssaf"), "ag": ("--preset", "ag"),
        "ssa": ("--preset", "ssa"), "bf16": ("--preset", "baseline", "--precision", "bf16"),
        "padded": ("--preset", "baseline", "--set", "pack_tokens=false")}


def run(arm: str, out: Path, args) -> list[float]:
    """The per-window median step times (ms) of one training run."""
    bertzoo = shutil.which("bertzoo") or str(Path(sys.executable).with_name("bertzoo"))
    command = [bertzoo, "train", *ARMS[arm], "--tasks", args.task,
               "--data", args.data, "--out", str(out), "--max-steps", str(args.steps), "--log-every", "10",
               "--batch-size", str(args.batch_size), "--no-eval", "--no-progress", "--seed", "0"]
    if arm == "ssa":
        command += ["--set", f"ssa_probe_limit={args.ssa_probe_limit}"]
    command += shlex.split(args.train_args)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [r["step_ms"][args.task] for r in records if "step_ms" in r and args.task in r["step_ms"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--ssa-probe-limit", type=int, default=100)
    parser.add_argument("--arms", default="baseline,ssaf,ag,ssa", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--task", default="sentiment", choices=["sentiment", "paraphrase", "similarity", "qa"])
    parser.add_argument("--train-args", default="", help="more `bertzoo train` options for every arm, e.g. "
                        "\"--batch-tokens 1024\"")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if "baseline" not in arms or not set(arms) <= set(ARMS):
        parser.error(f"--arms: baseline and any of {', '.join(ARMS)}")
    windows: dict[str, list[list[float]]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm in arms if r % 2 == 0 else reversed(arms):  # alternating order: drift falls on all alike
            windows[arm].append(run(arm, Path(args.out) / f"{arm}-{r}", args))
            print(f"round {r} {arm}: window medians {windows[arm][-1]} ms", flush=True)
    base = statistics.median(w for rnd in windows["baseline"] for w in rnd)
    results = {**machine(), "task": args.task, "steps": args.steps, "rounds": args.rounds,
               "batch_size": args.batch_size, "presets": {}}
    print("\n| arm | median step ms | / baseline | range of window ratios |\n|---|---|---|---|")
    for arm, rounds in windows.items():
        ratios = [w / statistics.median(windows["baseline"][r]) for r, rnd in enumerate(rounds) for w in rnd]
        median = statistics.median(w for rnd in rounds for w in rnd)
        results["presets"][arm] = {"median_ms": median, "ratio": median / base, "ratio_min": min(ratios),
                                   "ratio_max": max(ratios), "windows_ms": rounds}
        print(f"| {arm} | {median:.0f} | {median / base:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |")
    Path(args.out, "zoo_step_cost.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
