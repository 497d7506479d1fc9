"""Does attention guidance speed up MLM convergence (paper 003)? Two from-scratch pre-training runs with the same seed,
budget, data and hyper-parameters, one plain MLM and one MLM + AG in the paper's setting, on the sentences of a data
directory's sentiment/paraphrase/similarity train files.

    python benchmarks/ag_convergence.py --out runs/ag_convergence --steps 500

Model: a small random BERT (4 layers, hidden 256, 8 heads of 32, intermediate 1024, max length 64; about 0.6 s a step
at batch 32 on one CPU thread, so about 5 minutes a run at 500 steps). One intra-op thread by default: on a 2-core
machine shared with other jobs, two OpenMP threads ran 5-8x slower per step than one (oversubscription), and one
thread on a free machine is about as fast as two. Eight heads rather than four so that the paper's
setting guides all three of its patterns: lambda = 1/2 of the heads, one [Next], one [Prev], lambda * h - 2 = 2 [First].
alpha_0: the paper picks it from {1, 10, 100} "such that the scales of the MLM loss and auxiliary loss are comparable
at the beginning of training". With our normalisation (trainer/guidance.py) the raw AG loss at initialisation is about
1 for this model and these ~18-token sentences, against an MLM loss of ln(30522) = 10.3, so alpha_0 = 10 (100 would
make AG ~10x the MLM loss; the paper's 100 for small models goes with its 512-token blocks, whose per-entry MSE is
~25x smaller). lr 5e-4 with 5% warmup for both runs (the paper's AG runs use no warmup; the plain MLM run is the one that
needs it, so both get it). Prints the held-out MLM loss at every evaluation, the mean and final training loss (the
paper's table 3 reports both) and the step-time ratio AG / no AG; plots both runs' training and held-out MLM loss.
Step times are medians and the machine may be shared: compare them only within one invocation.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch

from bertzoo.trainer.plots import line_plot
from bertzoo.trainer.pretrain import PretrainConfig, PretrainResult, pretrain

MODEL = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 1024,
         "max_position_embeddings": 64}
ROOT = Path(__file__).resolve().parent


def run(name: str, args: argparse.Namespace, ag_weight: float) -> PretrainResult:
    config = PretrainConfig(
        data_dir=args.data, out_dir=str(Path(args.out) / name), random_init=True, encoder_overrides=dict(MODEL),
        max_steps=args.steps, batch_size=args.batch_size, max_seq_length=MODEL["max_position_embeddings"], lr=args.lr,
        warmup_ratio=args.warmup_ratio, seed=args.seed, heldout_size=512, eval_every=max(1, args.steps // 5),
        log_every=max(1, args.steps // 50), ag_weight=ag_weight, ag_fraction=0.5, ag_patterns=("next", "prev", "first"),
        progress=False)
    print(f"--- {name}: alpha_0 = {ag_weight:g}, {args.steps} steps", flush=True)
    return pretrain(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="Directory for the two runs (OUT/mlm, OUT/ag) and summary.json.")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--data", default=str(ROOT.parent.parent / "shared" / "data"))
    parser.add_argument("--png", default=str(ROOT / "results" / "ag_convergence.png"))
    parser.add_argument("--ag-weight", type=float, default=10.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--warmup-ratio", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (see the module docstring).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(f"model {MODEL}, batch {args.batch_size}, lr {args.lr:g}, warmup {args.warmup_ratio:g}, seed {args.seed}, "
          f"threads {args.threads}, "
          f"data {args.data}; load average at start {os.getloadavg()[0]:.2f}", flush=True)

    plain = run("mlm", args, 0.0)
    guided = run("ag", args, args.ag_weight)

    line_plot(args.png, {
        "MLM: train": plain.train_curve, "MLM: held-out": plain.heldout_curve,
        f"MLM + AG (alpha_0={args.ag_weight:g}): train": guided.train_curve,
        f"MLM + AG (alpha_0={args.ag_weight:g}): held-out": guided.heldout_curve,
    }, f"MLM loss from scratch, 4x256 BERT, {args.steps} steps, same seed and data", "step", "MLM loss")

    print("\nheld-out MLM loss (512 sentences, fixed masks)")
    print(f"{'step':>6} {'MLM':>8} {'MLM+AG':>8}")
    for step, a, b in zip(plain.heldout_curve[0], plain.heldout_curve[1], guided.heldout_curve[1], strict=True):
        print(f"{step:>6} {a:>8.3f} {b:>8.3f}")
    summary = {"steps": args.steps, "ag_weight": args.ag_weight, "model": MODEL,
               "heldout": {"steps": plain.heldout_curve[0], "mlm": plain.heldout_curve[1],
                           "ag": guided.heldout_curve[1]}}
    for name, result in (("mlm", plain), ("ag", guided)):
        summary[name] = {"train_mean": float(np.mean(result.train_curve[1])), "train_final": result.train_curve[1][-1],
                         "heldout_final": result.heldout_mlm_loss, "median_step_ms": result.median_step_ms}
    print(f"\n{'':>22} {'MLM':>8} {'MLM+AG':>8}")
    for key, label in (("train_mean", "mean train loss"), ("train_final", "final train loss"),
                       ("heldout_final", "final held-out loss"), ("median_step_ms", "median step ms")):
        print(f"{label:>22} {summary['mlm'][key]:>8.3f} {summary['ag'][key]:>8.3f}")
    ratio = guided.median_step_ms / plain.median_step_ms
    summary["step_time_ratio_ag_over_mlm"] = ratio
    print(f"step time ratio AG / no AG: {ratio:.3f} (load average at end {os.getloadavg()[0]:.2f})")
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
