"""Where each task's files live under a data directory.

``bertzoo train --data DIR`` works on any directory laid out like the shared data folder or like the bundled
``core/samples`` (which copies that layout on purpose). For every (task, split) there is a list of glob patterns,
relative to DIR; the **first pattern that matches at least one file wins** and all of its matches (sorted) are loaded.

=============  =====  ============================================================================================
task           split  patterns tried, in order
=============  =====  ============================================================================================
sentiment      train  sst5: ``ids-sst-train.csv``; cfimdb: ``ids-cfimdb-train.csv``; sst2: ``glue-sst2/train.tsv``
sentiment      dev    sst5: ``ids-sst-dev.csv``; cfimdb: ``ids-cfimdb-dev.csv``; sst2: ``glue-sst2/dev.tsv``
paraphrase     train  ``quora-train.csv``, ``quora/quora-train*.csv``
paraphrase     dev    ``quora-dev.csv``
similarity     train  ``sts-train.csv``
similarity     dev    ``sts-dev.csv``
qa             train  ``squad/train-*.json``, ``train-*.json``
qa             dev    ``squad/dev-*.json``, ``dev-*.json``, ``squad/cs224n-dev-v2.0.json``
=============  =====  ============================================================================================

Notes:

* Sentiment has three datasets: ``sst5`` (SST, 5 labels, the default), ``cfimdb`` (2 labels) and ``sst2``
  (GLUE SST-2, 2 labels).
* The full CS224N ``quora-train.csv`` is preferred when present; the shared folder only has the subset
  ``quora/quora-train-subset.csv``.
* Several QA train files (the shared folder has ``train-v1.1.first11.json`` and ``train-v2.0.first10.json``, which
  overlap) are merged and de-duplicated by question id, first file in sorted order wins.
* The shared folder has no ``squad/dev-*.json``, so QA dev falls through to ``squad/cs224n-dev-v2.0.json``.
  ``squad/xquad.en.json`` is never picked: it comes from the same official dev set as ``cs224n-dev-v2.0.json``.
"""

from __future__ import annotations

from pathlib import Path

from bertzoo.data import (
    DataError,
    PairExample,
    QAExample,
    SentenceExample,
    read_cs224n_pairs,
    read_cs224n_sentiment,
    read_glue_sst2,
    read_squad_files,
)

__all__ = ["SENTIMENT_DATASETS", "SPLITS", "TASKS", "find_files", "load_split", "patterns"]

TASKS = ("sentiment", "paraphrase", "similarity", "qa")
SPLITS = ("train", "dev")
# Number of labels per sentiment dataset; the readers reject labels outside 0..n-1.
SENTIMENT_DATASETS: dict[str, int] = {"sst5": 5, "cfimdb": 2, "sst2": 2}

_SENTIMENT_PATTERNS = {
    "sst5": ("ids-sst-{split}.csv",),
    "cfimdb": ("ids-cfimdb-{split}.csv",),
    "sst2": ("glue-sst2/{split}.tsv",),
}
_PATTERNS: dict[tuple[str, str], tuple[str, ...]] = {
    ("paraphrase", "train"): ("quora-train.csv", "quora/quora-train*.csv"),
    ("paraphrase", "dev"): ("quora-dev.csv",),
    ("similarity", "train"): ("sts-train.csv",),
    ("similarity", "dev"): ("sts-dev.csv",),
    ("qa", "train"): ("squad/train-*.json", "train-*.json"),
    ("qa", "dev"): ("squad/dev-*.json", "dev-*.json", "squad/cs224n-dev-v2.0.json"),
}


def _check_args(task: str, split: str, sentiment_dataset: str) -> None:
    # Plain ValueError: these are programming/CLI-choice errors, not problems with a data file.
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    if task == "sentiment" and sentiment_dataset not in SENTIMENT_DATASETS:
        choices = ", ".join(SENTIMENT_DATASETS)
        raise ValueError(f"unknown sentiment dataset {sentiment_dataset!r}; choose from {choices}")


def patterns(task: str, split: str, sentiment_dataset: str = "sst5") -> tuple[str, ...]:
    """The glob patterns tried for (task, split), relative to the data directory, in priority order."""
    _check_args(task, split, sentiment_dataset)
    if task == "sentiment":
        return tuple(p.format(split=split) for p in _SENTIMENT_PATTERNS[sentiment_dataset])
    return _PATTERNS[(task, split)]


def find_files(data_dir: str | Path, task: str, split: str, sentiment_dataset: str = "sst5") -> list[Path]:
    """Files for (task, split) under ``data_dir``: the sorted matches of the first pattern that matches anything.

    Raises DataError naming the directory and every pattern tried when nothing matches.
    """
    tried = patterns(task, split, sentiment_dataset)
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"{root}: data directory not found")
    for pattern in tried:
        matches = sorted(p for p in root.glob(pattern) if p.is_file())
        if matches:
            return matches
    what = f"{task}/{sentiment_dataset}" if task == "sentiment" else task
    raise DataError(f"{root}: no {what} {split} files; tried {', '.join(tried)}")


def load_split(
    data_dir: str | Path,
    task: str,
    split: str,
    sentiment_dataset: str = "sst5",
    skipped: list[str] | None = None,
) -> list[SentenceExample] | list[PairExample] | list[QAExample]:
    """Find and read the files for (task, split); malformed rows are skipped and appended to ``skipped``.

    Train and dev files must carry labels, and must give at least one usable row each: a DataError names the file and
    the column otherwise (only test files may be unlabelled).
    """
    files = find_files(data_dir, task, split, sentiment_dataset)
    if task == "qa":
        return read_squad_files(files, skipped)
    labelled = split in ("train", "dev")
    skipped = [] if skipped is None else skipped
    examples: list = []
    for f in files:
        if task == "sentiment":
            label_col = "label" if sentiment_dataset == "sst2" else "sentiment"
            rows = (read_glue_sst2(f, skipped) if sentiment_dataset == "sst2"
                    else read_cs224n_sentiment(f, SENTIMENT_DATASETS[sentiment_dataset], skipped))
        else:
            label_col = "is_duplicate" if task == "paraphrase" else "similarity"
            rows = read_cs224n_pairs(f, label_col, skipped)
        if labelled and any(r.label is None for r in rows):
            raise DataError(f"{f}: no {label_col!r} column; {split} files need labels (the header must name it)")
        if labelled and not rows:
            reasons = [s.removeprefix(f"{f}:") for s in skipped if s.startswith(f"{f}:")]
            first = f"; the first: line {reasons[0]}" if reasons else ""
            raise DataError(f"{f}: no usable rows, every row was malformed{first}")
        examples.extend(rows)
    return examples


def samples_dir() -> Path:
    """The small samples bundled with bertzoo (the default run's data and the tests'), in the layout above."""
    return Path(__file__).resolve().parent / "samples"
