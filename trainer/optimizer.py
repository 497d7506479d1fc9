"""The optimizer and the learning-rate schedule that fine-tuning and MLM pre-training share: AdamW with parameter
groups (no decay on biases and LayerNorm weights, an own rate for the heads, layer-wise rate decay) and linear
warmup then linear decay. One place, so both loops train with the same rules.

The schedule is a factor of each group's ``base_lr``: the loops set ``group["lr"] = group["base_lr"] *
lr_factor(step, total, warmup_ratio)`` before every step, so a resumed run recomputes its rates from the step alone.
"""

from __future__ import annotations

import re

import torch


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, head_lr: float | None = None,
                   layer_decay: float = 1.0) -> torch.optim.AdamW:
    """AdamW; each group keeps its ``base_lr`` for the schedule. ``head_lr``: the rate of ``heads.*`` parameters.

    ``layer_decay`` < 1 is layer-wise learning-rate decay (ELECTRA, BEiT): the top encoder layer trains at ``lr``,
    each layer below at ``layer_decay`` times the one above it, the embeddings at the rate of a layer under the
    first, so the general lower layers of a pretrained encoder move less than the task-specific upper ones."""
    depth = encoder_depth(model)
    groups: dict[tuple[float, float], list] = {}
    for name, param in model.named_parameters():
        if head_lr is not None and name.startswith("heads."):
            group_lr = head_lr
        else:
            group_lr = lr * layer_decay ** (depth - encoder_layer_of(name, depth))
        # No weight decay on biases and LayerNorm weights (standard BERT practice).
        decay = 0.0 if param.ndim < 2 else weight_decay
        groups.setdefault((group_lr, decay), []).append(param)
    # fused: one kernel per step instead of a few per tensor, several times faster on a CPU for MiniLM.
    return torch.optim.AdamW(
        [{"params": p, "lr": lr, "base_lr": lr, "weight_decay": wd} for (lr, wd), p in groups.items()], fused=True
    )


_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")


def encoder_depth(model: torch.nn.Module) -> int:
    """The number of transformer layers, counted from the parameter names (``...encoder.layer.<i>...``)."""
    layers = {int(m.group(1)) for name, _ in model.named_parameters() if (m := _LAYER.search(name))}
    return max(layers) + 1 if layers else 0


def encoder_layer_of(name: str, depth: int) -> int:
    """1-based depth of a parameter for layer-wise decay: embeddings 0, transformer layer i is i + 1, and anything
    above the layers (heads, MLM head) ``depth``, the top's rate."""
    if (match := _LAYER.search(name)) is not None:
        return int(match.group(1)) + 1
    return 0 if ".embeddings." in f".{name}" else depth


def lr_factor(step: int, total: int, warmup_ratio: float) -> float:
    """The schedule at 0-based ``step`` of ``total``: linear warmup over ``warmup_ratio`` of the steps (at least
    one), then linear decay to 0 at ``total``."""
    warmup = max(1, int(total * warmup_ratio))
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))
