"""How much do synthetic unanswerable questions look like real ones? Three surface cues, side by side.

    python benchmarks/negatives_profile.py --data ../shared/data --json-out results/negatives_profile.json

A model learns whatever separates its negatives from its positives. If the synthetic unanswerable questions differ
from the answerable ones by a cue that real unanswerable questions do not carry, the abstainer learns the cue and
misses the real ones. This script prints, for the dev set's answerable and unanswerable questions, the real
unanswerable training questions, and each kind of synthetic negative in each style (core/unanswerable.py, made from
the QA training files exactly as ``bertzoo train`` makes them, before its calibration hold-out):

- absent: the share of questions naming a name or number their paragraph never mentions;
- negated: the share with "not", "never", "no" or "n't";
- overlap: the mean share of the question's words (SQuAD-normalized) that occur in its paragraph.

Torch-free; about a minute on 2 cores for the shared data.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import machine  # noqa: E402

from bertzoo.atomic import atomic_write_text  # noqa: E402
from bertzoo.data import QAExample  # noqa: E402
from bertzoo.datafiles import load_split  # noqa: E402
from bertzoo.qa import normalize_answer  # noqa: E402
from bertzoo.unanswerable import (  # noqa: E402
    NEGATIVE_KINDS,
    NEGATIVE_STYLES,
    is_negated,
    names_and_numbers,
    synthesize_unanswerable,
    words_of,
)


def names_an_absent_entity(example: QAExample) -> bool:
    context = f" {normalize_answer(example.context)} "
    entities = (normalize_answer(example.question[s:e]) for s, e in names_and_numbers(example.question))
    return any(f" {entity} " not in context for entity in entities if entity)


def profile(examples: Sequence[QAExample]) -> dict:
    n = len(examples)
    overlap = sum(len(words_of(e.question) & words_of(e.context)) / max(1, len(words_of(e.question)))
                  for e in examples)
    return {"questions": n, "absent": sum(map(names_an_absent_entity, examples)) / n,
            "negated": sum(is_negated(e.question) for e in examples) / n, "overlap": overlap / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory with the SQuAD train and dev files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    train = load_split(args.data, "qa", "train")
    dev = load_split(args.data, "qa", "dev")
    rows = {"dev answerable": profile([e for e in dev if not e.is_impossible]),
            "dev unanswerable": profile([e for e in dev if e.is_impossible]),
            "train answerable": profile([e for e in train if not e.is_impossible]),
            "train unanswerable (real)": profile([e for e in train if e.is_impossible])}
    for style in NEGATIVE_STYLES:
        made = synthesize_unanswerable(train, 0.5, args.seed, style)
        for kind in NEGATIVE_KINDS:
            rows[f"synthetic {style}: {kind}"] = profile([e for e in made if e.id.endswith(f"-{kind}")])
    print(f"{'':34s} {'questions':>9s} {'absent':>7s} {'negated':>7s} {'overlap':>7s}")
    for name, row in rows.items():
        print(f"{name:34s} {row['questions']:9d} {row['absent']:7.3f} {row['negated']:7.3f} {row['overlap']:7.3f}")
    if args.json_out:
        atomic_write_text(args.json_out, json.dumps({"machine": machine(), "seed": args.seed, "rows": rows},
                                                    indent=2) + "\n")


if __name__ == "__main__":
    main()
