"""The serving core of each RPC: validate the items, tokenize them (a short request on the event loop, a long one on a
tokenizer thread), send them through the batcher, and post-process the model outputs.

Tokenization and post-processing are ``bertzoo.tasks``' functions, the ones evaluation uses through
``bertzoo.pipeline.predict``, so the server answers exactly what ``bertzoo eval`` scores. Transport-agnostic: bad input
raises :class:`~bertzoo.serving.errors.InvalidRequest` whose message names the field as the API does
(``texts[3]``, ``pairs[0].text_b``, ``items[2].question``) and the limit it broke.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from bertzoo import tasks as T
from bertzoo.qa import SpanPrediction
from bertzoo.tokenization import Encoding

from .config import ServeConfig
from .engine import EMBED, Work, encoder_tokens, join_windows, split_windows
from .errors import InvalidRequest
from .lanes import Lanes
from .metrics import Metrics

NO_TOKEN_LIMIT = 1 << 30  # tokenizing with this "limit" counts a text's tokens before any truncation
# A request of at most this many characters is tokenized on the event loop: tens of microseconds in the Rust
# tokenizer, less than handing it to the tokenizer thread and back costs. Longer ones (QA contexts, many texts) go
# to the thread, so the loop keeps accepting and refusing requests meanwhile.
INLINE_TOKENIZE_CHARS = 2048


@dataclass(frozen=True)
class Timing:
    """Seconds; see Timing in protos/bertzoo/v1/bertzoo.proto."""

    queue: float
    tokenize: float
    inference: float
    total: float
    tokens: int = 0  # the encoder tokens the request ran (every sequence, every QA window): OpenAI's usage counts them


class TaskService:
    def __init__(self, lanes: Lanes, config: ServeConfig, metrics: Metrics) -> None:
        """Requests over ``config.long_request_tokens`` go to ``lanes.long``, the rest to ``lanes.main``."""
        self.spec = lanes.spec
        self._tokenizer = lanes.tokenizer
        self._batcher = lanes.main
        self._long_lane = lanes.long
        self._config = config
        self._metrics = metrics
        self._sentiment = T.TaskSpec("sentiment", "sentence sentiment", "accuracy", lanes.spec.labels["sentiment"])
        self._pool = ThreadPoolExecutor(config.tokenize_threads, thread_name_prefix="bertzoo-tokenize")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ RPCs

    async def sentiment(self, texts: Sequence[str], timeout: float | None) -> tuple[list[T.SentimentResult], Timing]:
        self._require("sentiment")
        self._check_texts("texts", texts)
        outputs, _, timing = await self._run("sentiment", lambda: self._sentence_works("sentiment", "texts", texts),
                                             timeout, sum(map(len, texts)))
        return T.postprocess_sentiment(np.stack(outputs), self._sentiment), timing

    async def paraphrase(self, pairs: Sequence[tuple[str, str]], timeout: float | None
                         ) -> tuple[list[T.ParaphraseResult], Timing]:
        """The probability that each pair is a paraphrase."""
        outputs, timing = await self._pairs("paraphrase", pairs, timeout)
        return T.paraphrase_results(np.asarray(outputs)), timing

    async def similarity(self, pairs: Sequence[tuple[str, str]], timeout: float | None
                         ) -> tuple[list[T.SimilarityResult], Timing]:
        """A 0-5 similarity score per pair."""
        outputs, timing = await self._pairs("similarity", pairs, timeout)
        return T.similarity_results(np.asarray(outputs)), timing

    async def qa(self, items: Sequence[tuple[str, str]], timeout: float | None) -> tuple[list[SpanPrediction], Timing]:
        """(question, context) items -> the best span of each context, or no-answer."""
        self._require("qa")
        self._check_count("items", len(items))
        for i, (question, context) in enumerate(items):
            if not question.strip():
                raise InvalidRequest(f"items[{i}].question is empty; a QA item needs a question and a context",
                                     reason="missing_question")
            self._check_text(f"items[{i}].question", question)
            self._check_text(f"items[{i}].context", context)
        outputs, works, timing = await self._run("qa", lambda: self._qa_works(items), timeout)
        limits, threshold = self.spec.limits, self.spec.qa_null_threshold
        spans = [T.postprocess_qa(context, work.rows, starts, ends, limits, allow_impossible=True,
                                  null_threshold=threshold)
                 for (_, context), work, (starts, ends) in zip(items, works, outputs, strict=True)]
        return spans, timing

    async def embed(self, texts: Sequence[str], timeout: float | None) -> tuple[np.ndarray, Timing]:
        """L2-normalised sentence embeddings [n, hidden]."""
        self._check_texts("texts", texts)
        outputs, _, timing = await self._run(EMBED, lambda: self._sentence_works(EMBED, "texts", texts), timeout,
                                             sum(map(len, texts)))
        return np.stack(outputs), timing

    # ------------------------------------------------------------------ the shared path

    async def _pairs(self, task: str, pairs: Sequence[tuple[str, str]], timeout: float | None
                     ) -> tuple[list, Timing]:
        self._require(task)
        self._check_count("pairs", len(pairs))
        for i, (a, b) in enumerate(pairs):
            self._check_text(f"pairs[{i}].text_a", a)
            self._check_text(f"pairs[{i}].text_b", b)
        outputs, _, timing = await self._run(task, lambda: self._pair_works(task, pairs), timeout,
                                             sum(len(a) + len(b) for a, b in pairs))
        return outputs, timing

    async def _run(self, task: str, build: Callable[[], list[Work]], timeout: float | None,
                   chars: int | None = None) -> tuple[list, list[Work], Timing]:
        """Tokenize (``build``), queue, wait for the outputs; one output per work. ``chars``: the request's text
        length, which decides where it is tokenized (None: on the tokenizer thread)."""
        started = time.perf_counter()
        self._batcher.check_room()  # a full queue refuses at once, before any tokenizing
        if chars is not None and chars <= INLINE_TOKENIZE_CHARS:
            works = build()
        else:
            works = await asyncio.get_running_loop().run_in_executor(self._pool, build)
        tokenized = time.perf_counter()
        cost, limit = encoder_tokens(works), self._config.max_request_tokens
        if cost > limit:
            raise InvalidRequest(f"this request is {cost} encoder tokens (QA contexts count once per window of "
                                 f"{self.spec.limits.qa_max_length}), the limit is {limit} per request "
                                 "(max_request_tokens); send fewer or shorter items", reason="request_too_costly")
        timeout = None if timeout is None else timeout - (tokenized - started)
        if cost > self._config.long_request_tokens:
            pieces, counts = split_windows(works)
            job = self._long_lane.submit(pieces, timeout)
            outputs = join_windows(await job.future, counts)
        else:
            job = self._batcher.submit(works, timeout)
            outputs = await job.future
        assert job.first_start is not None and job.last_end is not None  # set for every delivered job
        timing = Timing(queue=job.first_start - job.submitted, tokenize=tokenized - started,
                        inference=job.last_end - job.first_start, total=time.perf_counter() - started, tokens=cost)
        self._metrics.tokenize_seconds.labels(task).observe(timing.tokenize)
        self._metrics.queue_seconds.labels(task).observe(timing.queue)
        self._metrics.inference_seconds.labels(task).observe(timing.inference)
        return outputs, works, timing

    # ------------------------------------------------------------------ validation and tokenization

    def _require(self, task: str) -> None:
        if task not in self.spec.tasks:
            raise InvalidRequest(f"this model has no {task!r} head; it serves {', '.join(self.spec.tasks)} "
                                 "(and Embed)", reason="unknown_task")

    def _check_count(self, field: str, n: int) -> None:
        limit = self._config.max_items
        if n == 0:
            raise InvalidRequest(f"{field}: no items; send 1 to {limit}", reason="no_items")
        if n > limit:
            raise InvalidRequest(f"{field}: {n} items, the limit is {limit} per request (max_items)",
                                 reason="too_many_items")

    def _check_text(self, field: str, text: str) -> None:
        if not text.strip():
            raise InvalidRequest(f"{field} is empty", reason="empty_text")
        limit = self._config.max_text_chars
        if len(text) > limit:
            raise InvalidRequest(f"{field} has {len(text)} characters, the limit is {limit} (max_text_chars)",
                                 reason="text_too_long")

    def _check_texts(self, field: str, texts: Sequence[str]) -> None:
        self._check_count(field, len(texts))
        for i, text in enumerate(texts):
            self._check_text(f"{field}[{i}]", text)

    def _encode(self, fields: Sequence[str], texts: Sequence[str]) -> list[Encoding]:
        """``bertzoo.tasks.encode_sentences``; with ``--overlong reject``, first refuse any text over the limit."""
        limits = self.spec.limits
        if self._config.overlong == "truncate":
            return T.encode_sentences(self._tokenizer, texts, limits)
        # Untruncated, a text within the limit encodes exactly as encode_sentences would encode it.
        encodings = self._tokenizer.encode_sentences(texts, NO_TOKEN_LIMIT)
        for field, encoding in zip(fields, encodings, strict=True):
            if len(encoding.input_ids) > limits.max_seq_length:
                raise InvalidRequest(
                    f"{field} has {len(encoding.input_ids)} tokens, the limit is {limits.max_seq_length} ([CLS] and "
                    "[SEP] included; this server rejects overlong texts instead of truncating them)",
                    reason="too_many_tokens")
        return encodings

    def _sentence_works(self, task: str, field: str, texts: Sequence[str]) -> list[Work]:
        encodings = self._encode([f"{field}[{i}]" for i in range(len(texts))], texts)
        return [Work(task, (e,)) for e in encodings]

    def _pair_works(self, task: str, pairs: Sequence[tuple[str, str]]) -> list[Work]:
        # Each sentence on its own (bertzoo.tasks.encode_pairs_separately), the pair's two in one encoder pass.
        a = self._encode([f"pairs[{i}].text_a" for i in range(len(pairs))], [p[0] for p in pairs])
        b = self._encode([f"pairs[{i}].text_b" for i in range(len(pairs))], [p[1] for p in pairs])
        return [Work(task, (x, y)) for x, y in zip(a, b, strict=True)]

    def _qa_works(self, items: Sequence[tuple[str, str]]) -> list[Work]:
        limits = self.spec.limits
        works = []
        for i, (question, context) in enumerate(items):
            if self._config.overlong == "reject":
                n = len(self._tokenizer.encode_sentences([question], NO_TOKEN_LIMIT)[0].input_ids) - 2
                if n > limits.qa_max_question_tokens:
                    raise InvalidRequest(f"items[{i}].question has {n} tokens, the limit is "
                                         f"{limits.qa_max_question_tokens} (qa_max_question_tokens)",
                                         reason="too_many_tokens")
            try:
                windows = T.encode_qa(self._tokenizer, question, context, limits)
            except ValueError as e:  # e.g. a context of characters the tokenizer drops
                raise InvalidRequest(f"items[{i}]: {e}", reason="untokenizable") from e
            works.append(Work("qa", tuple(windows)))
        return works
