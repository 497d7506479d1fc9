"""Task heads and the multitask model: one shared encoder, one small head per task.

The head interface is deliberately small so the zoo can add heads (task-specific attention, cross-attention, attention
pooling) without touching the trainer:
- a sentence head maps token states + mask [B, T, H], [B, T] to an output per sentence;
- a pair head maps the two sentences' token states + masks to an output per pair;
- the QA head maps token states to start/end logits per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import Encoder
from .model_config import ForwardDetails, ModelConfig, pool


class SentimentHead(nn.Module):
    def __init__(self, hidden: int, num_labels: int, pooling: str, dropout: float) -> None:
        super().__init__()
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, states: Tensor, mask: Tensor) -> Tensor:
        return self.classifier(self.dropout(pool(states, mask, self.pooling)))


class ParaphraseHead(nn.Module):
    """[u; v; |u - v|] -> one logit (Sentence-BERT's classification objective)."""

    def __init__(self, hidden: int, pooling: str, dropout: float) -> None:
        super().__init__()
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(3 * hidden, 1)

    def forward(self, states_a: Tensor, mask_a: Tensor, states_b: Tensor, mask_b: Tensor) -> Tensor:
        u, v = pool(states_a, mask_a, self.pooling), pool(states_b, mask_b, self.pooling)
        return self.classifier(self.dropout(torch.cat([u, v, (u - v).abs()], dim=-1))).squeeze(-1)


class SimilarityHead(nn.Module):
    """A 0-5 score: 5 * cos(u, v) (Sentence-BERT's cosine objective; negative values are clipped to 0 in
    post-processing, not here, so they still get a gradient), or 5 * sigmoid(linear([u; v; |u - v|]))."""

    def __init__(self, hidden: int, pooling: str, kind: str, dropout: float) -> None:
        super().__init__()
        self.pooling = pooling
        self.kind = kind
        self.dropout = nn.Dropout(dropout)
        self.regressor = nn.Linear(3 * hidden, 1) if kind == "concat" else None

    def forward(self, states_a: Tensor, mask_a: Tensor, states_b: Tensor, mask_b: Tensor) -> Tensor:
        u, v = pool(states_a, mask_a, self.pooling), pool(states_b, mask_b, self.pooling)
        if self.regressor is None:
            return 5.0 * F.cosine_similarity(u, v, dim=-1)
        features = self.dropout(torch.cat([u, v, (u - v).abs()], dim=-1))
        return 5.0 * torch.sigmoid(self.regressor(features).squeeze(-1))


class QAHead(nn.Module):
    """Start/end logits per token; the [CLS] position (index 0) stands for "no answer"."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qa_outputs = nn.Linear(hidden, 2)

    def forward(self, states: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.qa_outputs(states).float()
        logits = logits.masked_fill(~mask.bool().unsqueeze(-1), torch.finfo(logits.dtype).min)
        return logits[..., 0], logits[..., 1]


def build_head(task: str, config: ModelConfig) -> nn.Module:
    """One task's head as the config names it. Every head keeps the small interface in this module's docstring, so
    export (one graph per head) and serving take zoo heads unchanged."""
    hidden, drop = config.encoder.hidden_size, config.head_dropout
    if task == "sentiment" and config.sentiment_head == "linear":
        return SentimentHead(hidden, config.sentiment_num_labels, config.pooling, drop)
    if task == "paraphrase" and config.paraphrase_head == "concat":
        return ParaphraseHead(hidden, config.pooling, drop)
    if task == "similarity" and config.similarity_head in ("concat", "cosine"):
        return SimilarityHead(hidden, config.pooling, config.similarity_head, drop)
    if task == "qa":
        return QAHead(hidden)
    from .zoo_heads import build_zoo_head  # the attention-variant heads of the zoo

    return build_zoo_head(task, config)


class MultitaskModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config.encoder)
        self.heads = nn.ModuleDict({task: build_head(task, config) for task in config.tasks})

    # Run the encoder on packed tokens (Encoder's ``pack``): set by the trainer from TrainConfig.pack_tokens.
    pack_tokens = False

    def encode(self, batch: dict[str, Tensor]) -> Tensor:
        return self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                            pack=self.pack_tokens).last_hidden_state

    def forward(self, task: str, batch: dict[str, Tensor], details: bool = False, output_attentions: bool = False
                ) -> Tensor | tuple[Tensor, Tensor] | ForwardDetails:
        """Head outputs for one task's batch (see bertzoo.tasks for what each task returns), or with ``details`` a
        ForwardDetails that also carries the encoder's attention maps (``output_attentions``) and the head's report.

        Pair tasks carry both sentences in one encoder batch (first half a, second half b) so they share one pass.
        """
        if task not in self.heads:
            raise ValueError(f"this model has no {task!r} head; it was trained for {list(self.heads)}")
        encoded = self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                               output_attentions=output_attentions, pack=self.pack_tokens)
        states, mask = encoded.last_hidden_state, batch["attention_mask"]
        head, report = self.heads[task], {}
        # Only heads that declare ``reports_details`` take the dict; export and serving call heads without it.
        extra = {"report": report} if details and getattr(head, "reports_details", False) else {}
        if task in ("paraphrase", "similarity"):
            n = states.shape[0] // 2
            outputs = head(states[:n], mask[:n], states[n:], mask[n:], **extra)
        else:
            outputs = head(states, mask, **extra)
        return ForwardDetails(outputs, encoded.attentions, report) if details else outputs
