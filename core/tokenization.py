"""WordPiece tokenization for sentences, sentence pairs and sliding-window extractive QA.

Torch-free on purpose: the data pipeline, the exporter and the server all tokenize, and none of
them should pay for importing torch.

The wrapped ``tokenizers.Tokenizer`` is always used *without* its own truncation, padding or
post-processor (special tokens are added here). The MiniLM ``tokenizer.json`` ships with
truncation and fixed padding to 128 switched on, which would silently cap every input and break
the offset bookkeeping of QA windows, so both are switched off on load and length control is
done explicitly below.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer as _HFTokenizer

__all__ = ["Encoding", "QAWindow", "Tokenizer", "pad_batch"]


@dataclass(slots=True)  # not frozen: half the cost to make (one per sentence tokenized, and per row an engine reads)
class Encoding:
    """One tokenized sequence. Not changed once made."""

    input_ids: list[int]
    token_type_ids: list[int]


@dataclass(frozen=True)
class QAWindow:
    """One ``[CLS] question [SEP] context_chunk [SEP]`` window of a (question, context) pair.

    ``offsets[i]`` is the ``(start_char, end_char)`` span of token ``i`` in the *original*
    context string for context tokens, and ``None`` for [CLS], question tokens and [SEP]; span
    decoding relies on that ``None`` to never return a piece of the question.

    ``start_position``/``end_position`` are the training targets: inclusive token indices of
    the answer inside this window, or ``0`` ([CLS]) for both when the question is unanswerable
    or the answer is not entirely inside this window.
    """

    input_ids: list[int]
    token_type_ids: list[int]
    offsets: list[tuple[int, int] | None]
    start_position: int = 0
    end_position: int = 0


def _special_id(tok: _HFTokenizer, token: str, path: str) -> int:
    idx = tok.token_to_id(token)
    if idx is None:
        raise ValueError(f"tokenizer {path} has no {token} token; a BERT WordPiece vocabulary is required")
    return idx


# Characters a part of a long text gets per token it must yield (_first_ids). English text averages 4-5 characters a
# token: over their first 126 tokens, 5,000 SQuAD contexts took 4.9 characters a token at the median, 6.2 at the
# 99.9th percentile and 7.05 at most, so a part this long nearly always yields enough and the text is tokenized once
# (a part that falls short, e.g. of text that is mostly whitespace, is tokenized again whole).
_CHARS_PER_TOKEN_CUT = 8


def _truncate_longest_first(n_a: int, n_b: int, budget: int) -> tuple[int, int]:
    """Lengths after removing tokens one by one from the currently longer sequence.

    Closed form of that loop, matching the tie-breaking of HF ``tokenizers``' LongestFirst (so
    pairs are cut exactly as during pretraining/fine-tuning elsewhere): the shorter side (``a``
    on a tie) keeps up to ``budget // 2`` tokens and the other side gets the rest.
    """
    if n_a + n_b <= budget:
        return n_a, n_b
    if n_a > n_b:
        keep_b = min(n_b, budget // 2)
        return budget - keep_b, keep_b
    keep_a = min(n_a, budget // 2)
    return keep_a, budget - keep_a


class Tokenizer:
    """BERT-style WordPiece tokenizer with explicit length control."""

    def __init__(self, tokenizer: _HFTokenizer, source: str = "<in-memory>") -> None:
        # Never trust the serialized length settings; see the module docstring.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer
        self._source = source
        self.pad_id = _special_id(tokenizer, "[PAD]", source)
        self.cls_id = _special_id(tokenizer, "[CLS]", source)
        self.sep_id = _special_id(tokenizer, "[SEP]", source)
        self.mask_id = _special_id(tokenizer, "[MASK]", source)
        self.unk_id = _special_id(tokenizer, "[UNK]", source)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            tok = _HFTokenizer.from_file(path)
        except Exception as exc:  # the Rust side raises a bare Exception for malformed JSON
            raise ValueError(f"invalid tokenizer file {path}: {exc}") from exc
        return cls(tok, source=path)

    @classmethod
    def from_vocab(cls, path: str | os.PathLike[str], lowercase: bool = True) -> Tokenizer:
        """A BERT WordPiece tokenizer built from a ``vocab.txt`` (a backbone directory without tokenizer.json): BERT's
        normalizer (``lowercase`` for an uncased vocabulary) and pre-tokenizer, as transformers' BertTokenizerFast
        builds it."""
        from tokenizers import decoders, models, normalizers, pre_tokenizers

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"vocabulary file not found: {path}")
        tok = _HFTokenizer(models.WordPiece.from_file(path, unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                    lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        return cls(tok, source=path)

    @classmethod
    def from_str(cls, json_str: str) -> Tokenizer:
        """Inverse of :meth:`to_str`, for tokenizers carried inside checkpoints/artifacts."""
        try:
            tok = _HFTokenizer.from_str(json_str)
        except Exception as exc:
            raise ValueError(f"invalid tokenizer JSON: {exc}") from exc
        return cls(tok, source="<json string>")

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary string of each id (for plots and debugging; not a detokenizer)."""
        return [self._tok.id_to_token(int(i)) or "[?]" for i in ids]

    def vocab(self) -> dict[str, int]:
        """Token -> id, special tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    @property
    def lowercase(self) -> bool:
        """Whether the normalizer lowercases text (an uncased vocabulary)."""
        normalizer = json.loads(self._tok.to_str()).get("normalizer") or {}
        return bool(normalizer.get("lowercase", False))

    def to_str(self) -> str:
        # Serialized with truncation/padding off, so a reload behaves identically.
        return self._tok.to_str()

    def __repr__(self) -> str:
        return f"Tokenizer(source={self._source!r}, vocab_size={self.vocab_size})"

    # ------------------------------------------------------------------ helpers

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        # Batched so the Rust side can parallelise; specials are added by the callers. The fast variant skips the
        # character offsets, which only QA's context needs (encode_qa), 15-20% of a sentence's tokenization.
        if isinstance(texts, str):
            raise TypeError("expected a sequence of strings, got a single str")
        return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def _first_ids(self, texts: Sequence[str], count: int) -> list[list[int]]:
        """Each text's first ``count`` token ids (all of them if it has fewer), without tokenizing all of a long
        text: a long text is cut at a space well past ``count`` tokens' worth of characters and the part before it
        tokenized. Words before a space are tokenized alike whatever follows it (normalization is per character,
        pre-tokenization splits at whitespace, WordPiece works per word), so the part's ids begin the whole text's.
        A part that yields fewer than ``count`` ids, or a text with no space to cut at, is tokenized whole."""
        if isinstance(texts, str):
            raise TypeError("expected a sequence of strings, got a single str")
        limit = count * _CHARS_PER_TOKEN_CUT
        parts = []
        for text in texts:
            cut = text.rfind(" ", 0, limit) if len(text) > limit else -1
            parts.append(text[:cut] if cut > 0 else text)
        ids = self._ids(parts)
        short = [i for i, (text, part) in enumerate(zip(texts, parts, strict=True))
                 if part is not text and len(ids[i]) < count]
        for i, whole in zip(short, self._ids([texts[i] for i in short]), strict=True):
            ids[i] = whole
        return [row if len(row) <= count else row[:count] for row in ids]

    @staticmethod
    def _check_max_length(max_length: int, n_special: int, what: str) -> None:
        if max_length < n_special + 1:
            raise ValueError(
                f"max_length={max_length} is too small for {what}: it needs at least {n_special + 1} "
                f"({n_special} special tokens + 1 text token)"
            )

    # ------------------------------------------------------------------ public API

    def encode_sentences(self, texts: Sequence[str], max_length: int) -> list[Encoding]:
        """``[CLS] text [SEP]`` per text, the text truncated so the total is <= ``max_length``."""
        self._check_max_length(max_length, 2, "single sentences")
        budget = max_length - 2
        out = []
        for ids in self._first_ids(texts, budget):
            ids = [self.cls_id, *ids, self.sep_id]
            out.append(Encoding(input_ids=ids, token_type_ids=[0] * len(ids)))
        return out

    def encode_pairs(self, a: Sequence[str], b: Sequence[str], max_length: int) -> list[Encoding]:
        """``[CLS] a [SEP] b [SEP]`` with longest-first truncation; token types 0 for a, 1 for b."""
        if len(a) != len(b):
            raise ValueError(f"encode_pairs needs as many first as second texts, got {len(a)} and {len(b)}")
        self._check_max_length(max_length, 3, "sentence pairs")
        budget = max_length - 3
        # Each side's first budget + 1 ids decide the cut as its whole would (a side that has more than the budget
        # keeps at most the budget), except which side is longer when both have more: those pairs are tokenized whole.
        firsts_a, firsts_b = self._first_ids(a, budget + 1), self._first_ids(b, budget + 1)
        both_long = [i for i, (x, y) in enumerate(zip(firsts_a, firsts_b, strict=True))
                     if len(x) > budget and len(y) > budget]
        if both_long:
            wholes_a, wholes_b = self._ids([a[i] for i in both_long]), self._ids([b[i] for i in both_long])
            for i, whole_a, whole_b in zip(both_long, wholes_a, wholes_b, strict=True):
                firsts_a[i], firsts_b[i] = whole_a, whole_b
        out = []
        for ids_a, ids_b in zip(firsts_a, firsts_b, strict=True):
            n_a, n_b = _truncate_longest_first(len(ids_a), len(ids_b), budget)
            first = [self.cls_id, *ids_a[:n_a], self.sep_id]
            second = [*ids_b[:n_b], self.sep_id]
            out.append(Encoding(input_ids=first + second, token_type_ids=[0] * len(first) + [1] * len(second)))
        return out

    def encode_qa(
        self,
        question: str,
        context: str,
        max_length: int,
        doc_stride: int,
        max_question_tokens: int = 64,
        answer_start: int | None = None,
        answer_text: str | None = None,
    ) -> list[QAWindow]:
        """Split ``context`` into overlapping ``[CLS] q [SEP] chunk [SEP]`` windows.

        ``doc_stride`` is the number of context tokens shared by consecutive windows (the same
        meaning as ``stride`` in HF ``tokenizers``/``transformers``, i.e. the *overlap*, not the
        step); the step is ``context_budget - doc_stride``. Windows are produced left to right
        until the last context token is covered, so every context token is in at least one
        window; the last window may be shorter.

        ``answer_start`` is a character index into ``context`` and the answer spans
        ``len(answer_text)`` characters; leave both ``None`` (or the text empty) for an
        unanswerable question.
        """
        if not context or not context.strip():
            raise ValueError("encode_qa needs a non-empty context")
        if max_question_tokens < 1:
            raise ValueError(f"max_question_tokens must be >= 1, got {max_question_tokens}")
        if doc_stride < 0:
            raise ValueError(f"doc_stride must be >= 0, got {doc_stride}")

        q_ids = self._tok.encode(question, add_special_tokens=False).ids[:max_question_tokens]
        ctx = self._tok.encode(context, add_special_tokens=False)
        ctx_ids, ctx_offsets = ctx.ids, ctx.offsets
        if not ctx_ids:
            raise ValueError("encode_qa: the context produced no tokens")

        n_special = len(q_ids) + 3
        if max_length < n_special + 1:
            raise ValueError(
                f"max_length={max_length} is too small for QA: it needs at least {n_special + 1} "
                f"({len(q_ids)} question tokens + 3 special tokens + 1 context token)"
            )
        budget = max_length - n_special
        if doc_stride >= budget:
            raise ValueError(
                f"doc_stride={doc_stride} must be smaller than the context tokens per window ({budget} = "
                f"max_length {max_length} - question {len(q_ids)} - 3 special tokens), or windows never advance"
            )

        tok_start, tok_end = self._answer_token_span(context, ctx_offsets, answer_start, answer_text)

        prefix_ids = [self.cls_id, *q_ids, self.sep_id]
        prefix_offsets: list[tuple[int, int] | None] = [None] * len(prefix_ids)
        windows = []
        start = 0
        while True:
            end = min(start + budget, len(ctx_ids))
            ids = prefix_ids + ctx_ids[start:end] + [self.sep_id]
            offsets = prefix_offsets + [tuple(o) for o in ctx_offsets[start:end]] + [None]
            types = [0] * len(prefix_ids) + [1] * (end - start + 1)
            if tok_start is not None and tok_end is not None and start <= tok_start and tok_end < end:
                s_pos, e_pos = tok_start - start + len(prefix_ids), tok_end - start + len(prefix_ids)
            else:
                s_pos = e_pos = 0
            windows.append(QAWindow(ids, types, offsets, s_pos, e_pos))
            if end == len(ctx_ids):
                return windows
            start = end - doc_stride

    @staticmethod
    def _answer_token_span(
        context: str,
        offsets: Sequence[tuple[int, int]],
        answer_start: int | None,
        answer_text: str | None,
    ) -> tuple[int | None, int | None]:
        """Inclusive context-token indices covering the answer characters, or ``(None, None)``."""
        if answer_start is None or not answer_text:
            return None, None
        if not 0 <= answer_start < len(context):
            raise ValueError(f"answer_start={answer_start} is outside the context (length {len(context)})")
        answer_end = answer_start + len(answer_text)
        # A token belongs to the answer if its characters overlap the answer's; this handles
        # answers that start/end mid-word (the whole word piece is then taken).
        inside = [i for i, (s, e) in enumerate(offsets) if s < answer_end and e > answer_start]
        if not inside:  # e.g. an answer made only of whitespace or stripped control characters
            return None, None
        return inside[0], inside[-1]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


# From this many rows a batch is padded with whole-array operations: one concatenation and one masked assignment per
# input instead of three slice assignments a row (44 rows of SST sentences: 52 -> 27 us from a hop's arrays, 79 -> 53
# from token lists); below it the row loop is faster.
VECTORIZED_PAD_ROWS = 8


def pad_batch(
    encodings: Sequence[Encoding | QAWindow],
    pad_id: int,
    pad_to_multiple_of: int = 1,
) -> dict[str, np.ndarray]:
    """Right-pad to the longest sequence (rounded up to ``pad_to_multiple_of``) as int64 arrays."""
    if not encodings:
        raise ValueError("pad_batch needs at least one encoding")
    if pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
    lengths = [len(e.input_ids) for e in encodings]
    type_lengths = [len(e.token_type_ids) for e in encodings]
    if type_lengths != lengths:
        row = next(k for k, (n, m) in enumerate(zip(lengths, type_lengths, strict=True)) if n != m)
        raise ValueError(f"encoding {row}: {lengths[row]} input ids but {type_lengths[row]} token type ids")
    width = -(-max(lengths) // pad_to_multiple_of) * pad_to_multiple_of
    rows = len(encodings)
    if rows >= VECTORIZED_PAD_ROWS:
        mask = np.arange(width) < np.array(lengths)[:, None]
        total = sum(lengths)
        input_ids = np.full((rows, width), pad_id, dtype=np.int64)
        input_ids[mask] = _joined([e.input_ids for e in encodings], total)
        token_type_ids = np.zeros((rows, width), dtype=np.int64)
        token_type_ids[mask] = _joined([e.token_type_ids for e in encodings], total)
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": mask.astype(np.int64)}
    input_ids = np.full((rows, width), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((rows, width), dtype=np.int64)
    attention_mask = np.zeros((rows, width), dtype=np.int64)
    for row, (enc, n) in enumerate(zip(encodings, lengths, strict=True)):
        input_ids[row, :n] = enc.input_ids
        token_type_ids[row, :n] = enc.token_type_ids
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def _joined(sequences: list, total: int) -> np.ndarray:
    """Rows of token values end to end: arrays (a hop's views) concatenated, lists (the tokenizer's) read once."""
    if isinstance(sequences[0], np.ndarray):
        return np.concatenate(sequences)
    return np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=total)
