"""Each seed paper's own claim, tested in its own setting against the baseline trained the same way, over seeds.

    python -m benchmarks.zoo_claims --data ../shared/data --out /tmp/claims --claims ssaf_sst5 --seeds 0,1,2
    python -m benchmarks.zoo_claims --data ../shared/data --out /tmp/claims --report      # the table only

A claim is a setting (tasks, budget) and arms (the baseline and the paper's system, as ``bertzoo train`` options).
Every (claim, arm, seed) trains in its own child process into ``OUT/<claim>/<arm>/seed<k>``. When it finishes, its
final dev metrics go to ``RESULTS/<claim>/<arm>/seed<k>.json`` (``--results``, by default the committed
``benchmarks/results/zoo_claims``; ``seconds`` there is the run's wall time, including the pre-training it started
with, if any): a run with a result is never trained again, a run that was killed continues with ``--resume``, so one
sweep can be spread over several runs and machines. A run that another claim already finished (the same options
but the seed: the baselines of claims in one setting) shares that result, marked ``same_run_as``. The report gives,
per arm, the mean dev score with a 95% t-interval over seeds, and the difference to the baseline with the interval of
that difference (Welch), which is what says "confirmed" (interval above 0), "refuted" (interval below 0) or
"unresolved" (it straddles 0).

Attention guidance's claim (paper 003) is about pre-training: its arms first pre-train a small BERT from scratch
with ``bertzoo pretrain`` (plain MLM, or MLM + AG, same seed, budget and corpus) into ``OUT/ag_pretrain/<arm>/seed<k>``,
shared by its two fine-tuning claims (SST-2 and STS-B, single-task each, as the issue asks), which then start from
that backbone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.intervals import difference_ci, mean_ci
from bertzoo.atomic import atomic_write_text


@dataclass(frozen=True)
class Pretraining:
    """A ``bertzoo pretrain`` run per (arm, seed) that a claim's fine-tuning starts from (``--backbone``)."""
    name: str  # its runs live in OUT/<name>/<arm>/seed<k>, shared by every claim that names it
    options: tuple[str, ...]  # bertzoo pretrain options shared by every arm (the corpus: --data, added here)
    arms: dict[str, tuple[str, ...]]  # arm -> its own pretrain options


@dataclass(frozen=True)
class Claim:
    paper: str
    statement: str
    options: tuple[str, ...]  # bertzoo train options shared by every arm
    arms: dict[str, tuple[str, ...]]  # arm -> its own options; "baseline" first
    metrics: tuple[tuple[str, str], ...]  # the (task, dev metric) pairs the claim is about
    pretraining: Pretraining | None = None
    # Globs under --data: the claim trains and evaluates on these files alone (a folder of links to them, in
    # OUT/<claim>/data), where its paper's dataset is part of the data folder. Empty: all of --data.
    data_files: tuple[str, ...] = ()


_SST5 = ("--tasks", "sentiment", "--epochs", "2")
# The CS224N multitask setting of papers 000 and 004: three sentence tasks, no QA.
_MULTI = ("--tasks", "sentiment,paraphrase,similarity", "--epochs", "2")
_MULTI_METRICS = (("sentiment", "accuracy"), ("paraphrase", "accuracy"), ("similarity", "pearson"))
# Paper 003 from random weights: a 4-layer, 256-wide BERT, 8 heads so that AG guides one [Next], one [Prev] and two
# [First] heads per layer, alpha_0 = 10; 2,000 steps (4x the first experiment's budget).
_AG_MODEL = ("num_hidden_layers=4", "hidden_size=256", "num_attention_heads=8", "intermediate_size=1024",
             "max_position_embeddings=64")
AG_PRETRAINING = Pretraining(
    "ag_pretrain",
    ("--random-init", *(o for kv in _AG_MODEL for o in ("--encoder", kv)), "--max-steps", "2000", "--batch-size", "32",
     "--max-seq-length", "64", "--lr", "5e-4", "--warmup-ratio", "0.05"),
    {"baseline": (), "ag": ("--ag-weight", "10", "--ag-fraction", "0.5", "--ag-patterns", "next,prev,first")})
_AG_FINETUNE = ("--max-seq-length", "64", "--lr", "1e-4")


