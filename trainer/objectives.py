"""Auxiliary training objectives: losses added to the task loss by the zoo's mechanisms.

The training loop knows only this interface; each mechanism lives in its own module:
- attention guidance (trainer/guidance.py, paper 003): MSE between chosen heads' attention maps and fixed patterns;
- self-supervised attention (trainer/ssa.py, paper 000): probing rounds that label important tokens, and a loss that
  supervises the SSA head's token attention with those labels.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from torch import Tensor

from .config import TrainConfig
from .heads import MultitaskModel
from .model_config import ForwardDetails


class Objective(Protocol):
    name: str  # the key of its loss in train_log.jsonl
    needs_attentions: bool  # whether loss() reads the encoder's attention maps (costs the fused attention kernel)

    def prepare(self, step: int, total_steps: int, model: MultitaskModel, streams: dict) -> None:
        """Called before every step (SSA probes the model here at the start of each round)."""

    def loss(self, task: str, indices: np.ndarray, batch: dict[str, Tensor], details: ForwardDetails,
             progress: float) -> Tensor | None:
        """The weighted auxiliary loss for this batch, or None when it does not apply to the task. ``indices`` are
        the batch items' positions in ``streams[task].features``; ``progress`` is step / total steps."""


def build_objectives(config: TrainConfig, tokenizer) -> list[Objective]:
    objectives: list[Objective] = []
    if config.ag_weight > 0:
        from .guidance import AttentionGuidance

        objectives.append(AttentionGuidance.from_config(config, tokenizer))
    if config.ssa_rounds > 0:
        from .ssa import SelfSupervisedAttention

        objectives.append(SelfSupervisedAttention.from_config(config, tokenizer))
    return objectives
