"""Task heads and the multitask model: one shared encoder, one small head per task.

The head interface is deliberately small so the zoo can add heads (task-specific attention, cross-attention, attention
pooling) without touching the trainer:
- a sentence head maps token states + mask [B, T, H], [B, T] to an output per sentence;
- a pair head maps the two sentences' token states + masks to an output per pair;
- the QA head maps token states to start/end logits per token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import Encoder, EncoderConfig

POOLINGS = ("cls", "mean")
SIMILARITY_HEADS = ("concat", "cosine")


@dataclass
class ModelConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    tasks: tuple[str, ...] = ("sentiment", "paraphrase", "similarity", "qa")
    sentiment_num_labels: int = 5
    pooling: str = "mean"  # "cls" or "mean" over real tokens (padding excluded)
    similarity_head: str = "cosine"  # "concat" ([u; v; |u-v|] -> score) or "cosine" (scaled to [0, 5])
    head_dropout: float = 0.1
    qa_null_threshold: float = 0.0  # QA answers "no answer" when null score - best span score exceeds this

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.similarity_head not in SIMILARITY_HEADS:
            raise ValueError(f"similarity_head must be one of {SIMILARITY_HEADS}, got {self.similarity_head!r}")
        self.tasks = tuple(self.tasks)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        d = dict(d)
        return cls(encoder=EncoderConfig.from_dict(d.pop("encoder")), **d)


def pool(states: Tensor, mask: Tensor, how: str) -> Tensor:
    if how == "cls":
        return states[:, 0]
    weights = mask.to(states.dtype).unsqueeze(-1)
    return (states * weights).sum(1) / weights.sum(1).clamp(min=1.0)


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


class MultitaskModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config.encoder)
        hidden, drop = config.encoder.hidden_size, config.head_dropout
        heads: dict[str, nn.Module] = {}
        if "sentiment" in config.tasks:
            heads["sentiment"] = SentimentHead(hidden, config.sentiment_num_labels, config.pooling, drop)
        if "paraphrase" in config.tasks:
            heads["paraphrase"] = ParaphraseHead(hidden, config.pooling, drop)
        if "similarity" in config.tasks:
            heads["similarity"] = SimilarityHead(hidden, config.pooling, config.similarity_head, drop)
        if "qa" in config.tasks:
            heads["qa"] = QAHead(hidden)
        self.heads = nn.ModuleDict(heads)

    def encode(self, batch: dict[str, Tensor]) -> Tensor:
        return self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")).last_hidden_state

    def forward(self, task: str, batch: dict[str, Tensor]) -> Tensor | tuple[Tensor, Tensor]:
        """Head outputs for one task's batch (see bertzoo.tasks for what each task returns).

        Pair tasks carry both sentences in one encoder batch (first half a, second half b) so they share one pass.
        """
        if task not in self.heads:
            raise ValueError(f"this model has no {task!r} head; it was trained for {list(self.heads)}")
        states = self.encode(batch)
        mask = batch["attention_mask"]
        if task in ("paraphrase", "similarity"):
            n = states.shape[0] // 2
            return self.heads[task](states[:n], mask[:n], states[n:], mask[n:])
        return self.heads[task](states, mask)
