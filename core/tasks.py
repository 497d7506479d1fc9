"""The four tasks, each defined once: labels, official metric, pre-processing (text -> token ids) and
post-processing (head outputs -> answers). Torch-free (numpy), so evaluation and serving call the same functions and a
model scores the same in ``bertzoo eval`` as through the server.

Head outputs, per task (what a backend hands to ``postprocess``):
- sentiment: logits [n, num_labels]
- paraphrase: one logit per pair [n] (probability of "duplicate" = sigmoid)
- similarity: a score per pair [n] on the 0-5 scale (a cosine head can go below 0; clipped to [0, 5] here)
- qa: start and end logits per window, decoded into a text span of the original context
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .data import PairExample, QAExample, SentenceExample
from .qa import SpanPrediction, abstainer_auc, best_null_threshold, decode_span, squad_metrics, with_null_threshold
from .tokenization import Encoding, QAWindow, Tokenizer

TASK_NAMES = ("sentiment", "paraphrase", "similarity", "qa")

SENTIMENT_LABELS = {
    "sst5": ("very negative", "negative", "neutral", "positive", "very positive"),
    "cfimdb": ("negative", "positive"),
    "sst2": ("negative", "positive"),
}


@dataclass(frozen=True)
class TaskSpec:
    name: str
    description: str
    primary_metric: str  # what "best checkpoint" and the benchmark table use
    labels: tuple[str, ...] = field(default=())


def task_spec(name: str, sentiment_dataset: str = "sst5") -> TaskSpec:
    if name == "sentiment":
        if sentiment_dataset not in SENTIMENT_LABELS:
            raise ValueError(f"sentiment dataset must be one of {sorted(SENTIMENT_LABELS)}, got {sentiment_dataset!r}")
        return TaskSpec(name, f"sentence sentiment ({sentiment_dataset})", "accuracy", SENTIMENT_LABELS[sentiment_dataset])
    if name == "paraphrase":
        return TaskSpec(name, "question-pair paraphrase (Quora)", "accuracy", ("not_duplicate", "duplicate"))
    if name == "similarity":
        return TaskSpec(name, "semantic textual similarity, 0-5 (STS-B)", "pearson")
    if name == "qa":
        return TaskSpec(name, "extractive QA with no-answer (SQuAD v1.1/v2.0)", "f1")
    raise ValueError(f"unknown task {name!r}; tasks are {TASK_NAMES}")


# ---------------------------------------------------------------- metrics


def accuracy(predicted: Sequence[int], gold: Sequence[int]) -> float:
    predicted, gold = np.asarray(predicted), np.asarray(gold)
    return float((predicted == gold).mean()) if len(gold) else float("nan")


def binary_f1(predicted: Sequence[int], gold: Sequence[int]) -> float:
    predicted, gold = np.asarray(predicted).astype(bool), np.asarray(gold).astype(bool)
    tp = float((predicted & gold).sum())
    denominator = float(predicted.sum() + gold.sum())
    return 2 * tp / denominator if denominator else 0.0


def pearson(predicted: Sequence[float], gold: Sequence[float]) -> float:
    x, y = np.asarray(predicted, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")  # undefined, and reported as such rather than as 0
    return float(np.corrcoef(x, y)[0, 1])


# ---------------------------------------------------------------- pre-processing


@dataclass(frozen=True)
class Limits:
    """Token limits shared by training, evaluation and serving."""

    max_seq_length: int = 128  # one sentence, [CLS] and [SEP] included
    qa_max_length: int = 384  # one QA window: [CLS] question [SEP] context chunk [SEP]
    qa_doc_stride: int = 128  # overlap between consecutive QA windows, in tokens
    qa_max_question_tokens: int = 64
    qa_max_answer_tokens: int = 30


def encode_sentences(tokenizer: Tokenizer, texts: Sequence[str], limits: Limits) -> list[Encoding]:
    return tokenizer.encode_sentences(texts, limits.max_seq_length)


def encode_pairs_separately(
    tokenizer: Tokenizer, a: Sequence[str], b: Sequence[str], limits: Limits
) -> tuple[list[Encoding], list[Encoding]]:
    """Paraphrase and similarity encode each sentence on its own (as the seed papers do), so one encoder batch can
    mix sentences from every task; the heads combine the two sentence representations."""
    return encode_sentences(tokenizer, a, limits), encode_sentences(tokenizer, b, limits)


def encode_qa(
    tokenizer: Tokenizer, question: str, context: str, limits: Limits, answer_start: int | None = None,
    answer_text: str | None = None,
) -> list[QAWindow]:
    return tokenizer.encode_qa(
        question, context, limits.qa_max_length, limits.qa_doc_stride, limits.qa_max_question_tokens,
        answer_start=answer_start, answer_text=answer_text,
    )


# ---------------------------------------------------------------- post-processing


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


# Each task's answer, with the field names of the RPC's result message (protos/bertzoo/v1/bertzoo.proto): the server
# builds its messages from these, `bertzoo predict --json` prints them, and a test holds the two sets of names equal.
# The QA answer is qa.SpanPrediction.
@dataclass(frozen=True)
class SentimentResult:
    label: str
    label_index: int
    probabilities: tuple[float, ...]


@dataclass(frozen=True)
class ParaphraseResult:
    probability: float
    is_paraphrase: bool  # probability >= 0.5


@dataclass(frozen=True)
class SimilarityResult:
    score: float  # 0 to 5


def postprocess_sentiment(logits: np.ndarray, spec: TaskSpec) -> list[SentimentResult]:
    probs = softmax(logits)
    best = probs.argmax(axis=-1).tolist()  # whole-array numpy calls: a lone request pays each call's overhead once
    return [SentimentResult(spec.labels[b], b, tuple(p)) for b, p in zip(best, probs.tolist(), strict=True)]


def postprocess_paraphrase(logits: np.ndarray) -> np.ndarray:
    """Probability that each pair is a paraphrase; the predicted label is probability >= 0.5."""
    return sigmoid(np.asarray(logits).reshape(-1))


def postprocess_similarity(scores: np.ndarray) -> np.ndarray:
    return np.clip(np.asarray(scores, dtype=np.float64).reshape(-1), 0.0, 5.0)


def answers(task: str, outputs, sentiment_labels: Sequence[str]) -> list:
    """The answer dataclasses of ``pipeline.predict``'s outputs for ``task`` (QA's already are: decoded spans)."""
    if task == "sentiment":
        return postprocess_sentiment(outputs, TaskSpec("sentiment", "", "accuracy", tuple(sentiment_labels)))
    if task == "paraphrase":
        return paraphrase_results(outputs)
    if task == "similarity":
        return similarity_results(outputs)
    return list(outputs)


def paraphrase_results(logits: np.ndarray) -> list[ParaphraseResult]:
    return [ParaphraseResult(float(p), bool(p >= 0.5)) for p in postprocess_paraphrase(logits)]


def similarity_results(scores: np.ndarray) -> list[SimilarityResult]:
    return [SimilarityResult(float(s)) for s in postprocess_similarity(scores)]


def postprocess_qa(
    context: str, windows: Sequence[QAWindow], start_logits: Sequence[np.ndarray], end_logits: Sequence[np.ndarray],
    limits: Limits, allow_impossible: bool = True, null_threshold: float = 0.0,
) -> SpanPrediction:
    return decode_span(
        context, windows, start_logits, end_logits, max_answer_tokens=limits.qa_max_answer_tokens,
        null_threshold=null_threshold, allow_impossible=allow_impossible,
    )


# ---------------------------------------------------------------- scoring a split


def score_sentiment(predicted: Sequence[int], examples: Sequence[SentenceExample]) -> dict[str, float]:
    return {"accuracy": accuracy(predicted, [e.label for e in examples]), "n": float(len(examples))}


def score_paraphrase(probabilities: Sequence[float], examples: Sequence[PairExample]) -> dict[str, float]:
    predicted = (np.asarray(probabilities) >= 0.5).astype(int)
    gold = np.asarray([e.label for e in examples]).astype(int)
    return {"accuracy": accuracy(predicted, gold), "f1": binary_f1(predicted, gold), "n": float(len(examples))}


def score_similarity(scores: Sequence[float], examples: Sequence[PairExample]) -> dict[str, float]:
    return {"pearson": pearson(scores, [e.label for e in examples]), "n": float(len(examples))}


def score_qa(spans: dict[str, SpanPrediction], examples: Sequence[QAExample], null_threshold: float = 0.0
             ) -> dict[str, float]:
    """Official SQuAD EM/F1 (percent) of forced spans (decoded with ``allow_impossible=False``) at the given
    no-answer threshold; for SQuAD 2.0 data also the official best-threshold scores, the abstainer's ROC AUC, the
    answerable questions' F1 when every question is answered (the reader without the abstainer), and the
    always-no-answer baseline on the same questions for context."""
    metrics = squad_metrics({i: with_null_threshold(s, null_threshold).answer for i, s in spans.items()}, examples)
    if any(e.is_impossible for e in examples):
        metrics["null_threshold"] = null_threshold  # the one used above: the checkpoint's, unless overridden
        forced = {i: s.answer for i, s in spans.items()}
        margins = {i: s.null_score - s.score for i, s in spans.items()}
        metrics.update(best_null_threshold(forced, margins, examples))
        metrics["abstain_auc"] = abstainer_auc(margins, examples)
        answerable = [e for e in examples if not e.is_impossible]
        if answerable:
            metrics["HasAns_f1_answering_all"] = squad_metrics(forced, answerable)["f1"]
    metrics["no_answer_baseline_f1"] = 100.0 * float(np.mean([e.is_impossible for e in examples])) if examples else 0.0
    return metrics


# The tasks whose items carry a second text: a pair's second sentence, or a QA item's context.
SECOND_TEXT_TASKS = ("paraphrase", "similarity", "qa")


def text_rows(task_column: Sequence[str], texts_a: Sequence[str], texts_b: Sequence[str] | None,
              tasks: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """Rows of (task, text_a, text_b) from the three columns of the text-in model (the Triton repository's ``bertzoo``
    model and the server's KServe v2 route): TASK once for every row, or once per row; TEXT_B for the tasks that take
    a second text. ValueError names the input that is wrong."""
    if len(task_column) not in (1, len(texts_a)):
        raise ValueError(f"TASK has {len(task_column)} rows and TEXT_A {len(texts_a)}: send one TASK per row")
    column = list(task_column) * len(texts_a) if len(task_column) == 1 else list(task_column)
    for task in set(column):
        if task not in tasks:
            raise ValueError(f"TASK {task!r}: this model serves {', '.join(tasks)}")
        if task in SECOND_TEXT_TASKS and (texts_b is None or len(texts_b) != len(texts_a)):
            raise ValueError(f"TASK {task} needs TEXT_B with one entry per TEXT_A entry")
    seconds = list(texts_b) if texts_b is not None and len(texts_b) == len(texts_a) else [None] * len(texts_a)
    return list(zip(column, texts_a, seconds, strict=True))
