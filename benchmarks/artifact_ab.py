"""Two exports of the same checkpoint side by side: the in-process rate of each encoder variant, alternating rounds in
one run, so the machine's drift falls on both equally. For an export-side change worth a few percent (a graph
rewrite, an exporter option), which one run of each cannot show.

    python -m benchmarks.artifact_ab BEFORE_ARTIFACT AFTER_ARTIFACT --data ../shared/data/ids-sst-dev.csv \
        [--variants fp32 optimized int8] [--rounds 3] [--json F]

The rate is benchmarks/common/ceiling.py's: the server's own batch computation (Sentiment: the encoder, then the
head) on every sentence of ``--data``, padded as the server pads, one ONNX Runtime engine on every core, batches of
``--batch``, the best of 2 passes. Round r runs the artifacts in order, round r + 1 in reverse.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks.common.ceiling import in_process_rates
from benchmarks.common.timing import machine
from bertzoo.artifact import load_manifest
from bertzoo.atomic import atomic_write_text
from bertzoo.serving.load import load_items

SETTING = "1 engine(s), batches of {rows}, padded as the server pads, spinning off"


def served_rate(artifact: str, variant: str, sentences: list[str], threads: int, rows: int) -> float:
    """Sentences/s of the server's batch computation (Sentiment) on ``artifact``'s ``variant`` encoder."""
    found = in_process_rates(artifact, "onnxruntime", {"variant": variant}, sentences, threads, tasks=("sentiment",),
                             batch_sizes=(rows,), only=SETTING.format(rows=rows))
    return next(iter(found.values()))["rate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--data", required=True, help="a Sentiment CSV (ids-sst-dev.csv)")
    parser.add_argument("--variants", nargs="+", default=["fp32", "optimized", "int8"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="rows a batch (the server's --max-batch-size)")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: every core)")
    parser.add_argument("--json")
    args = parser.parse_args()
    threads = args.threads or os.cpu_count() or 1
    sentences = load_items("sentiment", args.data)
    arms = {"before": args.before, "after": args.after}
    for name, artifact in arms.items():
        missing = set(args.variants) - set(load_manifest(artifact)["graphs"]["encoder"]["files"])
        if missing:
            raise SystemExit(f"{artifact}: no {sorted(missing)} encoder ({name}); export it with --optimize / --int8")
    results: dict = {"machine": machine(), "arms": arms, "threads": threads, "batch": args.batch,
                     "sentences": len(sentences), "rates": []}
    for variant in args.variants:
        for round_ in range(args.rounds):
            for name in (list(arms) if round_ % 2 == 0 else list(arms)[::-1]):
                rate = served_rate(arms[name], variant, sentences, threads, args.batch)
                results["rates"].append({"variant": variant, "round": round_, "arm": name, "sentences_per_s": rate})
                print(f"{variant} round {round_ + 1} {name:6}: {rate:.1f} sentences/s", flush=True)
        by_arm = {name: [r["sentences_per_s"] for r in results["rates"] if r["variant"] == variant
                         and r["arm"] == name] for name in arms}
        ratios = sorted(a / b for a, b in zip(by_arm["after"], by_arm["before"], strict=True))
        print(f"{variant}: after/before {ratios[0]:.3f}-{ratios[-1]:.3f} (per round)", flush=True)
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
