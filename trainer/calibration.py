"""The SQuAD 2.0 no-answer threshold, fitted during training on articles held out of the training data.

A QA model answers "no answer" when ``null_score - best span score`` exceeds a threshold. Left at 0, a model trained
on this project's data answers far too often: it abstains on only a minority of the real unanswerable dev questions,
and the thresholds fitted since lie far below 0 (benchmarks/RESULTS.md, "Training recipe and scores"). So ``bertzoo
train`` holds out whole articles of its QA training data, never trains on them, and after each checkpoint's training
fits the threshold on them; the checkpoint stores it (``ModelConfig.qa_null_threshold``), so ``bertzoo eval``,
``predict``, the export and the server all use it.

Held out are the articles with the most *real* unanswerable questions, because synthetic negatives are easier than
the ones SQuAD 2.0's annotators wrote and a threshold fitted on them answers too often. At least one article with
real unanswerable questions stays in training (the model must see some, and the synthetic top-up is keyed on them).
The threshold is fitted for a target unanswerable share (1/2 by default, as in the official dev and test sets), not
for the held-out slice's own share.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from bertzoo.data import QAExample
from bertzoo.qa import best_null_threshold, squad_metrics, with_null_threshold
from bertzoo.tasks import Limits
from bertzoo.tokenization import Tokenizer

from .evaluate import predict_outputs
from .heads import MultitaskModel

log = logging.getLogger("bertzoo.train")


def hold_out_articles(examples: Sequence[QAExample], n_articles: int) -> tuple[list[QAExample], list[QAExample]]:
    """(training questions, held-out questions): the ``n_articles`` articles with the most unanswerable questions.

    Nothing is held out from data without unanswerable questions (SQuAD v1.1: the model never abstains), and the
    last article with unanswerable questions is never held out. Ties go to the article that comes first.
    """
    unanswerable = Counter(e.title for e in examples if e.is_impossible)
    if n_articles <= 0 or not unanswerable:
        return list(examples), []
    ranked = sorted(unanswerable, key=lambda title: -unanswerable[title])  # stable: file order breaks ties
    held = set(ranked[: min(n_articles, len(ranked) - 1)])
    if not held:
        log.warning("qa: only one article has unanswerable questions, so none is held out to calibrate the "
                    "no-answer threshold; it stays at the configured value")
    elif len(held) < n_articles:
        log.warning("qa: qa_calibration_articles is %d, but only %d articles have unanswerable questions and one of "
                    "them must stay in training: %d held out", n_articles, len(ranked), len(held))
    return [e for e in examples if e.title not in held], [e for e in examples if e.title in held]


def calibrate_null_threshold(model: MultitaskModel, examples: Sequence[QAExample], tokenizer: Tokenizer,
                             limits: Limits, unanswerable_share: float | None, progress: bool = False) -> dict:
    """Fit the no-answer threshold on ``examples`` (F1, reweighted to ``unanswerable_share``) and set it on the model.

    Returns what was fitted and the held-out F1 at the old and the new threshold (unweighted, on the held-out
    questions as they are), for the training log.
    """
    was_training = model.training
    try:
        spans = predict_outputs(model, "qa", examples, tokenizer, limits, allow_impossible=False,
                                progress="calibrate qa no-answer threshold" if progress else None)
    finally:
        model.train(was_training)
    by_id = {e.id: s for e, s in zip(examples, spans, strict=True)}
    margins = {i: s.null_score - s.score for i, s in by_id.items()}
    fitted = best_null_threshold({i: s.answer for i, s in by_id.items()}, margins, examples, unanswerable_share)

    def f1_at(threshold: float) -> float:
        return squad_metrics({i: with_null_threshold(s, threshold).answer for i, s in by_id.items()}, examples)["f1"]

    previous, threshold = model.config.qa_null_threshold, fitted["best_f1_threshold"]
    if threshold == float("-inf"):  # abstaining on every held-out question was best: keep it finite for JSON
        threshold = min(margins.values()) - 1.0
    model.config.qa_null_threshold = threshold
    return {"questions": len(examples), "unanswerable": sum(e.is_impossible for e in examples),
            "articles": sorted({e.title for e in examples}), "unanswerable_share": unanswerable_share,
            "threshold": threshold, "previous_threshold": previous,
            "f1_at_previous": f1_at(previous), "f1_at_threshold": f1_at(threshold)}
