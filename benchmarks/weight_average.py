"""Does evaluating a moving average of the weights beat the last step's weights? Paired, seed by seed.

    python benchmarks/weight_average.py --data ../shared/data --out /tmp/wavg --share 0.1 --seeds 0,1,2 \
        -- --tasks sentiment --epochs 2

Each seed is one ``bertzoo train`` run with ``--set weight_average=SHARE`` (and the options after ``--``). Averaging
does not change training (the raw weights follow the same steps, and no random number is drawn for it), so the run's
checkpoint holds both arms of a paired comparison: the averaged weights (its ``model.safetensors``, evaluated by
training itself, or here after a ``--no-eval`` run) and the raw last-step weights (kept in its trainer state for
--resume), evaluated here on the same dev sets. The seed's noise falls on both arms alike; the table gives each
seed's difference and their mean with a 95% t interval. (QA's no-answer threshold is the one training fitted for
the averaged weights: the raw arm's QA F1 is scored with it too.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import machine  # noqa: E402
from zoo_claims import T975  # noqa: E402

from bertzoo.atomic import atomic_write_text  # noqa: E402


def dev_metrics(run: Path, data: str, raw_weights: bool) -> dict:
    """Dev metrics of the run's last checkpoint: its averaged weights, or its raw (last-step) weights put back."""
    import torch

    from bertzoo.tokenization import Tokenizer
    from bertzoo.trainer.averaging import RAW_PREFIX
    from bertzoo.trainer.checkpoint import TOKENIZER, load_model, load_trainer_state, resolve_checkpoint
    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.evaluate import evaluate
    from bertzoo.trainer.training_data import load_splits

    directory = resolve_checkpoint(run, prefer="LATEST")
    model, config, _ = load_model(directory)
    _, _, state_tensors = load_trainer_state(directory)  # what --resume reads, the raw weights among them
    raw = {k[len(RAW_PREFIX):]: v for k, v in state_tensors.items() if k.startswith(RAW_PREFIX)}
    if not raw:
        raise SystemExit(f"{directory}: no raw weights in its trainer state; was it trained with weight_average?")
    if raw_weights:
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(raw[name])
    train_config = TrainConfig.from_dict(config["train"])
    train_config.data_dir = data
    return evaluate(model, load_splits(train_config, "dev", None), Tokenizer.from_file(directory / TOKENIZER),
                    train_config.limits)


def primary(metrics: dict) -> dict[str, float]:
    """Each task's primary dev metric, in points (x100; QA F1 as it is)."""
    from bertzoo.trainer.prioritization import primary_scores

    return {task: 100 * score for task, score in primary_scores(metrics).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--share", type=float, default=0.1, help="weight_average: the horizon as a share of the run")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--bertzoo", default=str(Path(sys.executable).with_name("bertzoo")))
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("train_options", nargs=argparse.REMAINDER, help="after --: bertzoo train options")
    args = parser.parse_args()
    options = [o for o in args.train_options if o != "--"]
    print(json.dumps(machine()), flush=True)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        run = args.out / f"seed{seed}"
        started = time.perf_counter()
        resume = ["--resume"] if (run / "LATEST").exists() else []
        subprocess.run([args.bertzoo, "train", "--data", args.data, "--out", str(run), "--seed", str(seed),
                        "--no-progress", "--save-every-minutes", "10", "--set", f"weight_average={args.share}",
                        *options, *resume], check=True, stdout=subprocess.DEVNULL)
        records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
        evaluated = [r["dev"] for r in records if "dev" in r]  # none when trained with --no-eval
        averaged = primary(evaluated[-1] if evaluated else dev_metrics(run, args.data, raw_weights=False))
        raw = primary(dev_metrics(run, args.data, raw_weights=True))
        rows.append({"seed": seed, "averaged": averaged, "raw": raw, "seconds": round(time.perf_counter() - started)})
        pairs = ", ".join(f"{t} raw {raw[t]:.2f} averaged {averaged[t]:.2f} ({averaged[t] - raw[t]:+.2f})"
                          for t in averaged)
        print(f"seed {seed}: {pairs}; {rows[-1]['seconds']} s", flush=True)
    for task in rows[0]["averaged"]:
        diffs = [r["averaged"][task] - r["raw"][task] for r in rows]
        mean = statistics.fmean(diffs)
        half = T975[len(diffs) - 1] * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        print(f"{task}: averaged - raw = {mean:+.2f} +- {half:.2f} points (95%, paired over {len(diffs)} seeds)")
    if args.json_out:
        atomic_write_text(args.json_out, json.dumps({"machine": machine(), "share": args.share,
                                                     "train_options": options, "seeds": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
