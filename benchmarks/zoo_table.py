"""Every zoo preset trained with the same budget, seed, data and backbone; one table of dev metrics, training step-time
ratios to the baseline, and SSAF's attention sparsity.

    python benchmarks/zoo_table.py --data ../shared/data --out /tmp/zoo --steps 300

Each preset trains in its own child process (``bertzoo train --preset NAME``), one after the other on this machine,
with identical options (below). Step times are the median per task of the training log's per-window medians (data to
optimizer step; SSA's probing lands in one step per round and so does not move a median); a preset's ratio is the mean
over tasks of its median divided by the baseline's. Sampling is round-robin for every preset except the one whose
point is its sampling (dynamic task prioritization), so each task gets the same number of steps.

Extra SSAF runs with other lambdas (--ssaf-lambdas) show how the sparsity follows lambda.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bertzoo.zoo import load_preset

PRESETS = ("baseline", "ssaf", "ag", "ssa", "task_attention", "cross_pool_dtp")
PRIMARY = {"sentiment": "accuracy", "paraphrase": "accuracy", "similarity": "pearson", "qa": "f1"}


def train(bertzoo: str, preset: str, out: Path, args, extra: list[str]) -> float:
    cmd = [bertzoo, "train", "--preset", preset, "--data", args.data, "--out", str(out), "--max-steps",
           str(args.steps), "--seed", str(args.seed), "--batch-size", str(args.batch_size), "--qa-max-length",
           str(args.qa_max_length), "--qa-doc-stride", str(args.qa_doc_stride), "--eval-limit-per-task",
           str(args.eval_limit), "--no-progress", "--log-every", "10", *extra]
    if "sampling" not in load_preset(preset).train:
        cmd += ["--sampling", "round_robin"]
    print("+", " ".join(cmd), flush=True)
    started = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    return time.perf_counter() - started


def summarise(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    dev = [r for r in records if "dev" in r][-1]
    step_ms: dict[str, list[float]] = {}
    for r in records:
        for task, ms in r.get("step_ms", {}).items():
            step_ms.setdefault(task, []).append(ms)
    return {
        "dev": {t: dev["dev"][t][m] for t, m in PRIMARY.items() if t in dev["dev"]},
        "qa_detail": {k: dev["dev"]["qa"][k] for k in ("HasAns_f1", "NoAns_f1", "NoAns_total", "total")
                      if k in dev["dev"].get("qa", {})},
        "step_ms": {t: float(np.median(v)) for t, v in step_ms.items()},
        "zero_fraction": dev.get("attention_zero_fraction"),
        "loop_s": max(r.get("elapsed_s", 0.0) for r in records),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--qa-max-length", type=int, default=192)
    parser.add_argument("--qa-doc-stride", type=int, default=64)
    parser.add_argument("--eval-limit", type=int, default=1000, help="dev examples per task")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--ssaf-lambdas", default="-7", help="extra SSAF runs (the preset itself uses -3)")
    parser.add_argument("--reuse", action="store_true",
                        help="summarise every run already in --out (the named ones first) instead of training")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bertzoo = shutil.which("bertzoo") or str(Path(sys.executable).with_name("bertzoo"))
    runs = {name: (name, []) for name in args.presets.split(",")}
    for lam in filter(None, args.ssaf_lambdas.split(",")):
        runs[f"ssaf_lambda{lam}"] = ("ssaf", ["--encoder", f"sparsegen_lambda={float(lam)}"])
    if args.reuse:  # every finished run in --out, the named ones first
        done = [d.name for d in sorted(out.iterdir()) if (d / "train_log.jsonl").is_file()]
        labels = [*[r for r in runs if r in done], *[d for d in done if d not in runs]]
        results = {label: summarise(out / label) for label in labels}
    else:
        results = {}
        for label, (preset, extra) in runs.items():
            wall = train(bertzoo, preset, out / label, args, extra)
            print(f"{label}: {wall:.0f} s", flush=True)
            results[label] = summarise(out / label)
    (out / "zoo_table.json").write_text(json.dumps(results, indent=2))
    print_table(results)
    qa = next((r["qa_detail"] for r in results.values() if "NoAns_total" in r["qa_detail"]), None)
    if qa:
        print(f"always-no-answer F1 on the same SQuAD dev questions: {100 * qa['NoAns_total'] / qa['total']:.1f}")


def print_table(results: dict) -> None:
    base = results.get("baseline")
    print("| run | SST-5 acc | Quora acc | STS Pearson | SQuAD2 F1 (HasAns / NoAns) | step time vs baseline "
          "| exact-zero attention per layer |")
    print("|---|---|---|---|---|---|---|")
    for label, r in results.items():
        d = r["dev"]
        qa = f"{d.get('qa', float('nan')):.1f}"
        detail = r["qa_detail"]
        if "HasAns_f1" in detail and "NoAns_f1" in detail:
            qa += f" ({detail['HasAns_f1']:.1f} / {detail['NoAns_f1']:.1f})"
        ratio = "1.00" if label == "baseline" else "-" if base is None else "{:.2f}".format(np.mean(
            [r["step_ms"][t] / base["step_ms"][t] for t in r["step_ms"] if t in base["step_ms"]]))
        per_task = ", ".join(f"{t} {ms:.0f}" for t, ms in r["step_ms"].items())
        zeros = " ".join(f"{z:.0%}" for z in r["zero_fraction"]) if r["zero_fraction"] else "-"
        print(f"| {label} | {d.get('sentiment', float('nan')):.3f} | {d.get('paraphrase', float('nan')):.3f} "
              f"| {d.get('similarity', float('nan')):.3f} | {qa} | {ratio} (ms: {per_task}) | {zeros} |")


if __name__ == "__main__":
    main()
