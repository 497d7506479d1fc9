"""The zoo's heads by name: task-specific self/cross-attention (trainer/attention_heads.py) and SSA (trainer/ssa.py).

Kept apart from trainer/heads.py so the baseline heads stay one short file; ``heads.build_head`` calls this for every
head name that is not a baseline one.
"""

from __future__ import annotations

from torch import nn

from .heads import ModelConfig


def build_zoo_head(task: str, config: ModelConfig) -> nn.Module:
    kind = {"sentiment": config.sentiment_head, "paraphrase": config.paraphrase_head,
            "similarity": config.similarity_head}.get(task)
    raise ValueError(f"no {task!r} head named {kind!r}")
