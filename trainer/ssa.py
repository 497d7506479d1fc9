"""Self-supervised attention (SSA; paper 000, after Chen, Kou, Bai and Tong 2020, arXiv 2004.03808).

The method, in rounds:
1. fine-tune as usual (phase 0);
2. probe the model: for every training sentence, mask each real token in turn; a token is important (weak label 1)
   when masking it changes the predicted class, else 0;
3. fine-tune again with those labels as extra supervision of the sentiment head's token scores;
4. repeat 2-3 ``ssa_rounds`` times. Training is split into ``ssa_rounds + 1`` equal phases of the total steps.

Pieces:
- ``SSASentimentHead`` (sentiment_head = "ssa"): an extra attention layer over the encoder's top token states. With
  ``ssa_mode`` "attention" (Chen et al.'s SSA-Layer) a small additive-attention MLP scores each token, a masked softmax
  over the real tokens turns the scores into weights, and the weighted sum of the states feeds the classifier. With
  "classifier" (their SSA-Joint) the head pools as the baseline does and an auxiliary token classifier on the top
  layer is trained on the labels; "both" is their hybrid (attention layer and token classifier, each supervised).
- ``probe``: the labels, many masked variants per forward pass.
- ``SelfSupervisedAttention``: the Objective (trainer/objectives.py) that probes at phase starts and adds the loss.

The loss is binary cross-entropy between the head's per-token scores (the pre-softmax attention scores and/or the
token classifier's logits) and the 0/1 labels, over the probed positions only. Why BCE and not a KL divergence towards
the labels normalised to a distribution: the labels are independent per-token yes/no answers, as in the paper, and a
sentence where no single mask flips the prediction (common: all-zero labels) has no distribution to normalise to,
while BCE still says "none of these tokens is decisive on its own". Since the softmax only sees score differences,
pushing labelled tokens' scores up and the others' down is exactly what concentrates the attention on them.

Resume: labels live in memory only. A run resumed inside phase k >= 1 re-probes the current model at its first step
(so the labels come from the resumed weights, not the ones at the phase start; a slightly later view of the model).
Under DDP every rank probes the same fixed subset with the same weights, so all ranks hold identical labels.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertzoo.pipeline import progress_bar
from bertzoo.tokenization import pad_batch

from .batches import Feature
from .model_config import ForwardDetails, pool
from .sparsegen import masked_softmax

log = logging.getLogger("bertzoo.ssa")

SSA_MODES = ("attention", "classifier", "both")
# The report keys the loss reads, per supervised part of the head.
SCORES, ATTENTION, TOKEN_LOGITS = "token_scores", "token_attention", "token_logits"


class SSASentimentHead(nn.Module):
    """Sentiment logits [B, labels] from token states [B, T, H] and mask [B, T], like the baseline SentimentHead."""

    reports_details = True  # MultitaskModel passes ``report`` during training; export and serving do not

    def __init__(self, hidden: int, num_labels: int, dropout: float, mode: str = "attention",
                 pooling: str = "mean") -> None:
        super().__init__()
        if mode not in SSA_MODES:
            raise ValueError(f"ssa mode must be one of {SSA_MODES}, got {mode!r}")
        self.mode, self.pooling = mode, pooling
        # Additive (Bahdanau-style) scoring: a one-hidden-layer MLP per token, so the score can depend on the token's
        # context-aware state non-linearly; a single learned query vector would be a linear probe of the state.
        self.scorer = (nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
                       if mode in ("attention", "both") else None)
        self.token_classifier = nn.Linear(hidden, 1) if mode in ("classifier", "both") else None
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, states: Tensor, mask: Tensor, report: dict | None = None) -> Tensor:
        if self.scorer is not None:
            scores = self.scorer(states).squeeze(-1)
            # Softmax in fp32 (bf16 autocast would round small weights to 0); padding gets exactly 0 weight, so the
            # output does not depend on how much padding the batch carries.
            attention = masked_softmax(scores.float(), mask.bool())
            pooled = (attention.to(states.dtype).unsqueeze(-1) * states).sum(1)
        else:
            pooled = pool(states, mask, self.pooling)
        logits = self.classifier(self.dropout(pooled))
        if report is not None:
            if self.scorer is not None:
                report[SCORES], report[ATTENTION] = scores, attention
            if self.token_classifier is not None:
                report[TOKEN_LOGITS] = self.token_classifier(states).squeeze(-1)
        return logits


# ---------------------------------------------------------------------------------------------------------- probing


@dataclass
class ProbeStats:
    sentences: int
    variants: int  # masked copies, one per probed token
    forwards: int  # model calls, unmasked originals included
    important: int  # variants whose prediction changed
    seconds: float


def probe(model: nn.Module, features: Sequence[Feature], mask_id: int, special_ids: Sequence[int], pad_id: int = 0,
          batch_size: int = 256, task: str = "sentiment", progress: bool = False
          ) -> tuple[list[np.ndarray], ProbeStats]:
    """Weak token labels for single-sentence ``features``: one int8 array per feature, aligned with its input ids,
    1 where replacing that token with ``mask_id`` changes the model's predicted class, 0 elsewhere (specials too).

    ``model(task, batch)`` must return logits [B, labels]; it runs in eval mode without gradients (its training
    mode is restored). Variants are built with numpy from one padded id matrix and sent ``batch_size`` at a time,
    ordered by sentence length so each batch is cut to its own longest sentence.
    """
    started = time.perf_counter()
    padded = pad_batch([f.encodings[0] for f in features], pad_id)
    ids, types, attention = padded["input_ids"], padded["token_type_ids"], padded["attention_mask"]
    lengths = attention.sum(1)
    probed = attention.astype(bool) & ~np.isin(ids, np.asarray(list(special_ids), dtype=ids.dtype))
    order = np.argsort(lengths, kind="stable")
    # Every (sentence, position) to mask, grouped by sentence in length order (np.nonzero is row-major).
    rows, positions = np.nonzero(probed[order])
    sentences = order[rows]
    device = next(model.parameters()).device
    forwards = 0

    def predict(which: np.ndarray, masked_at: np.ndarray | None = None) -> np.ndarray:
        nonlocal forwards
        width = int(lengths[which].max())
        batch_ids = ids[which, :width]  # fancy indexing copies, so masking below never touches ``ids``
        if masked_at is not None:
            batch_ids[np.arange(len(which)), masked_at] = mask_id
        batch = {"input_ids": batch_ids, "attention_mask": attention[which, :width],
                 "token_type_ids": types[which, :width]}
        forwards += 1
        logits = model(task, {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in batch.items()})
        return logits.argmax(-1).cpu().numpy()

    was_training = model.training
    model.eval()  # no dropout: a label must reflect the mask, not a dropout draw
    bar = progress_bar("ssa probing" if progress else None, len(order) + len(sentences))
    try:
        with torch.no_grad():
            original = np.empty(len(features), dtype=np.int64)
            for start in range(0, len(order), batch_size):
                chunk = order[start:start + batch_size]
                original[chunk] = predict(chunk)
                bar.update(len(chunk))
            changed = np.zeros(len(sentences), dtype=bool)
            for start in range(0, len(sentences), batch_size):
                stop = start + batch_size
                chunk = sentences[start:stop]
                changed[start:stop] = predict(chunk, positions[start:stop]) != original[chunk]
                bar.update(len(chunk))
    finally:
        bar.close()
        model.train(was_training)
    labels = np.zeros(ids.shape, dtype=np.int8)
    labels[sentences, positions] = changed
    stats = ProbeStats(len(features), len(sentences), forwards, int(changed.sum()), time.perf_counter() - started)
    return [labels[i, :lengths[i]] for i in range(len(features))], stats


# --------------------------------------------------------------------------------------------------------- objective


class SelfSupervisedAttention:
    """The SSA Objective: probe at the start of each phase k >= 1, then a BCE loss on the head's token scores."""

    name = "ssa"
    needs_attentions = False  # it reads the SSA head's report, not the encoder's attention maps

    def __init__(self, rounds: int, weight: float, mask_id: int, special_ids: Sequence[int], pad_id: int = 0,
                 probe_limit: int | None = None, probe_batch_size: int = 256, seed: int = 0,
                 progress: bool = False) -> None:
        if rounds < 1:
            raise ValueError(f"SSA needs at least one round, got {rounds}")
        if probe_batch_size < 1:
            raise ValueError(f"ssa_probe_batch_size must be >= 1, got {probe_batch_size}")
        self.rounds, self.weight, self.mask_id, self.pad_id = rounds, weight, mask_id, pad_id
        self.special_ids = tuple(int(i) for i in special_ids)
        self.probe_limit, self.probe_batch_size, self.seed = probe_limit, probe_batch_size, seed
        self.progress = progress
        self.labels: dict[int, np.ndarray] = {}  # sentiment feature index -> its token labels (current round)
        self.phase_probed: int | None = None  # None until this process has probed (a fresh or resumed run)
        self.history: list[tuple[int, int, ProbeStats]] = []  # (phase, step, stats) per probing round

    @classmethod
    def from_config(cls, config, tokenizer) -> SelfSupervisedAttention:
        if "sentiment" not in config.tasks:
            raise ValueError("ssa_rounds > 0 needs the sentiment task: SSA probes and supervises sentiment only")
        if config.sentiment_head != "ssa":
            raise ValueError(f"ssa_rounds > 0 needs sentiment_head='ssa' (its token scores are what SSA supervises), "
                             f"got {config.sentiment_head!r}")
        specials = (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id)
        return cls(config.ssa_rounds, config.ssa_weight, tokenizer.mask_id, specials, tokenizer.pad_id,
                   config.ssa_probe_limit, config.ssa_probe_batch_size, config.seed, config.progress)

    def phase(self, step: int, total_steps: int) -> int:
        """0 for plain fine-tuning, k for the k-th SSA round: rounds + 1 equal shares of the steps."""
        return min(self.rounds, step * (self.rounds + 1) // max(total_steps, 1))

    def probe_subset(self, n: int) -> np.ndarray:
        """The sentences probed every round: fixed and seeded, so rounds compare like with like (and a resumed run
        probes the same ones)."""
        if self.probe_limit is None or self.probe_limit >= n:
            return np.arange(n)
        rng = np.random.default_rng([self.seed, 0x55A])
        return np.sort(rng.choice(n, size=self.probe_limit, replace=False))

    def prepare(self, step: int, total_steps: int, model: nn.Module, streams: dict) -> None:
        phase = self.phase(step, total_steps)
        if phase == 0 or phase == self.phase_probed:
            return
        features = streams["sentiment"].features
        subset = self.probe_subset(len(features))
        labels, stats = probe(model, [features[i] for i in subset], self.mask_id, self.special_ids, self.pad_id,
                              self.probe_batch_size, progress=self.progress)
        self.labels = dict(zip(subset.tolist(), labels, strict=True))
        self.phase_probed = phase
        self.history.append((phase, step, stats))
        log.info("ssa round %d/%d at step %d: probed %d sentences (%d masked variants, %d forward passes, %.1fs); "
                 "%d tokens labelled important (%.1f%%)", phase, self.rounds, step, stats.sentences, stats.variants,
                 stats.forwards, stats.seconds, stats.important, 100 * stats.important / max(stats.variants, 1))

    def loss(self, task: str, indices: np.ndarray, batch: dict[str, Tensor], details: ForwardDetails,
             progress: float) -> Tensor | None:
        if task != "sentiment" or not self.labels:
            return None
        rows = [r for r, i in enumerate(indices.tolist()) if i in self.labels]
        if not rows:
            return None
        ids = batch["input_ids"][rows]
        target = torch.zeros(ids.shape, dtype=torch.float32)
        for r, i in enumerate(indices[rows].tolist()):
            target[r, :len(self.labels[i])] = torch.from_numpy(self.labels[i].astype(np.float32))
        target = target.to(ids.device)
        # Only positions that were probed carry evidence; specials and padding were never masked.
        specials = torch.tensor(self.special_ids, device=ids.device)
        probed = batch["attention_mask"][rows].bool() & ~torch.isin(ids, specials)
        if not probed.any():
            return None
        return self.weight * token_label_loss(details.head, rows, target, probed)


def token_label_loss(report: dict[str, Tensor], rows: list[int], target: Tensor, probed: Tensor) -> Tensor:
    """BCE between each supervised score in the head's report (attention scores, token logits) and the labels; the
    hybrid mode sums both."""
    parts = [report[key][rows].float()[probed] for key in (SCORES, TOKEN_LOGITS) if key in report]
    if not parts:
        raise RuntimeError("the sentiment head reported no token scores: SSA needs sentiment_head='ssa'")
    labels = target[probed]
    return sum(F.binary_cross_entropy_with_logits(p, labels) for p in parts)
