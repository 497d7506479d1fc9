"""What the multitask model and every head share, in a module of its own so the zoo's heads can use it without
importing the module that builds them: the model's config, sentence pooling and the forward pass's details."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from torch import Tensor

from .model import EncoderConfig

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


class ForwardDetails(NamedTuple):
    """What the training objectives may need beside the head outputs (trainer/objectives.py)."""

    outputs: Tensor | tuple[Tensor, Tensor]
    attentions: tuple[Tensor, ...] | None  # every encoder layer's attention probabilities, when asked for
    head: dict[str, Tensor]  # whatever the head chose to report (e.g. an SSA head's token attention)
