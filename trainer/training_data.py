"""What a training run reads: each task's train and dev examples from a data directory, SST phrases, the QA questions
held out for calibration, and the synthetic unanswerable questions."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from bertzoo.data import DataError, _check_exists
from bertzoo.datafiles import find_files, load_split, samples_dir
from bertzoo.sst_trees import read_sst_phrases
from bertzoo.unanswerable import synthesize_unanswerable

from .calibration import hold_out_articles
from .config import TrainConfig

log = logging.getLogger("bertzoo.train")


def check_data_files(config: TrainConfig) -> None:
    """Fail before anything is written when a task's files are missing; the message says how to leave the task out."""
    data_dir = Path(config.data_dir) if config.data_dir else samples_dir()
    splits = ("train", "dev") if config.eval_every_epoch or config.sampling == "dynamic" else ("train",)
    for task in config.tasks:
        for split in splits:
            try:
                find_files(data_dir, task, split, config.sentiment_dataset)
            except DataError as e:
                others = [t for t in config.tasks if t != task]
                if not data_dir.is_dir() or not others:
                    raise
                raise DataError(f"{e}; to train without {task}, pass --tasks {','.join(others)}") from None
    if config.sst_phrases:
        _check_exists(Path(config.sst_phrases))


def load_splits(config: TrainConfig, split: str, limit: int | None) -> dict[str, list]:
    """Each task's examples of a split."""
    data_dir = Path(config.data_dir) if config.data_dir else samples_dir()
    splits = {}
    for task in config.tasks:
        skipped: list[str] = []
        examples = load_split(data_dir, task, split, config.sentiment_dataset, skipped=skipped)
        if skipped:
            log.warning("%s/%s: skipped %d malformed rows (first: %s)", task, split, len(skipped), skipped[0])
        if not examples:  # e.g. a SQuAD file whose every question was malformed: nothing to train or score on
            files = ", ".join(str(f) for f in find_files(data_dir, task, split, config.sentiment_dataset))
            why = f"all {len(skipped)} rows were malformed (first: {skipped[0]})" if skipped else "they hold no rows"
            others = [t for t in config.tasks if t != task]
            leave_out = f", or pass --tasks {','.join(others)} to train without {task}" if others else ""
            raise DataError(f"{files}: no usable {task} {split} examples: {why}; fix the file{leave_out}")
        splits[task] = examples[:limit] if limit else examples
    return splits


def load_training_data(config: TrainConfig) -> tuple[dict[str, list], list]:
    """The training splits, and the QA questions held out of them to calibrate the no-answer threshold.

    The held-out articles are taken out before the synthetic negatives are made, so none of those is built from a
    held-out paragraph either.
    """
    splits = load_splits(config, "train", config.limit_per_task)
    if config.sst_phrases:
        skipped: list[str] = []
        phrases = read_sst_phrases(config.sst_phrases, skipped, exclude={e.text for e in splits["sentiment"]})
        phrases = phrases[:config.limit_per_task]
        if skipped:
            log.warning("%s: skipped %d malformed trees (first: %s)", config.sst_phrases, len(skipped), skipped[0])
        log.info("sentiment/train: %d sentences + %d phrases of %s", len(splits["sentiment"]), len(phrases),
                 config.sst_phrases)
        splits["sentiment"] = splits["sentiment"] + phrases
    calibration: list = []
    if "qa" in splits:
        splits["qa"], calibration = hold_out_articles(splits["qa"], config.qa_calibration_articles)
        if calibration:
            log.info("qa/train: %d questions of %s held out to fit the no-answer threshold (%d unanswerable)",
                     len(calibration), sorted({e.title for e in calibration}),
                     sum(e.is_impossible for e in calibration))
        real_unanswerable = [e for e in splits["qa"] if e.is_impossible]
        splits["qa"] = splits["qa"] + _unanswerable_top_up(splits["qa"], config)
        if config.qa_real_unanswerable_repeat > 1 and real_unanswerable:
            splits["qa"] += real_unanswerable * (config.qa_real_unanswerable_repeat - 1)
            log.info("qa/train: each of the %d real unanswerable questions appears %d times",
                     len(real_unanswerable), config.qa_real_unanswerable_repeat)
    return splits, calibration


def _unanswerable_top_up(examples: list, config: TrainConfig) -> list:
    # Only for SQuAD 2.0-style data: a v1.1 model is never asked to abstain.
    if not config.qa_unanswerable_fraction or not any(e.is_impossible for e in examples):
        return []
    made = synthesize_unanswerable(examples, config.qa_unanswerable_fraction, config.seed,
                                   config.qa_unanswerable_style, config.qa_unanswerable_kinds)
    share = (sum(e.is_impossible for e in examples) + len(made)) / max(1, len(examples) + len(made))
    kinds = Counter(e.id.rsplit("-", 1)[-1] for e in made)
    log.info("qa/train: added %d synthetic unanswerable questions, style %s (%d question rewritten, %d "
             "answer-sentence-removed, %d other-paragraph); unanswerable share now %.1f%%", len(made),
             config.qa_unanswerable_style, kinds["question"], kinds["removed"], kinds["other"], 100 * share)
    return made