def _ssaf_squad(epochs: int, lambdas: tuple[int, ...]) -> Claim:
    return Claim(
        "002", f"sparsegen-lin attention beats softmax on SQuAD v1.1 (the paper: lambda -7), {epochs} epochs",
        ("--tasks", "qa", "--epochs", str(epochs), "--qa-unanswerable-fraction", "0", "--qa-calibration-articles", "0",
         "--qa-null-threshold", "1e9"),
        {"baseline": (), **{f"ssaf_lambda{lam}": ("--encoder", "attention=sparsegen_lin", "--encoder",
                                                  f"sparsegen_lambda={lam}") for lam in lambdas}},
        (("qa", "HasAns_f1"), ("qa", "HasAns_exact")),
        data_files=("squad/train-v1.1*.json", "squad/cs224n-dev-v2.0.json"))


CLAIMS: dict[str, Claim] = {
    "ssaf_sst5": Claim(
        "002", "sparsegen-lin attention beats softmax on SST-5 (the paper: SST-1), lambda swept", _SST5,
        {"baseline": (), **{f"ssaf_lambda{lam}": ("--encoder", "attention=sparsegen_lin", "--encoder",
                                                  f"sparsegen_lambda={lam}") for lam in (-7, -5, -3, 0)}},
        (("sentiment", "accuracy"),)),
    # The paper's SQuAD setting: SQuAD v1.1 (every question answerable), lambda -7, 2 epochs, batch 16. Trained on the
    # v1.1 train file alone, with no synthetic unanswerable questions and a no-answer threshold that never abstains;
    # scored on the dev file's answerable questions (HasAns), which is v1.1's metric on those questions.
    "ssaf_squad": _ssaf_squad(2, (-7, -5, -3, 0)),
    # Twice the budget, the paper's lambda and its neighbour: does the gap close with more training?
    "ssaf_squad_4epochs": _ssaf_squad(4, (-7, -5)),
    # Paper 001 trains each task on its own and gives every arm the negative-Pearson STS loss: only the heads differ.
    "task_attention_quora": Claim(
        "001", "a cross-attention layer beats mean pooling + [u; v; |u - v|] for paraphrase (single-task)",
        ("--tasks", "paraphrase", "--epochs", "2"),
        {"baseline": ("--set", "paraphrase_head=concat"), "task_attention": ("--preset", "task_attention")},
        (("paraphrase", "accuracy"),)),
    "task_attention_stsb": Claim(
        "001", "three cross-attention layers beat mean pooling + [u; v; |u - v|] for similarity (single-task)",
        ("--tasks", "similarity", "--epochs", "2", "--set", "similarity_loss=neg_pearson"),
        {"baseline": ("--set", "similarity_head=concat"), "task_attention": ("--preset", "task_attention")},
        (("similarity", "pearson"),)),
    "ssa_sst5": Claim(
        "000", "self-supervised attention helps single-task sentiment (whole training set probed)", _SST5,
        {"baseline": (), "ssa": ("--preset", "ssa", "--set", "ssa_probe_limit=null")},
        (("sentiment", "accuracy"),)),
    "ssa_multitask": Claim(
        "000", "the same head in multitask training (the paper's contrast)", _MULTI,
        {"baseline": (), "ssa": ("--preset", "ssa", "--set", "ssa_probe_limit=null")}, _MULTI_METRICS),
    "cross_pool_dtp": Claim(
        "004", "cross-attention + attention pooling + dynamic task prioritization beat the baseline's multitask run",
        _MULTI, {"baseline": (), "cross_pool_dtp": ("--preset", "cross_pool_dtp"),
                 # the two halves alone, to tell which one moves a score: the heads with the baseline's
                 # proportional sampling, and DTP's sampling with the baseline's heads
                 "cross_pool": ("--preset", "cross_pool_dtp", "--set", "sampling=proportional"),
                 "dtp": ("--set", "sampling=dynamic")}, _MULTI_METRICS),
    "ag_sst2": Claim(
        "003", "pre-training with attention guidance gives a better SST-2 model than plain MLM pre-training",
        ("--tasks", "sentiment", "--sentiment-dataset", "sst2", "--epochs", "1", *_AG_FINETUNE),
        {"baseline": (), "ag": ()}, (("sentiment", "accuracy"),), AG_PRETRAINING),
    "ag_stsb": Claim(
        "003", "the same pre-trained pair of models, fine-tuned on STS-B", ("--tasks", "similarity", "--epochs", "3",
                                                                           *_AG_FINETUNE),
        {"baseline": (), "ag": ()}, (("similarity", "pearson"),), AG_PRETRAINING),
    # Not a paper's claim, the same question of a training option: does bf16 autocast on a CPU (fast where the CPU has
    # native bf16: avx512_bf16, AMX) train as well as fp32? Its baseline is ssaf_sst5's (the same options).
    "bf16_sst5": Claim("-", "bf16 autocast on the CPU trains SST-5 as well as fp32", _SST5,
                       {"baseline": (), "bf16": ("--precision", "bf16")}, (("sentiment", "accuracy"),)),
}
def final_dev(result: Path) -> dict | None:
    """The dev metrics of a finished run (written once ``bertzoo train`` exited cleanly), else None."""
    return json.loads(result.read_text()) if result.is_file() else None


