"""Extractive QA: SQuAD span decoding and the official SQuAD v1.1/v2.0 metric.

Torch-free: logits arrive as numpy arrays so the same decoding serves training-time evaluation,
the exported model and the server.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .tokenization import QAWindow

__all__ = [
    "QAExampleLike",
    "SpanPrediction",
    "decode_span",
    "exact_match",
    "f1",
    "normalize_answer",
    "squad_metrics",
]

# ---------------------------------------------------------------------------- metric

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """Official SQuAD normalisation: lower, drop ASCII punctuation, drop a/an/the, squash whitespace.

    The order of steps matters (articles are removed after punctuation, so "the-end" -> "theend"
    keeps its "the") and is kept identical to the official evaluate-v2.0.py.
    """
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Official token-level F1 with v2.0 semantics for empty answers.

    "Empty" is judged after normalisation (as the official script does), so a gold of "the"
    behaves like a no-answer: F1 is 1.0 iff both sides are empty, 0.0 if only one is.
    """
    pred_toks, gold_toks = _tokens(prediction), _tokens(gold)
    if not pred_toks or not gold_toks:
        return float(pred_toks == gold_toks)
    num_same = sum((collections.Counter(pred_toks) & collections.Counter(gold_toks)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_toks)
    recall = num_same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


class QAExampleLike(Protocol):
    """The fields of ``bertzoo.data.QAExample`` the metric needs (kept structural to avoid the import)."""

    @property
    def id(self) -> str: ...

    @property
    def answers(self) -> Sequence[str]: ...

    @property
    def is_impossible(self) -> bool: ...


def _gold_answers(ex: QAExampleLike) -> tuple[bool, list[str]]:
    """(is the question answerable, its gold answers that survive normalisation), as the official script counts."""
    has_answer = not ex.is_impossible and len(ex.answers) > 0
    return has_answer, [a for a in ex.answers if normalize_answer(a)] if has_answer else []


def squad_metrics(predictions: Mapping[str, str], examples: Sequence[QAExampleLike]) -> dict[str, float]:
    """Official SQuAD v2.0 aggregation, in percent.

    Each question scores the max over its gold answers; gold answers that normalise to "" are
    dropped and a question left with none (or marked impossible) has the single gold "". A
    missing prediction counts as "" and is still counted, unlike the official v2.0 script which
    skips it: skipping would inflate scores of a model that silently drops questions.
    As in the official script, a question is HasAns when it has any gold answer (and here is
    not marked impossible), even if all its answers normalise to "". ``HasAns_*``/``NoAns_*``
    appear only when such questions exist. Predictions for unknown ids are ignored.
    """
    em_has: list[float] = []
    f1_has: list[float] = []
    em_no: list[float] = []
    f1_no: list[float] = []
    for ex in examples:
        has_answer, golds = _gold_answers(ex)
        if not golds:
            golds = [""]
        pred = predictions.get(ex.id, "")
        em = max(exact_match(pred, g) for g in golds)
        fs = max(f1(pred, g) for g in golds)
        if has_answer:
            em_has.append(em)
            f1_has.append(fs)
        else:
            em_no.append(em)
            f1_no.append(fs)

    def pct(xs: list[float]) -> float:
        return 100.0 * sum(xs) / len(xs) if xs else 0.0

    out = {
        "exact": pct(em_has + em_no),
        "f1": pct(f1_has + f1_no),
        "total": float(len(em_has) + len(em_no)),
    }
    if em_has:
        out.update(HasAns_exact=pct(em_has), HasAns_f1=pct(f1_has), HasAns_total=float(len(em_has)))
    if em_no:
        out.update(NoAns_exact=pct(em_no), NoAns_f1=pct(f1_no), NoAns_total=float(len(em_no)))
    return out


def best_null_threshold(
    span_texts: Mapping[str, str], null_margins: Mapping[str, float], examples: Sequence[QAExampleLike],
    unanswerable_share: float | None = None,
) -> dict[str, float]:
    """The official SQuAD v2.0 script's ``best_exact``/``best_f1``: the score at the best no-answer threshold.

    ``span_texts`` are forced (non-empty) answers, ``null_margins`` are ``null_score - score`` per question; a
    question is answered "" when its margin is above the threshold. Sweeping the threshold over the sorted margins
    finds the best one, as ``find_best_thresh`` in the official evaluation does. The threshold is fitted on the
    examples it is scored on, so it is an optimistic number: report it next to the fixed-threshold score.

    ``unanswerable_share`` reweights the questions as if that share of them were unanswerable (each class keeps its
    own distribution of margins). The best threshold depends on that share, and a held-out slice of training data
    rarely has the share the model will meet (SQuAD 2.0 train: 1/3 unanswerable; dev and test: 1/2).
    """
    labelled = [(ex, *_gold_answers(ex)) for ex in examples]
    n_no = sum(not has_answer for _, has_answer, _ in labelled)
    n_has = len(labelled) - n_no
    weight_has = weight_no = 1.0
    if unanswerable_share is not None:
        if not 0.0 < unanswerable_share < 1.0:
            raise ValueError(f"unanswerable_share must be in (0, 1), got {unanswerable_share}")
        if n_no and n_has:  # with one class only there is nothing to reweight
            weight_has = (1.0 - unanswerable_share) * len(labelled) / n_has
            weight_no = unanswerable_share * len(labelled) / n_no
    out = {}
    for name, measure in (("exact", exact_match), ("f1", f1)):
        gains = []
        for ex, has_answer, golds in labelled:
            pred = span_texts.get(ex.id, "")
            if has_answer:
                gain = weight_has * max((measure(pred, g) for g in golds), default=0.0)
            else:  # answering an unanswerable question forfeits its point
                gain = weight_no * (float(pred == "") - 1.0)
            gains.append((null_margins.get(ex.id, np.inf), gain))
        # Everything answered "" scores the no-answer questions; answering question q instead adds gains[q].
        current = best = weight_no * n_no
        threshold = float("-inf")
        for margin, gain in sorted(gains, key=lambda g: g[0]):
            current += gain
            if current > best:
                best, threshold = current, margin
        out[f"best_{name}"] = 100.0 * best / len(labelled) if labelled else 0.0
        out[f"best_{name}_threshold"] = threshold
    return out


def abstainer_auc(null_margins: Mapping[str, float], examples: Sequence[QAExampleLike]) -> float:
    """How well ``null_score - score`` ranks the unanswerable questions above the answerable ones, whatever the
    threshold: the ROC AUC (0.5 chance, 1.0 perfect; ties count half), over the questions that have a margin. NaN
    with one class only."""
    labelled = [(null_margins[ex.id], bool(ex.is_impossible)) for ex in examples if ex.id in null_margins]
    n_no = sum(unanswerable for _, unanswerable in labelled)
    n_has = len(labelled) - n_no
    if not n_no or not n_has:
        return float("nan")
    margins = np.array([m for m, _ in labelled], dtype=np.float64)
    _, inverse, counts = np.unique(margins, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based; tied margins share their mean rank
    ranks = average_rank[inverse]
    rank_sum = float(ranks[[unanswerable for _, unanswerable in labelled]].sum())
    return (rank_sum - n_no * (n_no + 1) / 2.0) / (n_no * n_has)


# ---------------------------------------------------------------------------- span decoding


@dataclass(frozen=True)
class SpanPrediction:
    """Best answer span over all windows of one (question, context): the QA task's answer, with the field names of the
    RPC's ``QAResult`` message.

    ``answer == context[start_char:end_char]``; a no-answer has ``answer == ""`` and ``-1, -1``.
    ``score`` is the best span's ``start_logit + end_logit`` (kept even when no-answer wins, so
    thresholds can be tuned later) and ``null_score`` the [CLS] ``start + end`` score.
    """

    answer: str
    start_char: int
    end_char: int
    score: float
    null_score: float
    no_answer: bool


def _top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest finite values, best first (stable for ties)."""
    finite = np.flatnonzero(np.isfinite(values))
    if finite.size > k:
        # argpartition keeps this O(T) before sorting only k elements.
        finite = finite[np.argpartition(-values[finite], k - 1)[:k]]
    return finite[np.lexsort((finite, -values[finite]))]


def _best_in_window(
    start: np.ndarray, end: np.ndarray, max_answer_tokens: int, n_best: int
) -> tuple[float, int, int] | None:
    """Best valid (score, start, end) among the top-n starts x top-n ends, or None.

    ``start``/``end`` have -inf at non-context positions, so those can never be picked.
    """
    starts, ends = _top_k(start, n_best), _top_k(end, n_best)
    if starts.size == 0 or ends.size == 0:
        return None
    scores = start[starts][:, None] + end[ends][None, :]
    length = ends[None, :] - starts[:, None] + 1
    scores = np.where((length >= 1) & (length <= max_answer_tokens), scores, -np.inf)
    flat = int(np.argmax(scores))
    i, j = divmod(flat, scores.shape[1])
    if not np.isfinite(scores[i, j]):
        return None
    return float(scores[i, j]), int(starts[i]), int(ends[j])


def decode_span(
    context: str,
    windows: Sequence[QAWindow],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    max_answer_tokens: int = 30,
    n_best: int = 20,
    null_threshold: float = 0.0,
    allow_impossible: bool = True,
) -> SpanPrediction:
    """Pick the best answer span for ``context`` from per-window start/end logits.

    Logit arrays may be longer than their window (batch padding); positions past the window are
    ignored. Only spans of context tokens (``offsets[i] is not None``) with ``start <= end`` and
    at most ``max_answer_tokens`` tokens are considered, searched among the ``n_best`` best
    starts x ``n_best`` best ends of each window.

    The null score is the minimum over windows of the [CLS] start+end score, as in Google's BERT
    SQuAD 2.0 code: the window that sees the answer best is the one least sure there is none.
    No-answer is returned when ``allow_impossible`` and ``null_score - score > null_threshold``.
    """
    if not windows:
        raise ValueError("decode_span needs at least one window")
    if len(start_logits) != len(windows) or len(end_logits) != len(windows):
        raise ValueError(
            f"got {len(windows)} windows but {len(start_logits)} start and {len(end_logits)} end logit arrays"
        )
    if max_answer_tokens < 1 or n_best < 1:
        raise ValueError(f"max_answer_tokens and n_best must be >= 1, got {max_answer_tokens} and {n_best}")

    null_score = np.inf
    best: tuple[float, int, int, int] | None = None  # (score, window, start token, end token)
    for w, (win, s_raw, e_raw) in enumerate(zip(windows, start_logits, end_logits, strict=True)):
        n = len(win.input_ids)
        s = np.asarray(s_raw, dtype=np.float64).reshape(-1)
        e = np.asarray(e_raw, dtype=np.float64).reshape(-1)
        if s.size < n or e.size < n:
            raise ValueError(f"window {w} has {n} tokens but {s.size} start / {e.size} end logits")
        s, e = s[:n], e[:n]
        null_score = min(null_score, float(s[0] + e[0]))

        is_context = np.fromiter((o is not None for o in win.offsets), dtype=bool, count=n)
        found = _best_in_window(
            np.where(is_context, s, -np.inf), np.where(is_context, e, -np.inf), max_answer_tokens, n_best
        )
        if found is None and is_context.any():
            # Every top start lies after every top end: fall back to the best one-token span,
            # which is always valid, so a forced answer (allow_impossible=False) always exists.
            single = np.where(is_context, s + e, -np.inf)
            k = int(np.argmax(single))
            found = (float(single[k]), k, k)
        if found is not None and (best is None or found[0] > best[0]):
            best = (found[0], w, found[1], found[2])

    if best is None:
        raise ValueError("no window contains any context token")
    score, w, i, j = best
    start_off, end_off = windows[w].offsets[i], windows[w].offsets[j]
    assert start_off is not None and end_off is not None  # guaranteed by the context mask
    start_char, end_char = start_off[0], end_off[1]
    if end_char > len(context):
        raise ValueError(
            f"window offsets reach character {end_char} but the context has {len(context)}; "
            "were the windows built from a different context?"
        )
    span = SpanPrediction(context[start_char:end_char], start_char, end_char, score, null_score, False)
    return with_null_threshold(span, null_threshold) if allow_impossible else span


def with_null_threshold(span: SpanPrediction, null_threshold: float = 0.0) -> SpanPrediction:
    """The final answer for a forced span: no-answer when the null score beats the span by more than the threshold."""
    if span.null_score - span.score > null_threshold:
        return SpanPrediction("", -1, -1, span.score, span.null_score, True)
    return span
