"""Train the baseline multitask model on the full data, then evaluate it on dev; print metrics, steps/s, peak memory.

    python -m benchmarks.train_baseline --data ../shared/data --out runs/baseline -- --max-steps 1000 \
        --qa-max-length 256 --qa-doc-stride 96

Everything after ``--`` goes to ``bertzoo train`` unchanged. Training and evaluation run as child processes, so the
peak resident memory reported is theirs (the larger of the two).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common.timing import machine


def run(cmd: list[str]) -> float:
    print("+", " ".join(cmd), flush=True)
    started = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    args, train_args = parser.parse_known_args()
    train_args = [a for a in train_args if a != "--"]
    bertzoo = shutil.which("bertzoo") or str(Path(sys.executable).with_name("bertzoo"))
    train_s = run([bertzoo, "train", "--data", args.data, "--out", args.out, "--no-eval", "--no-progress", *train_args])
    metrics_path = Path(args.out) / "dev_metrics.json"
    eval_s = run([bertzoo, "eval", args.out, "--data", args.data, "--json-out", str(metrics_path)])
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    records = [json.loads(line) for line in (Path(args.out) / "train_log.jsonl").read_text().splitlines()]
    steps = max(r["step"] for r in records)
    train_loop_s = max(r.get("elapsed_s", 0.0) for r in records)
    metrics = json.loads(metrics_path.read_text())
    print(json.dumps({
        "machine": machine(), "options": train_args, "steps": steps, "train_wall_s": round(train_s, 1),
        "train_loop_s": train_loop_s,
        "steps_per_s": round(steps / train_loop_s, 3), "eval_wall_s": round(eval_s, 1),
        "peak_rss_mib": round(peak_mib), "dev": metrics,
    }, indent=2))


if __name__ == "__main__":
    main()
