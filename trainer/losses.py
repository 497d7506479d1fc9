"""The task losses of multitask fine-tuning: a new task's loss goes in ``task_loss`` and the loop stays the same
for every task. Auxiliary losses (attention guidance, SSA's) are ``objectives.py``'s; these are the tasks' own.

One optimizer and one learning rate serve every task, so the similarity loss is brought to the others' scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def negative_pearson(pred: torch.Tensor, target: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """-corr(pred, target) over the batch (paper 001's STS loss): scale-free, it optimises the metric itself."""
    p, t = pred - pred.mean(), target - target.mean()
    return -(p * t).sum() / (p.norm() * t.norm() + eps)


def task_loss(task: str, outputs, batch: dict[str, torch.Tensor], similarity_loss: str = "mse") -> torch.Tensor:
    """The loss of one task's batch from its head's ``outputs``: cross-entropy for sentiment, binary cross-entropy
    for paraphrase, MSE on scores / 5 (or ``similarity_loss="neg_pearson"``) for similarity, and for QA the mean of
    the start and end positions' cross-entropies. Computed in fp32 whatever the autocast precision."""
    if task == "sentiment":
        return F.cross_entropy(outputs.float(), batch["labels"])
    if task == "paraphrase":
        return F.binary_cross_entropy_with_logits(outputs.float(), batch["labels"])
    if task == "similarity" and similarity_loss == "neg_pearson":
        return negative_pearson(outputs.float(), batch["labels"])
    if task == "similarity":
        # Scores and targets divided by 5 so this loss is on the same scale as the others.
        return F.mse_loss(outputs.float() / 5.0, batch["labels"] / 5.0)
    start, end = outputs
    return (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2
