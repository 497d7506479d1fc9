"""Rebuild ``core/samples/`` (and ``tests/data/squad-v1.1-sample.json``) from the shared data folder.

Deterministic: rerunning it on the same shared files gives byte-identical output. CSV/TSV samples keep the original
header line and copy the chosen data lines byte for byte, in their original file order. SQuAD samples keep whole
paragraphs (every question and every reference answer) in the official schema; only the JSON whitespace changes.

    python tests/data/make_samples.py --shared /work/shared/data
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _data_lines(src: Path) -> tuple[bytes, list[bytes]]:
    """Header line and data lines, line endings kept. Valid because no shared CSV has a quoted line break."""
    lines = src.read_bytes().splitlines(keepends=True)
    return lines[0], lines[1:]


def _label(line: bytes) -> str:
    row = next(csv.reader([line.decode("utf-8").rstrip("\r\n")], delimiter="\t"))
    return row[-1].strip()


def _write_lines(dst: Path, header: bytes, lines: list[bytes], chosen: list[int]) -> int:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(header + b"".join(lines[i] for i in sorted(chosen)))
    return len(chosen)


def balanced(lines: list[bytes], pool: list[int], n: int, seed: int) -> list[int]:
    """About n/k random rows of ``pool`` from each of the k label values (the remainder goes to the first labels)."""
    by_label: dict[str, list[int]] = defaultdict(list)
    for i in pool:
        by_label[_label(lines[i])].append(i)
    labels = sorted(by_label)
    rng = random.Random(seed)
    chosen: list[int] = []
    for k, lab in enumerate(labels):
        want = n // len(labels) + (1 if k < n % len(labels) else 0)
        chosen += rng.sample(by_label[lab], want)
    return chosen


def shortest_balanced(lines: list[bytes], n: int) -> list[int]:
    """The n/k shortest rows of each label (ties broken by file order): keeps the long CFIMDB reviews out."""
    by_label: dict[str, list[int]] = defaultdict(list)
    for i, line in enumerate(lines):
        by_label[_label(line)].append(i)
    chosen: list[int] = []
    for lab in sorted(by_label):
        chosen += sorted(by_label[lab], key=lambda i: (len(lines[i]), i))[: n // len(by_label)]
    return chosen


def csv_sample(src: Path, dst: Path, n: int, seed: int = 0, how: str = "balanced", must: tuple[int, ...] = (),
               leave_out: tuple[int, ...] = ()) -> int:
    """Write n data rows of ``src`` to ``dst``: the ``must`` rows plus rows chosen by ``how``, less ``leave_out``."""
    header, lines = _data_lines(src)
    if how == "shortest":
        chosen = shortest_balanced(lines, n)
    else:
        pool = [i for i in range(len(lines)) if i not in must]
        k = n - len(must)
        picked = random.Random(seed).sample(pool, k) if how == "random" else balanced(lines, pool, k, seed)
        chosen = [*must, *picked]
    return _write_lines(dst, header, lines, [i for i in chosen if i not in leave_out])


def malformed_quora_rows(lines: list[bytes]) -> tuple[int, ...]:
    """Indices of data lines whose label field is empty (the 2 upstream-damaged quora-dev rows)."""
    return tuple(i for i, line in enumerate(lines) if _label(line) == "")


def squad_sample(src: Path, dst: Path, target: int, cap: int, min_impossible: int = 0) -> tuple[int, int]:
    """Keep whole paragraphs, shortest contexts first, until ``target`` questions (never more than ``cap``).

    Paragraphs holding unanswerable questions are taken first until ``min_impossible`` of those are in, because the
    shortest paragraphs of the v2.0 train excerpt are almost all answerable-only.
    """
    doc = json.loads(src.read_text(encoding="utf-8"))
    paras = [
        (len(p["context"]), a, b, sum(q.get("is_impossible", False) for q in p["qas"]), len(p["qas"]))
        for a, art in enumerate(doc["data"])
        for b, p in enumerate(art["paragraphs"])
    ]
    paras.sort()
    picked: set[tuple[int, int]] = set()
    total = impossible = 0
    for only_impossible in (True, False):
        for _, a, b, n_imp, n_q in paras:
            if total >= target or (only_impossible and impossible >= min_impossible):
                break
            if (a, b) in picked or (only_impossible and not n_imp) or total + n_q > cap:
                continue
            picked.add((a, b))
            total, impossible = total + n_q, impossible + n_imp
    data = []
    for a, art in enumerate(doc["data"]):  # original article and paragraph order
        kept = [p for b, p in enumerate(art["paragraphs"]) if (a, b) in picked]
        if kept:
            data.append({**{k: v for k, v in art.items() if k != "paragraphs"}, "paragraphs": kept})
    out = {k: (data if k == "data" else v) for k, v in doc.items()}
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return total, impossible


def trees_sample(src: Path, sentences: Path, dst: Path) -> int:
    """The tree lines of ``src`` (SST PTB trees) whose sentence is one of the sample's ``sentences`` file, byte for
    byte and in order, behind the source's byte-order mark."""
    from bertzoo.data import read_cs224n_sentiment
    from bertzoo.sst_trees import parse_tree

    wanted = {e.text for e in read_cs224n_sentiment(sentences)}
    raw = src.read_bytes()
    bom = b"\xef\xbb\xbf" if raw.startswith(b"\xef\xbb\xbf") else b""
    lines = raw[len(bom):].splitlines(keepends=True)
    kept = [line for line in lines if parse_tree(line.decode("utf-8"))[-1][0] in wanted]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bom + b"".join(kept))
    return len(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=Path("/work/shared/data"), help="the shared data folder")
    ap.add_argument("--out", type=Path, default=REPO / "core" / "samples")
    ap.add_argument("--tests-out", type=Path, default=REPO / "tests" / "data")
    args = ap.parse_args()
    s, o = args.shared, args.out

    counts = {
        "ids-sst-train.csv": csv_sample(s / "ids-sst-train.csv", o / "ids-sst-train.csv", 240),
        "ids-sst-dev.csv": csv_sample(s / "ids-sst-dev.csv", o / "ids-sst-dev.csv", 80),
        "ids-cfimdb-train.csv": csv_sample(s / "ids-cfimdb-train.csv", o / "ids-cfimdb-train.csv", 40, how="shortest"),
        "ids-cfimdb-dev.csv": csv_sample(s / "ids-cfimdb-dev.csv", o / "ids-cfimdb-dev.csv", 20, how="shortest"),
        "glue-sst2/train.tsv": csv_sample(s / "glue-sst2/train.tsv", o / "glue-sst2/train.tsv", 60),
        "glue-sst2/dev.tsv": csv_sample(s / "glue-sst2/dev.tsv", o / "glue-sst2/dev.tsv", 30),
        "quora-train.csv": csv_sample(s / "quora/quora-train-subset.csv", o / "quora-train.csv", 200),
        "sts-train.csv": csv_sample(s / "sts-train.csv", o / "sts-train.csv", 200, how="random"),
        "sts-dev.csv": csv_sample(s / "sts-dev.csv", o / "sts-dev.csv", 60, how="random"),
    }
    bad = malformed_quora_rows(_data_lines(s / "quora-dev.csv")[1])
    if len(bad) != 2:  # the README documents exactly 2; anything else means a different quora-dev.csv
        raise SystemExit(f"expected the 2 known malformed quora-dev rows, found {len(bad)}")
    # The damaged rows go to a test file of their own (tests/test_data.py reads it), so that training and export on
    # the samples warn of nothing; the sample keeps the 58 rows drawn beside them.
    counts["quora-dev.csv"] = csv_sample(s / "quora-dev.csv", o / "quora-dev.csv", 60, must=bad, leave_out=bad)
    header, lines = _data_lines(s / "quora-dev.csv")
    counts["tests/data/quora-dev-damaged.csv"] = _write_lines(args.tests_out / "quora-dev-damaged.csv", header, lines,
                                                             list(bad))
    counts["sst-trees/train.txt"] = trees_sample(s / "sst-trees/train.txt", o / "ids-sst-train.csv",
                                                 o / "sst-trees/train.txt")

    squad = {
        "squad/train-v2.0.json": squad_sample(
            s / "squad/train-v2.0.first10.json", o / "squad/train-v2.0.json", 120, 130, min_impossible=30
        ),
        "squad/dev-v2.0.json": squad_sample(s / "squad/cs224n-dev-v2.0.json", o / "squad/dev-v2.0.json", 60, 66),
        "tests/data/squad-v1.1-sample.json": squad_sample(
            s / "squad/xquad.en.json", args.tests_out / "squad-v1.1-sample.json", 10, 12
        ),
    }
    for name, n in counts.items():
        print(f"{name}: {n} rows")
    for name, (n, imp) in squad.items():
        print(f"{name}: {n} questions ({imp} is_impossible)")


if __name__ == "__main__":
    main()
