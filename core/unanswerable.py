"""Synthetic unanswerable questions for SQuAD 2.0-style training.

Why: a SQuAD 2.0 model learns when to abstain only from unanswerable training examples, and the train data a user
has may hold far fewer of them than the data it is judged on (the shared SQuAD train pieces: 6%; the official v2.0
train: 33%; the CS224N dev half: 52%). A model trained on 6% almost never abstains. We top the unanswerable share up
with negatives built from answerable questions. Two change the context and are label-safe (the gold answer text
no longer occurs in it):

- ``removed``: the same paragraph with the sentence(s) holding the answer deleted. The topic, entities and nearby
  plausible-but-wrong spans stay.
- ``other``: another paragraph of the same article (same topic, different facts).

Those two teach a model to notice a missing answer, not SQuAD 2.0's adversarial questions, which keep the paragraph
and its plausible answer and change the *question* (Rajpurkar et al. 2018, table 2: entity swap 21%, antonym 20%,
negation 9%, ...). So the third kind, ``question``, rewrites the question the same ways, by rule:

- entity swap: a name or number in the question becomes one of the same shape that the paragraph never mentions
  (label-safe: the question now asks about something the paragraph does not talk about);
- antonym: one word becomes its opposite from a short list (first/last, largest/smallest, before/after, ...);
- negation: ``not`` after the question's auxiliary verb ("What did X win" -> "What did X not win").

Antonym and negation rewrites are unanswerable by SQuAD 2.0's own annotation guidelines, not by construction; a
few of them may still have an answer, which is label noise we accept.

Two styles (``NEGATIVE_STYLES``). ``far``, as above, makes negatives that share few words with their paragraph: a
swapped-in name the paragraph never mentions, a random other paragraph. Real SQuAD 2.0 unanswerable questions share
about as many words with their paragraph as answerable ones do, so ``far`` also offers a shortcut (few shared words:
no answer) that mostly does not hold on them. ``close`` keeps the overlap: the entity swap takes another name or
number of the same shape from the paragraph itself (falling back to ``far``'s swap when it has none), and ``other``
takes the paragraph of the article that shares the most words with the question. A swap within the paragraph can
now and then still have an answer: label noise again. Measured, ``close`` taught the abstainer less than ``far``
(benchmarks/RESULTS.md, "Training recipe and scores"), so ``far`` is the default.

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


# Capitalised words that start a run without naming anything ("The", "In", question words).
_NOT_NAMES = frozenset("""a an the in on at of for to by from with as and or but if when while after before during
this that these those it its he she they his her their there here however also although since because what which who
whom whose where why how i""".split())
# No apostrophes inside a name, so a possessive "'s" stays outside the span and survives a swap.
_NAME_RUN = re.compile(r"\b[A-Z][\w-]*(?:\s+(?:of\s+|the\s+|de\s+)?[A-Z][\w-]*)*")
_NUMBER = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
_ANTONYMS = dict(pair for a, b in (
    ("first", "last"), ("largest", "smallest"), ("biggest", "smallest"), ("most", "least"), ("highest", "lowest"),
    ("before", "after"), ("earliest", "latest"), ("oldest", "newest"), ("longest", "shortest"), ("best", "worst"),
    ("more", "less"), ("larger", "smaller"), ("higher", "lower"), ("increase", "decrease"), ("increased", "decreased"),
    ("north", "south"), ("east", "west"), ("northern", "southern"), ("eastern", "western"), ("won", "lost"),
    ("began", "ended"), ("start", "end"), ("maximum", "minimum"), ("major", "minor"), ("early", "late"),
    ("above", "below"), ("inside", "outside"), ("public", "private"), ("rise", "fall"), ("allowed", "forbidden"),
    ("positive", "negative"), ("strong", "weak"), ("success", "failure"), ("accepted", "rejected"),
) for pair in ((a, b), (b, a)))
# Contracted, so the question stays grammatical whatever follows the verb ("What did X win" -> "What didn't X win").
_NEGATIONS = {"is": "isn't", "are": "aren't", "was": "wasn't", "were": "weren't", "did": "didn't", "does": "doesn't",
              "do": "don't", "can": "can't", "could": "couldn't", "will": "won't", "would": "wouldn't",
              "has": "hasn't", "have": "haven't", "had": "hadn't", "should": "shouldn't"}
_AUXILIARY = re.compile(r"\b(" + "|".join(_NEGATIONS) + r")\b(?=\s+\w)", re.IGNORECASE)
_NEGATED = re.compile(r"\b(not|never|no)\b|n't\b", re.IGNORECASE)


def _names(text: str) -> list[tuple[int, int]]:
    """Spans of capitalised-word runs that look like names. A sentence-initial word is capitalised whatever it is,
    so it (like a leading function word: "The Seine") is dropped from the run, keeping the rest."""
    found = []
    for m in _NAME_RUN.finditer(text):
        start, end = m.span()
        before = text[:start].rstrip()
        if not before or before[-1] in ".!?\"'(:;" or m.group(0).split()[0].lower() in _NOT_NAMES:
            rest = _NAME_RUN.search(text, start + len(m.group(0).split()[0]), end)
            if rest is None or rest.group(0).split()[0].lower() in _NOT_NAMES:
                continue
            start = rest.start()
        found.append((start, end))
    return found


def names_and_numbers(text: str) -> list[tuple[int, int]]:
    return [*_names(text), *(m.span() for m in _NUMBER.finditer(text))]


def _shape(span: str) -> tuple[str, int]:
    return ("number", len(span)) if span[0].isdigit() else ("name", len(span.split()))


EntityPool = dict[tuple[str, int], list[str]]


def entity_pool(contexts: Sequence[str]) -> EntityPool:
    """Names and numbers found in ``contexts``, grouped by shape (kind, words or digits) for like-for-like swaps."""
    pool: dict[tuple[str, int], set[str]] = {}
    for context in contexts:
        for start, end in names_and_numbers(context):
            pool.setdefault(_shape(context[start:end]), set()).add(context[start:end])
    return {shape: sorted(values) for shape, values in pool.items()}


def swap_entity(question: str, context: str, pools: Sequence[EntityPool], rng: random.Random) -> str | None:
    """The question with one name or number replaced by one of the same shape that ``context`` never mentions.

    ``pools`` are tried in order: the article's own names first (a related name is the hard, plausible kind)."""
    spans = names_and_numbers(question)
    rng.shuffle(spans)
    normalized_context = f" {normalize_answer(context)} "
    for start, end in spans:
        for pool in pools:
            options = pool.get(_shape(question[start:end]), [])
            for other in rng.sample(options, min(10, len(options))):
                if other != question[start:end] and f" {normalize_answer(other)} " not in normalized_context:
                    return question[:start] + other + question[end:]
    return None


