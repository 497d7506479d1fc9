"""Attention guidance (AG; paper 003, Deshpande & Narasimhan 2020): an auxiliary MSE loss that pulls chosen
self-attention heads towards fixed, linguistically naive patterns, which speeds up (pre-)training.

Patterns (each a [B, T, T] map: row p = query position p, a distribution over the sequence's real tokens; padding rows
and columns are zero):

- ``first``: all mass on position 0 ([CLS]).
- ``next``: p attends to p + 1; the last real row, which has no next token, is uniform (the paper's P_[Next]).
- ``prev``: p attends to p - 1; the first row, which has no previous token, is uniform.
- ``delim``: mass spread evenly over the [CLS] and [SEP] positions.
- ``period``: mass on the first period token at or after p (a period attends to itself); rows with no period at or
  after them are uniform, as the paper does for the rows of [Next]/[Prev] whose target does not exist. The stored copy
  of the paper lacks appendix A.2 (the formal definition); its main text says only that [Period] "attends to the
  period ('.') token" and, like [Delim], depends on the input.

Heads: in every layer ``round(fraction * heads)`` heads (rounded half up) are guided, the same head index to the same
pattern in every layer (paper section 3.2). Patterns are handed out in order from head 0: each pattern but the last
gets one head and the last fills the remaining guided heads, so the default ("next", "prev", "first") with fraction
1/2 is the paper's best setting (one head each for [Next] and [Prev], lambda * h - 2 heads for [First]).

Loss (paper eq. 2-4): for every guided (layer, head), the mean squared error between its attention map and the pattern,
summed over guided heads and layers (eq. 3), times alpha_t = alpha_0 * (1 - progress) (linear decay to 0). The MSE is
the mean over the n x n entries of each sequence's real block (n = its number of real tokens; padding query rows are
left out, padding key columns count but hold zero on both sides), then averaged over the batch. Why the mean and not
eq. 2's squared Frobenius norm: the paper calls the loss an MSE, chooses alpha_0 in {1, 10, 100} "such that the scales
of the MLM loss and auxiliary loss are comparable", and uses alpha_0 = 100 for its small models, which only fits the
per-entry mean (the authors' code uses torch's MSELoss, a mean over entries, on unpadded blocks of n tokens). Dividing
by each sequence's own n^2 rather than by the padded batch width keeps a sequence's loss independent of how long the
other sequences in its batch are.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger("bertzoo.guidance")

PATTERNS = ("first", "next", "prev", "delim", "period")


@dataclass(frozen=True)
class PatternTokens:
    """The token ids the input-dependent patterns look for."""

    cls_id: int
    sep_id: int
    period_id: int | None  # None: the vocabulary has no single "." token ([Period] then refuses to build)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> PatternTokens:
        # The period's id through the public encoder: "." alone must be one token between [CLS] and [SEP].
        ids = tokenizer.encode_sentences(["."], 3)[0].input_ids[1:-1]
        return cls(tokenizer.cls_id, tokenizer.sep_id, ids[0] if len(ids) == 1 else None)


def _uniform_rows(mask: Tensor) -> Tensor:
    """[B, 1, T]: every row uniform over the real tokens."""
    return (mask / mask.sum(1, keepdim=True).clamp(min=1.0))[:, None, :]


def _rows_real(pattern: Tensor, mask: Tensor) -> Tensor:
    return pattern * mask[:, :, None]


def pattern_first(input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    mask = attention_mask.float()
    pattern = torch.zeros(*input_ids.shape, input_ids.shape[1], device=input_ids.device)
    pattern[:, :, 0] = 1.0
    return _rows_real(pattern, mask)


def _shifted(input_ids: Tensor, attention_mask: Tensor, shift: int) -> Tensor:
    """p attends to p + shift; rows whose target is outside the real tokens are uniform."""
    mask = attention_mask.float()
    t = input_ids.shape[1]
    positions = torch.arange(t, device=input_ids.device)
    one_hot = (positions[None, :] == positions[:, None] + shift).float()  # [T, T]
    target = positions + shift
    lengths = attention_mask.sum(1, keepdim=True)  # [B, 1]; right padding: real tokens are 0 .. n-1
    has_target = (target[None, :] >= 0) & (target[None, :] < lengths)  # [B, T]
    pattern = torch.where(has_target[:, :, None], one_hot[None], _uniform_rows(mask))
    return _rows_real(pattern, mask)


def pattern_next(input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    return _shifted(input_ids, attention_mask, 1)


def pattern_prev(input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    return _shifted(input_ids, attention_mask, -1)


def pattern_delim(input_ids: Tensor, attention_mask: Tensor, delimiter_ids: Sequence[int]) -> Tensor:
    mask = attention_mask.float()
    is_delim = torch.isin(input_ids, torch.tensor(list(delimiter_ids), device=input_ids.device)).float() * mask
    count = is_delim.sum(1, keepdim=True)
    # A sequence without delimiters (not one bertzoo makes) falls back to uniform rows rather than all-zero ones.
    row = torch.where(count > 0, is_delim / count.clamp(min=1.0), mask / mask.sum(1, keepdim=True).clamp(min=1.0))
    return _rows_real(row[:, None, :].expand(-1, input_ids.shape[1], -1).clone(), mask)


def pattern_period(input_ids: Tensor, attention_mask: Tensor, period_id: int) -> Tensor:
    mask = attention_mask.float()
    t = input_ids.shape[1]
    positions = torch.arange(t, device=input_ids.device)
    is_period = (input_ids == period_id) & attention_mask.bool()
    # The first period at or after p: a suffix minimum of the period positions (t where there is none).
    where = torch.where(is_period, positions[None, :], torch.full_like(input_ids, t))
    next_period = where.flip(1).cummin(1).values.flip(1)  # [B, T]
    one_hot = (positions[None, None, :] == next_period[:, :, None]).float()
    pattern = torch.where((next_period < t)[:, :, None], one_hot, _uniform_rows(mask))
    return _rows_real(pattern, mask)


def build_pattern(name: str, input_ids: Tensor, attention_mask: Tensor, tokens: PatternTokens) -> Tensor:
    """The [B, T, T] target map of one pattern for a right-padded batch."""
    if name == "first":
        return pattern_first(input_ids, attention_mask)
    if name == "next":
        return pattern_next(input_ids, attention_mask)
    if name == "prev":
        return pattern_prev(input_ids, attention_mask)
    if name == "delim":
        return pattern_delim(input_ids, attention_mask, (tokens.cls_id, tokens.sep_id))
    if name == "period":
        if tokens.period_id is None:
            raise ValueError("the [Period] pattern needs a tokenizer with a single '.' token")
        return pattern_period(input_ids, attention_mask, tokens.period_id)
    raise ValueError(f"unknown attention pattern {name!r}; choose from {PATTERNS}")


def check_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    patterns = tuple(patterns)
    if not patterns:
        raise ValueError("attention guidance needs at least one pattern")
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown:
        raise ValueError(f"unknown attention pattern(s) {unknown}; choose from {PATTERNS}")
    return patterns


def assign_heads(num_heads: int, fraction: float, patterns: Sequence[str]) -> tuple[str | None, ...]:
    """Each head's pattern (None: not guided), the same in every layer. ``round(fraction * num_heads)`` heads, rounded
    half up, are guided from head 0 on: one head for each pattern but the last, the rest for the last pattern."""
    patterns = check_patterns(patterns)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"the guided fraction must be in [0, 1], got {fraction}")
    guided = min(num_heads, math.floor(fraction * num_heads + 0.5 + 1e-9))
    heads: list[str | None] = [*patterns[:-1], *[patterns[-1]] * max(0, guided - len(patterns) + 1)][:guided]
    return tuple(heads + [None] * (num_heads - guided))


def guidance_loss(attentions: Sequence[Tensor], input_ids: Tensor, attention_mask: Tensor,
                  heads: Sequence[str | None], tokens: PatternTokens) -> Tensor:
    """Unweighted AG loss (see the module docstring): per-sequence mean over the n x n real block, batch mean, summed
    over the guided heads of every layer. ``attentions``: per layer [B, heads, T, T] probabilities."""
    mask = attention_mask.float()
    lengths_sq = mask.sum(1).clamp(min=1.0) ** 2  # [B]
    groups = {name: [h for h, p in enumerate(heads) if p == name] for name in dict.fromkeys(p for p in heads if p)}
    targets = {name: build_pattern(name, input_ids, attention_mask, tokens)[:, None] for name in groups}
    total = attentions[0].new_zeros((), dtype=torch.float32)
    for probs in attentions:
        if probs.shape[1] != len(heads):
            raise ValueError(f"attention maps have {probs.shape[1]} heads, the head assignment {len(heads)}")
        for name, index in groups.items():
            error = (probs[:, index].float() - targets[name]) ** 2 * mask[:, None, :, None]  # real query rows only
            per_sequence = error.sum((2, 3)) / lengths_sq[:, None]  # [B, heads of this pattern]
            total = total + per_sequence.mean(0).sum()
    return total


class AttentionGuidance:
    """The AG objective (trainer/objectives.py protocol): applies to every task's batch, QA included, and to MLM
    pre-training (trainer/pretrain.py), whose encoder input is the masked sequence."""

    name = "attention_guidance"
    needs_attentions = True

    def __init__(self, weight: float, fraction: float, patterns: Sequence[str], tokens: PatternTokens) -> None:
        if weight < 0:
            raise ValueError(f"the attention guidance weight must be >= 0, got {weight}")
        self.weight, self.fraction, self.tokens = weight, fraction, tokens
        self.patterns = check_patterns(patterns)
        if "period" in self.patterns and tokens.period_id is None:
            raise ValueError("the [Period] pattern needs a tokenizer with a single '.' token")
        assign_heads(1, fraction, self.patterns)  # validates the fraction now rather than at the first step
        self._heads: dict[int, tuple[str | None, ...]] = {}

    @classmethod
    def from_config(cls, config, tokenizer) -> AttentionGuidance:
        """From any config with ag_weight, ag_fraction and ag_patterns (TrainConfig, PretrainConfig)."""
        return cls(config.ag_weight, config.ag_fraction, config.ag_patterns, PatternTokens.from_tokenizer(tokenizer))

    def heads(self, num_heads: int) -> tuple[str | None, ...]:
        if num_heads not in self._heads:
            self._heads[num_heads] = assign_heads(num_heads, self.fraction, self.patterns)
            unused = [p for p in self.patterns if p not in self._heads[num_heads]]
            log.info("attention guidance: heads %s (alpha_0 %g, decaying linearly to 0)%s",
                     ", ".join(f"{h}={p}" for h, p in enumerate(self._heads[num_heads]) if p), self.weight,
                     f"; too few guided heads for {unused}" if unused else "")
        return self._heads[num_heads]

    def weight_at(self, progress: float) -> float:
        """alpha_t: alpha_0 decayed linearly to 0 at the end of training (paper eq. 4)."""
        return self.weight * max(0.0, 1.0 - progress)

    def prepare(self, step: int, total_steps: int, model, streams: dict) -> None:
        """Nothing to do between steps: the patterns depend only on the batch."""

    def attention_loss(self, attentions: Sequence[Tensor] | None, input_ids: Tensor, attention_mask: Tensor,
                       progress: float) -> Tensor:
        """alpha_t times the AG loss of one encoder batch."""
        if not attentions:
            raise ValueError("attention guidance needs the encoder's attention maps (output_attentions=True)")
        heads = self.heads(attentions[0].shape[1])
        return self.weight_at(progress) * guidance_loss(attentions, input_ids, attention_mask, heads, self.tokens)

    def loss(self, task: str, indices: np.ndarray, batch: dict[str, Tensor], details, progress: float) -> Tensor:
        return self.attention_loss(details.attentions, batch["input_ids"], batch["attention_mask"], progress)