def run_logged(cmd: list[str], run: Path) -> None:
    print("+", " ".join(cmd), flush=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    with open(run.parent / f"{run.name}.log", "a") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)


def log_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines() if line.strip()]


def pretrained_backbone(bertzoo: str, pretraining: Pretraining, arm: str, seed: int, out: Path,
                        data: str) -> tuple[Path, float]:
    """The arm's pre-trained backbone for this seed and its final held-out MLM loss, pre-training it first unless an
    earlier run left it (``bertzoo pretrain`` writes ``backbone/`` atomically at its end, so a killed pre-training is
    simply run again)."""
    run = out / pretraining.name / arm / f"seed{seed}"
    backbone = run / "backbone"
    if not (backbone / "model.safetensors").is_file():
        run_logged([bertzoo, "pretrain", "--data", data, "--out", str(run), "--seed", str(seed), "--no-progress",
                    *pretraining.options, *pretraining.arms[arm]], run)
    return backbone, [r["heldout_mlm_loss"] for r in log_records(run) if "heldout_mlm_loss" in r][-1]


def claim_data(claim: Claim, name: str, data: str, out: Path) -> str:
    """The data folder the claim's runs read: ``data`` itself, or a folder of links to its ``data_files``."""
    if not claim.data_files:
        return data
    view = out / name / "data"
    for pattern in claim.data_files:
        matches = sorted(Path(data).glob(pattern))
        if not matches:
            sys.exit(f"{name}: no file under {data} matches {pattern!r}, which the claim needs")
        for source in matches:
            link = view / source.relative_to(data)
            link.parent.mkdir(parents=True, exist_ok=True)
            try:
                link.symlink_to(source.resolve())
            except FileExistsError:  # an earlier run of the claim, or one running beside this one, made it
                pass
    return str(view)


def train(bertzoo: str, name: str, arm: str, seed: int, out: Path, result: Path, data: str) -> None:
    claim = CLAIMS[name]
    started = time.perf_counter()
    backbone, extra = [], {}
    if claim.pretraining is not None:
        path, extra["pretrain_heldout_mlm_loss"] = pretrained_backbone(bertzoo, claim.pretraining, arm, seed, out, data)
        backbone = ["--backbone", str(path)]
    run = out / name / arm / f"seed{seed}"
    resume = ["--resume"] if (run / "LATEST").exists() else []
    # Checkpoints every 10 minutes too (atomic; a resumed run is bit-identical), so a run that is cut off loses little.
    data = claim_data(claim, name, data, out)
    run_logged([bertzoo, "train", "--data", data, "--out", str(run), "--seed", str(seed), "--no-progress",
                "--save-every-minutes", "10", *backbone, *claim.options, *claim.arms[arm], *resume], run)
    dev = [r["dev"] for r in log_records(run) if "dev" in r][-1]  # the evaluation after the last step
    result.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(result, json.dumps({**dev, **extra, "seconds": round(time.perf_counter() - started)},
                                         indent=1) + "\n")
    print(f"  {time.perf_counter() - started:.0f} s", flush=True)