def swap_entity_within(question: str, context: str, rng: random.Random) -> str | None:
    """The question with one name or number replaced by another of the same shape from ``context`` itself, one the
    question does not already name (a plausible, related entity, as in SQuAD 2.0's own entity swaps)."""
    spans = names_and_numbers(question)
    rng.shuffle(spans)
    pool = entity_pool([context])
    normalized_question = f" {normalize_answer(question)} "
    for start, end in spans:
        options = [other for other in pool.get(_shape(question[start:end]), [])
                   if f" {normalize_answer(other)} " not in normalized_question]
        if options:
            return question[:start] + rng.choice(options) + question[end:]
    return None


def swap_antonym(question: str, rng: random.Random) -> str | None:
    """The question with one word from the antonym list replaced by its opposite (case kept)."""
    words = [m for m in re.finditer(r"[A-Za-z]+", question) if m.group(0).lower() in _ANTONYMS]
    if not words:
        return None
    m = rng.choice(words)
    opposite = _ANTONYMS[m.group(0).lower()]
    opposite = opposite.capitalize() if m.group(0)[0].isupper() else opposite
    return question[:m.start()] + opposite + question[m.end():]


def is_negated(question: str) -> bool:
    return _NEGATED.search(question) is not None


def negate(question: str) -> str | None:
    """The question's first auxiliary verb negated, unless the question is negated already."""
    m = _AUXILIARY.search(question)
    if m is None or is_negated(question):
        return None
    negated = _NEGATIONS[m.group(1).lower()]
    negated = negated.capitalize() if m.group(1)[0].isupper() else negated
    return question[:m.start()] + negated + question[m.end():]


def perturb_question(example: QAExample, pools: Sequence[EntityPool], rng: random.Random,
                     style: str = "far") -> str | None:
    """One SQuAD 2.0-style rewrite of the question, or None."""
    def entity() -> str | None:
        within = swap_entity_within(example.question, example.context, rng) if style == "close" else None
        return within or swap_entity(example.question, example.context, pools, rng)

    # Entity swap twice as likely as antonym or negation.
    rewrites = [entity] * 2 + [lambda: swap_antonym(example.question, rng), lambda: negate(example.question)]
    rng.shuffle(rewrites)
    for rewrite in rewrites:
        question = rewrite()
        if question is not None and question != example.question:
            return question
    return None


