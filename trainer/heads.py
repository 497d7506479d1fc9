"""Task heads and the multitask model: one shared encoder, one small head per task.

The head interface is deliberately small so the zoo can add heads (task-specific attention, cross-attention, attention
pooling) without touching the trainer:
- a sentence head maps token states + mask [B, T, H], [B, T] to an output per sentence;
- a pair head maps the two sentences' token states + masks to an output per pair;
- the QA head maps token states to start/end logits per token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import Encoder, EncoderConfig

POOLINGS = ("cls", "mean")
# The zoo's heads (trainer/attention_heads.py, trainer/ssa.py) sit beside the baseline ones under these names.
SENTIMENT_HEADS = ("linear", "self_attention", "ssa")
PARAPHRASE_HEADS = ("concat", "cross_attention", "cross_pool")
SIMILARITY_HEADS = ("concat", "cosine", "cross_attention", "cross_pool")


@dataclass
class ModelConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    tasks: tuple[str, ...] = ("sentiment", "paraphrase", "similarity", "qa")
    sentiment_num_labels: int = 5
    pooling: str = "mean"  # "cls" or "mean" over real tokens (padding excluded)
    similarity_head: str = "cosine"  # "concat" ([u; v; |u-v|] -> score) or "cosine" (scaled to [0, 5]), or a zoo head
    head_dropout: float = 0.1
    qa_null_threshold: float = 0.0  # QA answers "no answer" when null score - best span score exceeds this
    # The zoo's task-specific heads (see TrainConfig for what each one is).
    sentiment_head: str = "linear"
    paraphrase_head: str = "concat"
    sentiment_attention_layers: int = 2
    paraphrase_cross_layers: int = 1
    similarity_cross_layers: int = 3
    head_uniform_init: bool = False
    ssa_mode: str = "attention"  # the "ssa" sentiment head's variant (trainer/ssa.py)

    def __post_init__(self) -> None:
        for name, allowed in (("pooling", POOLINGS), ("sentiment_head", SENTIMENT_HEADS),
                              ("paraphrase_head", PARAPHRASE_HEADS), ("similarity_head", SIMILARITY_HEADS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
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


class ForwardDetails(NamedTuple):
    """What the training objectives may need beside the head outputs (trainer/objectives.py)."""

    outputs: Tensor | tuple[Tensor, Tensor]
    attentions: tuple[Tensor, ...] | None  # every encoder layer's attention probabilities, when asked for
    head: dict[str, Tensor]  # whatever the head chose to report (e.g. an SSA head's token attention)


class MultitaskModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config.encoder)
        self.heads = nn.ModuleDict({task: build_head(task, config) for task in config.tasks})

    def encode(self, batch: dict[str, Tensor]) -> Tensor:
        return self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")).last_hidden_state

    def forward(self, task: str, batch: dict[str, Tensor], details: bool = False, output_attentions: bool = False
                ) -> Tensor | tuple[Tensor, Tensor] | ForwardDetails:
        """Head outputs for one task's batch (see bertzoo.tasks for what each task returns), or with ``details`` a
        ForwardDetails that also carries the encoder's attention maps (``output_attentions``) and the head's report.

        Pair tasks carry both sentences in one encoder batch (first half a, second half b) so they share one pass.
        """
        if task not in self.heads:
            raise ValueError(f"this model has no {task!r} head; it was trained for {list(self.heads)}")
        encoded = self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                               output_attentions=output_attentions)
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
