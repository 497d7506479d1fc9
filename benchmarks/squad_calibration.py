"""SQuAD 2.0 no-answer threshold: fixed at 0, the checkpoint's own, and calibrated on dev articles (two-fold).

    python -m benchmarks.squad_calibration CHECKPOINT --data ../shared/data

The checkpoint's own threshold is the one ``bertzoo train`` fitted on training articles it held out
(trainer/calibration.py), so it never saw a dev question; its margin over always-no-answer comes with 95% bootstrap
intervals, resampling questions and, more conservatively, whole articles (questions of one article are correlated).

The official script's ``best_f1`` fits the threshold on the questions it scores, so it is optimistic. Here the dev
questions are split by article into two halves (first / second half of the articles, in file order); each half is
scored with the threshold fitted on the *other* half, and the two are combined into one F1 over the whole dev set in
which no question's threshold saw that question. The model runs once over the dev set (forced spans and each
question's null margin, ``null_score - best span score``); everything else is arithmetic on those.

``--held-out-spread N`` also measures how precisely the held-out training article(s) place the threshold: the model
runs over the questions ``bertzoo train`` held out (the same articles, by the same rule), the threshold is refitted
the way training fits it on N bootstrap resamples of those questions, and the dev F1 at each refitted threshold is
reported as percentiles.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from benchmarks.common.timing import machine
from bertzoo import pipeline
from bertzoo.datafiles import load_split
from bertzoo.qa import SpanPrediction, abstainer_auc, best_null_threshold, squad_metrics, with_null_threshold
from bertzoo.serving.backends import create_backend
from bertzoo.tokenization import Tokenizer
from bertzoo.trainer.calibration import hold_out_articles
from bertzoo.trainer.checkpoint import TOKENIZER, load_model
from bertzoo.trainer.config import TrainConfig


def answers_at(threshold: float, predictions: dict[str, SpanPrediction], ids) -> dict[str, str]:
    """Each question's answer at ``threshold``, by the same rule ``bertzoo eval`` and the server apply."""
    return {i: with_null_threshold(predictions[i], threshold).answer for i in ids}


def spans_and_margins(examples, predictions: list[SpanPrediction]) -> tuple[dict[str, str], dict[str, float]]:
    """Each question's forced span and its null margin (``null_score - score``), by id: what a threshold fit takes."""
    pairs = list(zip(examples, predictions, strict=True))
    return {e.id: p.answer for e, p in pairs}, {e.id: p.null_score - p.score for e, p in pairs}


def per_question_f1(answers: dict[str, str], examples) -> np.ndarray:
    return np.array([squad_metrics({e.id: answers[e.id]}, [e])["f1"] for e in examples])


def bootstrap_gap(gaps: np.ndarray, groups: list[str], rounds: int = 2000, seed: int = 0) -> dict[str, list[float]]:
    """95% intervals of the mean per-question gap, resampling questions and resampling whole groups (articles)."""
    rng = np.random.default_rng(seed)
    by_question = [gaps[rng.integers(0, len(gaps), len(gaps))].mean() for _ in range(rounds)]
    names = sorted(set(groups))
    members = {g: np.flatnonzero(np.array(groups) == g) for g in names}
    by_article = []
    for _ in range(rounds):
        picked = np.concatenate([members[names[i]] for i in rng.integers(0, len(names), len(names))])
        by_article.append(gaps[picked].mean())
    return {"questions_95": [float(np.percentile(by_question, q)) for q in (2.5, 97.5)],
            "articles_95": [float(np.percentile(by_article, q)) for q in (2.5, 97.5)]}


def answerability(examples, margins: dict[str, float], forced: dict[str, float], answered_f1: np.ndarray,
                   has_answer_floor: float = 50.0) -> dict:
    """The two halves of the SQuAD 2.0 score, apart: the reader (answerable questions, always answered) and the
    abstainer (how well the null margin ranks unanswerable above answerable questions: ROC AUC, 0.5 for chance),
    the F1 the reader would reach with a perfect abstainer, and the best F1 of any threshold that keeps HasAns F1 at
    ``has_answer_floor`` or more (fitted on these questions, so optimistic). ``answered_f1``: each question's F1
    when answered with its forced span."""
    impossible = np.array([e.is_impossible for e in examples])
    margin = np.array([margins[e.id] for e in examples])
    n1 = int(impossible.sum())
    n2 = len(examples) - n1
    auc = abstainer_auc(margins, examples)
    reader_f1 = forced["HasAns_f1"]
    # Every threshold at once: answer the questions whose margin is at most it (the rule of with_null_threshold).
    order = np.argsort(margin, kind="stable")
    abstained = impossible * 100.0  # a question's F1 when abstaining
    f1 = (abstained.sum() + np.concatenate([[0.0], np.cumsum((answered_f1 - abstained)[order])])) / len(examples)
    has_answer = np.concatenate([[0.0], np.cumsum(np.where(impossible, 0.0, answered_f1)[order])]) / max(n2, 1)
    # A threshold answers all questions of one margin or none: cuts between two equal margins are no threshold's.
    reachable = np.concatenate([[True], margin[order][:-1] < margin[order][1:], [True]])
    allowed = np.flatnonzero((has_answer >= has_answer_floor) & reachable)
    best = int(allowed[np.argmax(f1[allowed])]) if len(allowed) else None
    return {"reader_HasAns_f1_always_answering": reader_f1, "reader_HasAns_exact_always_answering": forced["HasAns_exact"],
            "null_margin_roc_auc": float(auc),
            "f1_with_a_perfect_abstainer": (n2 * reader_f1 + n1 * 100.0) / (n1 + n2),
            f"best_f1_with_HasAns_f1_at_least_{has_answer_floor:g}": None if best is None else {
                "f1": float(f1[best]), "HasAns_f1": float(has_answer[best]), "answered": best}}