def _as_unanswerable(example: QAExample, kind: str, context: str | None = None,
                     question: str | None = None) -> QAExample:
    return QAExample(id=f"{example.id}-noans-{kind}", question=question or example.question,
                     context=context or example.context, answers=(), answer_starts=(), is_impossible=True,
                     title=example.title)


def needed_unanswerable(n_total: int, n_unanswerable: int, fraction: float) -> int:
    """How many negatives to add so that unanswerable questions make up ``fraction`` of the result."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"unanswerable fraction must be in [0, 1), got {fraction}")
    return max(0, math.ceil((fraction * n_total - n_unanswerable) / (1.0 - fraction)))


NEGATIVE_STYLES = ("far", "close")


def words_of(text: str) -> frozenset[str]:
    """The text's words as SQuAD's answer normalization leaves them (lower case, no punctuation or articles)."""
    return frozenset(normalize_answer(text).split())


def _other_paragraph(example: QAExample, article: Sequence[str], words: dict[str, frozenset[str]] | None,
                     rng: random.Random) -> str | None:
    """Another paragraph of the example's article that does not hold its answer: a random one (``far``, no ``words``;
    None when the draw holds the answer) or, given each paragraph's ``words`` (``close``), the one sharing the most
    words with the question (the first on a tie)."""
    if words is None:
        others = [p for p in article if p != example.context]
        context = rng.choice(others) if others else None
        return None if context is None or _mentions_an_answer(context, example.answers) else context
    question = words_of(example.question)
    by_overlap = sorted((p for p in article if p != example.context), key=lambda p: -len(question & words[p]))
    return next((p for p in by_overlap if not _mentions_an_answer(p, example.answers)), None)


NEGATIVE_KINDS = ("question", "removed", "other")
# Half of the negatives rewrite the question (the kind SQuAD 2.0 is made of), a quarter each change the context.
DEFAULT_KIND_CYCLE = ("question", "removed", "question", "other")


def synthesize_unanswerable(examples: Sequence[QAExample], fraction: float, seed: int = 0, style: str = "far",
                            kinds: Sequence[str] = DEFAULT_KIND_CYCLE) -> list[QAExample]:
    """New unanswerable examples so that they and the given unanswerable ones make up about ``fraction`` of all, in
    one of ``NEGATIVE_STYLES`` (see the module's docstring).

    Kinds follow the cycle ``kinds`` (of ``NEGATIVE_KINDS``); when an example cannot give the planned kind the next
    ones of the cycle are tried. An answerable question is used at most once. Returns fewer than asked for when the
    data runs out of negatives.
    """
    if style not in NEGATIVE_STYLES:
        raise ValueError(f"synthetic negatives' style must be one of {NEGATIVE_STYLES}, got {style!r}")
    if not kinds or set(kinds) - set(NEGATIVE_KINDS):
        raise ValueError(f"synthetic negatives' kinds must be some of {NEGATIVE_KINDS}, got {list(kinds)}")
    wanted = needed_unanswerable(len(examples), sum(e.is_impossible for e in examples), fraction)
    if wanted == 0:
        return []
    paragraphs: dict[str, list[str]] = {}
    for e in examples:
        same_article = paragraphs.setdefault(e.title, [])
        if e.context not in same_article:
            same_article.append(e.context)
    article_pools = {title: entity_pool(article) for title, article in paragraphs.items()}
    all_pool = entity_pool([p for article in paragraphs.values() for p in article])
    words = {p: words_of(p) for article in paragraphs.values() for p in article} if style == "close" else None
    rng = random.Random(seed)
    candidates = [e for e in examples if not e.is_impossible]
    rng.shuffle(candidates)
    made: list[QAExample] = []
    for e in candidates:
        if len(made) >= wanted:
            break
        first = len(made) % len(kinds)
        for kind in [*kinds[first:], *kinds[:first]]:
            if kind == "question":
                question = perturb_question(e, (article_pools[e.title], all_pool), rng, style)
                if question is not None:
                    made.append(_as_unanswerable(e, kind, question=question))
                    break
                continue
            if kind == "removed":
                context = remove_answer_sentences(e)
            else:
                context = _other_paragraph(e, paragraphs[e.title], words, rng)
            if context is not None:
                made.append(_as_unanswerable(e, kind, context=context))
                break
    return made
