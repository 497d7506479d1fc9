"""Synthetic unanswerable questions for SQuAD 2.0-style training.

Why: a SQuAD 2.0 model learns when to abstain only from unanswerable training examples, and the train data a user
has may hold far fewer of them than the data it is judged on (the shared SQuAD train pieces: 6%; the official v2.0
train: 33%; the CS224N dev half: 52%). A model trained on 6% almost never abstains. We top the unanswerable share up
with two kinds of negatives built from answerable questions, both well known from the reading-comprehension
literature and both label-safe (the gold answer text no longer occurs in the context):

- ``removed``: the same paragraph with the sentence(s) holding the answer deleted. The topic, entities and nearby
  plausible-but-wrong spans stay, which is what SQuAD 2.0's adversarially written questions look like.
- ``other``: another paragraph of the same article (same topic, different facts).

Torch-free and deterministic for a seed, so a resumed run rebuilds exactly the same training set.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence

from .data import QAExample
from .qa import normalize_answer

# A sentence ends at . ! or ? (optionally followed by a closing quote or bracket) before whitespace. Crude, but a
# boundary it misses only makes the removed piece longer, which keeps the negative label-safe.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the sentences of ``text`` (whitespace between them excluded)."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        end = m.start() + len(m.group(0).rstrip())
        if end > start:
            spans.append((start, end))
        start = m.end()
    if start < len(text) and text[start:].strip():
        spans.append((start, len(text)))
    return spans


def _mentions_an_answer(context: str, answers: Sequence[str]) -> bool:
    normalized = f" {normalize_answer(context)} "
    return any(f" {normalize_answer(a)} " in normalized for a in answers if normalize_answer(a))


def remove_answer_sentences(example: QAExample) -> str | None:
    """The context without the sentences that overlap any gold answer, or None when that leaves nothing or the
    answer text still occurs elsewhere in what is left."""
    answer_spans = [(s, s + len(a)) for a, s in zip(example.answers, example.answer_starts, strict=True)]
    kept = [(s, e) for s, e in sentence_spans(example.context)
            if not any(s < a_end and a_start < e for a_start, a_end in answer_spans)]
    if not kept:
        return None
    context = " ".join(example.context[s:e] for s, e in kept)
    return None if _mentions_an_answer(context, example.answers) else context


def _as_unanswerable(example: QAExample, context: str, kind: str) -> QAExample:
    return QAExample(id=f"{example.id}-noans-{kind}", question=example.question, context=context, answers=(),
                     answer_starts=(), is_impossible=True, title=example.title)


def needed_unanswerable(n_total: int, n_unanswerable: int, fraction: float) -> int:
    """How many negatives to add so that unanswerable questions make up ``fraction`` of the result."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"unanswerable fraction must be in [0, 1), got {fraction}")
    return max(0, math.ceil((fraction * n_total - n_unanswerable) / (1.0 - fraction)))


def synthesize_unanswerable(examples: Sequence[QAExample], fraction: float, seed: int = 0) -> list[QAExample]:
    """New unanswerable examples so that they and the given unanswerable ones make up about ``fraction`` of all.

    Kinds alternate (answer sentence removed, other paragraph of the same article); an answerable question is used
    at most once. Returns fewer than asked for when the data runs out of label-safe negatives.
    """
    wanted = needed_unanswerable(len(examples), sum(e.is_impossible for e in examples), fraction)
    if wanted == 0:
        return []
    paragraphs: dict[str, list[str]] = {}
    for e in examples:
        same_article = paragraphs.setdefault(e.title, [])
        if e.context not in same_article:
            same_article.append(e.context)
    rng = random.Random(seed)
    candidates = [e for e in examples if not e.is_impossible]
    rng.shuffle(candidates)
    made: list[QAExample] = []
    for e in candidates:
        if len(made) >= wanted:
            break
        kinds = ("removed", "other") if len(made) % 2 == 0 else ("other", "removed")
        for kind in kinds:
            if kind == "removed":
                context = remove_answer_sentences(e)
            else:
                others = [p for p in paragraphs.get(e.title, []) if p != e.context]
                context = rng.choice(others) if others else None
                if context is not None and _mentions_an_answer(context, e.answers):
                    context = None
            if context is not None:
                made.append(_as_unanswerable(e, context, kind))
                break
    return made