def held_out_spread(model, train_config: TrainConfig, data: str, tokenizer: Tokenizer, dev_examples,
                    dev_predictions: dict[str, SpanPrediction], rounds: int, seed: int = 0) -> dict:
    """The threshold refitted on ``rounds`` bootstrap resamples of the held-out training questions, and the dev F1 at
    each: percentiles (2.5, 50, 97.5) of both."""
    _, held = hold_out_articles(load_split(data, "qa", "train"), train_config.qa_calibration_articles)
    if not held:
        return {"error": "no training article was held out (no unanswerable questions, or calibration off)"}
    predictions = pipeline.predict(create_backend("torch", model), "qa", held, tokenizer, train_config.limits,
                                   allow_impossible=False)
    spans, margins = spans_and_margins(held, predictions)
    share = train_config.qa_calibration_share
    rng = np.random.default_rng(seed)
    thresholds, dev_f1 = [], []
    dev_ids = [e.id for e in dev_examples]
    for _ in range(rounds):
        sample = [held[i] for i in rng.integers(0, len(held), len(held))]
        fitted = best_null_threshold(spans, margins, sample, share)["best_f1_threshold"]
        thresholds.append(fitted)
        dev_f1.append(squad_metrics(answers_at(fitted, dev_predictions, dev_ids), dev_examples)["f1"])
    full = best_null_threshold(spans, margins, held, share)["best_f1_threshold"]
    percentiles = (2.5, 50.0, 97.5)
    return {"articles": sorted({e.title for e in held}), "questions": len(held),
            "unanswerable": sum(e.is_impossible for e in held), "rounds": rounds, "threshold_on_all": full,
            "threshold_percentiles": [float(np.percentile(thresholds, q)) for q in percentiles],
            "dev_f1_percentiles": [float(np.percentile(dev_f1, q)) for q in percentiles]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--data", required=True)
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--held-out-spread", type=int, default=0, metavar="N",
                        help="refit the threshold on N bootstrap resamples of the held-out training questions")
    args = parser.parse_args()
    model, config, directory = load_model(args.checkpoint)
    model.eval()
    train_config = TrainConfig.from_dict(config["train"])
    limits = train_config.limits
    tokenizer = Tokenizer.from_file(directory / TOKENIZER)
    examples = load_split(args.data, "qa", "dev")
    started = time.perf_counter()
    predictions = pipeline.predict(create_backend("torch", model), "qa", examples, tokenizer, limits, allow_impossible=False)
    print(f"{len(examples)} dev questions predicted in {time.perf_counter() - started:.0f} s")
    by_id = {e.id: p for e, p in zip(examples, predictions, strict=True)}
    spans, margins = spans_and_margins(examples, predictions)

    titles = list(dict.fromkeys(e.title for e in examples))
    first = set(titles[: len(titles) // 2])
    folds = {"A": [e for e in examples if e.title in first], "B": [e for e in examples if e.title not in first]}
    report: dict = {"articles": {"A": len(first), "B": len(titles) - len(first)}}
    combined: dict[str, str] = {}
    for name, other in (("A", "B"), ("B", "A")):
        fitted = best_null_threshold(spans, margins, folds[other])["best_f1_threshold"]
        scored = folds[name]
        answers = answers_at(fitted, by_id, [e.id for e in scored])
        combined.update(answers)
        report[name] = {
            "questions": len(scored), "unanswerable": sum(e.is_impossible for e in scored),
            "threshold_fitted_on_other_half": fitted,
            "f1_at_fitted": squad_metrics(answers, scored)["f1"],
            "f1_at_0": squad_metrics(answers_at(0.0, by_id, [e.id for e in scored]), scored)["f1"],
            "f1_always_no_answer": squad_metrics({e.id: "" for e in scored}, scored)["f1"],
        }
    stored = model.config.qa_null_threshold
    at_stored = answers_at(stored, by_id, by_id)
    gaps = per_question_f1(at_stored, examples) - per_question_f1({e.id: "" for e in examples}, examples)
    report["checkpoint_threshold"] = {
        "threshold": stored, **squad_metrics(at_stored, examples),
        "articles_beating_no_answer": int(sum(
            gaps[[i for i, e in enumerate(examples) if e.title == t]].mean() > 0 for t in titles)),
        "articles": len(titles),
        "gap_to_no_answer_f1": float(gaps.mean()), **bootstrap_gap(gaps, [e.title for e in examples]),
    }
    report["all"] = {
        "f1_at_0": squad_metrics(answers_at(0.0, by_id, by_id), examples),
        "f1_cross_fitted": squad_metrics(combined, examples),
        "f1_always_no_answer": squad_metrics({e.id: "" for e in examples}, examples)["f1"],
        "best_f1_fitted_on_itself": best_null_threshold(spans, margins, examples),
    }
    forced = answers_at(float("inf"), by_id, by_id)
    report["answerability"] = answerability(examples, margins, squad_metrics(forced, examples),
                                            per_question_f1(forced, examples))
    if args.held_out_spread:
        report["held_out_spread"] = held_out_spread(model, train_config, args.data, tokenizer, examples, by_id,
                                                    args.held_out_spread)
    report["machine"] = machine()
    print(json.dumps(report, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