def run_options(name: str, arm: str) -> tuple:
    """Everything that decides what a (claim, arm) run trains, but the seed: two claims whose baselines are the same
    run (ssaf_sst5 and ssa_sst5; ssa_multitask and cross_pool_dtp) share its result rather than train it twice."""
    claim = CLAIMS[name]
    pretraining = claim.pretraining
    before = () if pretraining is None else (pretraining.name, pretraining.options, pretraining.arms[arm])
    return before, claim.options, claim.arms[arm]


def twin_result(results: Path, name: str, arm: str, seed: int) -> Path | None:
    """The finished result of the same run under another claim, if there is one."""
    for other, claim in CLAIMS.items():
        for other_arm in claim.arms:
            twin = results / other / other_arm / f"seed{seed}.json"
            if ((other, other_arm) != (name, arm) and run_options(other, other_arm) == run_options(name, arm)
                    and final_dev(twin) is not None):
                return twin
    return None


def report(results: Path, names: list[str]) -> list[str]:
    lines = ["| claim (paper) | task, metric | arm | seeds | dev score, mean +- 95% | vs baseline, +- 95% | verdict |",
             "|---|---|---|---|---|---|---|"]
    for name in names:
        claim = CLAIMS[name]
        devs = {arm: [d for d in map(final_dev, sorted((results / name / arm).glob("seed*.json"))) if d is not None]
                for arm in claim.arms}
        for task, metric in claim.metrics:
            scores = {arm: [d[task][metric] for d in runs] for arm, runs in devs.items()}
            base = scores["baseline"]
            for arm, values in scores.items():
                where = f"| {name} ({claim.paper}) | {task} {metric} | {arm} | {len(values)} |"
                if not values:
                    lines.append(f"{where} - | - | not run |")
                    continue
                mean, _, half = mean_ci(values)
                diff_text, verdict = "-", ""
                if arm != "baseline" and len(values) > 1 and len(base) > 1:
                    diff, dhalf = difference_ci(values, base)
                    diff_text = f"{diff:+.4f} +- {dhalf:.4f}"
                    verdict = "confirmed" if diff - dhalf > 0 else "refuted" if diff + dhalf < 0 else "unresolved"
                spread = f" +- {half:.4f}" if len(values) > 1 else " (one seed)"
                lines.append(f"{where} {mean:.4f}{spread} | {diff_text} | {verdict} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True, help="run directories (checkpoints: not for git)")
    parser.add_argument("--results", default=str(Path(__file__).parent / "results" / "zoo_claims"),
                        help="each finished run's dev metrics, one small JSON file per run")
    parser.add_argument("--claims", default=",".join(CLAIMS), help=f"comma-separated, of {', '.join(CLAIMS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default=None, help="only these arms (comma-separated); default all")
    parser.add_argument("--report", action="store_true", help="print the table of the runs in --out, train nothing")
    args = parser.parse_args()
    names = [c for c in args.claims.split(",") if c]
    unknown = [c for c in names if c not in CLAIMS]
    if unknown:
        sys.exit(f"--claims: unknown {unknown}; choose from {', '.join(CLAIMS)}")
    out, results = Path(args.out), Path(args.results)
    if not args.report:
        bertzoo = shutil.which("bertzoo") or str(Path(sys.executable).with_name("bertzoo"))
        seeds = [int(s) for s in args.seeds.split(",")]
        # Seed-major: an interrupted sweep leaves every claim and arm with as many seeds as possible.
        for seed in seeds:
            for name in names:
                for arm in CLAIMS[name].arms:
                    if args.arms and arm not in args.arms.split(","):
                        continue
                    result = results / name / arm / f"seed{seed}.json"
                    if final_dev(result) is not None:
                        continue
                    twin = twin_result(results, name, arm, seed)
                    if twin is not None:
                        print(f"{name}/{arm}/seed{seed}: the same run as {twin.relative_to(results)}, result shared")
                        shared = {**final_dev(twin), "same_run_as": str(twin.relative_to(results).with_suffix(""))}
                        result.parent.mkdir(parents=True, exist_ok=True)
                        atomic_write_text(result, json.dumps(shared, indent=1) + "\n")
                    else:
                        train(bertzoo, name, arm, seed, out, result, args.data)
    print("\n".join(report(results, names)))


if __name__ == "__main__":
    main()
