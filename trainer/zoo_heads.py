"""The zoo's heads by name: task-specific self/cross-attention (trainer/attention_heads.py) and SSA (trainer/ssa.py).

Kept apart from trainer/heads.py so the baseline heads stay one short file; ``heads.build_head`` calls this for every
head name that is not a baseline one.
"""

from __future__ import annotations

from torch import nn

from .attention_heads import CrossAttentionPairHead, CrossPoolPairHead, SelfAttentionSentimentHead
from .model_config import ModelConfig


def build_zoo_head(task: str, config: ModelConfig) -> nn.Module:
    kind = {"sentiment": config.sentiment_head, "paraphrase": config.paraphrase_head,
            "similarity": config.similarity_head}.get(task)
    hidden, heads, drop = config.encoder.hidden_size, config.encoder.num_attention_heads, config.head_dropout
    eps = config.encoder.layer_norm_eps
    if task == "sentiment" and kind == "self_attention":  # paper 001: self-attention layers, first-token readout
        return SelfAttentionSentimentHead(hidden, config.sentiment_num_labels, config.sentiment_attention_layers, heads,
                                          drop, eps, config.head_uniform_init)
    if task in ("paraphrase", "similarity") and kind == "cross_attention":  # paper 001: cross-attention layers
        layers = config.paraphrase_cross_layers if task == "paraphrase" else config.similarity_cross_layers
        return CrossAttentionPairHead(hidden, task, layers, heads, drop, eps, config.head_uniform_init)
    if task in ("paraphrase", "similarity") and kind == "cross_pool":  # paper 004: cross-attention + attention pooling
        return CrossPoolPairHead(hidden, task, drop, eps)
    if task == "sentiment" and kind == "ssa":
        from .ssa import SSASentimentHead  # paper 000: attention weights supervised by probing labels

        return SSASentimentHead(config.encoder.hidden_size, config.sentiment_num_labels, config.head_dropout,
                                config.ssa_mode, config.pooling)
    raise ValueError(f"no {task!r} head named {kind!r}")
