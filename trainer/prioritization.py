"""Dynamic task prioritization (paper 004, after Guo et al. 2018): the sampling weight of each task follows its
performance gap, smoothed, and is handed to ``batches.task_for_step(..., weights=...)``.

Paper 004's scheduler, section 3.2, "Dynamic Training Scheduler":

    Weight_task = (test_acc_task - dev_acc_task) / sum over tasks of (test_acc - dev_acc)          (8)

then new = alpha * proposed + (1 - alpha) * previous with alpha decreasing linearly from an initial to a final value,
then normalised to sum to 1.

What we read into it, where the paper is loose:
- "test_acc" cannot be a test-split score (the CS224N test labels are hidden; bertzoo has train and dev only). The
  paper introduces the scheduler "to reduce overfitting" and measures overfitting as the training score against the
  dev score ("around 0.98 in the training results for semantic similarity [...] but a dev result around 0.60"). So
  the gap is the primary metric on training items minus the same metric on dev items: by default
  (``dtp_reference = "train"``) the first ``dtp_eval_limit`` items of each split. ``dtp_reference = "target"``
  measures the gap against a perfect score (1 - dev score) instead, for runs where no train-set evaluation is wanted.
- a gap at or below zero (dev as good as train) would give a zero or negative weight, and a task at weight 0 is never
  trained again, so its gap could never move: gaps are floored at ``min_gap`` (0.01, one accuracy point).
- a NaN score (e.g. a Pearson correlation of constant predictions) counts as 0: nothing learned.
- "the original weight" that (1 - alpha) multiplies is the previous weight (exponential smoothing): the paper adds
  alpha because the updates "were too abrupt", which blending with the previous weight damps. The smoothing factor
  alpha is the share of the *new* proposal; it goes from ``dtp_smoothing_start`` (0.9) at the start of training to
  ``dtp_smoothing_end`` (0.5) at the end, so re-weightings become gentler as training settles.
- initial weights: the paper only says "each task is initially assigned a selection weight"; we start uniform, the
  "balance in training focus" the scheduler aims for, not the dataset sizes it is meant to counter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from bertzoo.tasks import Limits, task_spec

if TYPE_CHECKING:
    from bertzoo.tokenization import Tokenizer

    from .heads import MultitaskModel

REFERENCES = ("train", "target")


def _score(value: float) -> float:
    value = float(value)
    return 0.0 if math.isnan(value) else value


class TaskPrioritizer:
    """Sampling weights for ``tasks`` (a list aligned with them, summing to 1), re-estimated by ``update``."""

    def __init__(self, tasks: Sequence[str], smoothing_start: float = 0.9, smoothing_end: float = 0.5,
                 initial: Sequence[float] | None = None, min_gap: float = 0.01) -> None:
        if not tasks:
            raise ValueError("a prioritizer needs at least one task")
        for name, value in (("smoothing_start", smoothing_start), ("smoothing_end", smoothing_end)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if min_gap <= 0:
            raise ValueError(f"min_gap must be > 0, got {min_gap}")
        self.tasks = list(tasks)
        self.smoothing_start, self.smoothing_end, self.min_gap = smoothing_start, smoothing_end, min_gap
        start = [1.0] * len(self.tasks) if initial is None else [float(w) for w in initial]
        if len(start) != len(self.tasks) or any(not w > 0 for w in start):
            raise ValueError(f"initial weights must be {len(self.tasks)} positive numbers, got {list(start)}")
        self.weights: list[float] = self._normalised(start)
        self.updates = 0

    @staticmethod
    def _normalised(values: Sequence[float]) -> list[float]:
        total = sum(values)
        return [v / total for v in values]

    def smoothing(self, progress: float) -> float:
        """alpha at ``progress`` (0 = start of training, 1 = end): linear from start to end, clamped outside."""
        progress = min(max(float(progress), 0.0), 1.0)
        return self.smoothing_start + (self.smoothing_end - self.smoothing_start) * progress

    def gaps(self, metrics: Mapping[str, float], reference: float | Mapping[str, float] = 1.0) -> list[float]:
        """Each task's performance gap, reference score minus its score, floored at ``min_gap``."""
        missing = [t for t in self.tasks if t not in metrics or (isinstance(reference, Mapping) and t not in reference)]
        if missing:
            raise ValueError(f"no score for tasks {missing}")
        refs = [_score(reference[t]) if isinstance(reference, Mapping) else float(reference) for t in self.tasks]
        return [max(ref - _score(metrics[t]), self.min_gap) for t, ref in zip(self.tasks, refs, strict=True)]

    def proposal(self, metrics: Mapping[str, float], reference: float | Mapping[str, float] = 1.0) -> list[float]:
        """Equation (8): the gaps normalised to sum to 1."""
        return self._normalised(self.gaps(metrics, reference))

    def update(self, metrics: Mapping[str, float], progress: float,
               reference: float | Mapping[str, float] = 1.0) -> list[float]:
        """New weights from each task's primary metric in ``metrics`` (dev score, in [0, 1]) against ``reference`` (the
        same metric on training items per task, or one target score), at training ``progress`` in [0, 1]."""
        alpha = self.smoothing(progress)
        proposed = self.proposal(metrics, reference)
        blended = [alpha * p + (1.0 - alpha) * w for p, w in zip(proposed, self.weights, strict=True)]
        self.weights = self._normalised(blended)  # already sums to 1 in exact arithmetic; guards float drift
        self.updates += 1
        return self.weights

    def state_dict(self) -> dict:
        """JSON-serialisable, for the checkpoint's trainer state."""
        return {"tasks": list(self.tasks), "weights": list(self.weights), "updates": self.updates}

    def load_state_dict(self, state: Mapping) -> None:
        if list(state["tasks"]) != self.tasks:
            raise ValueError(f"prioritizer state is for tasks {list(state['tasks'])}, this run trains {self.tasks}")
        self.weights = self._normalised([float(w) for w in state["weights"]])
        self.updates = int(state.get("updates", 0))


def primary_scores(metrics: Mapping[str, Mapping[str, float]], sentiment_dataset: str = "sst5") -> dict[str, float]:
    """Each task's primary metric in [0, 1] (QA F1 from percent), as the best-checkpoint score uses them."""
    return {t: float(m[task_spec(t, sentiment_dataset).primary_metric]) / (100.0 if t == "qa" else 1.0)
            for t, m in metrics.items()}


def reprioritize(prioritizer: TaskPrioritizer, model: MultitaskModel, splits: Mapping[str, Mapping[str, list]],
                 tokenizer: Tokenizer, limits: Limits, sentiment_dataset: str, progress: float) -> dict:
    """Evaluate ``model`` on ``splits["dev"]`` (and ``splits["train"]``, the reference, when present; else the target
    1.0), update ``prioritizer`` and return what happened, for the training log."""
    from .evaluate import evaluate  # torch and the pipeline: only when training

    dev = primary_scores(evaluate(model, splits["dev"], tokenizer, limits), sentiment_dataset)
    train = primary_scores(evaluate(model, splits["train"], tokenizer, limits), sentiment_dataset) \
        if "train" in splits else None
    reference: float | dict[str, float] = train if train is not None else 1.0
    alpha = prioritizer.smoothing(progress)
    gaps = prioritizer.gaps(dev, reference)
    weights = prioritizer.update(dev, progress, reference)
    record = {"dev": dev, "gap": dict(zip(prioritizer.tasks, gaps, strict=True)), "alpha": alpha,
              "weights": dict(zip(prioritizer.tasks, weights, strict=True))}
    if train is not None:
        record["train"] = train
    return record


def broadcast(prioritizer: TaskPrioritizer) -> None:
    """Every process must draw the same task each step: rank 0's weights go to all ranks."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [prioritizer.state_dict()]
        dist.broadcast_object_list(box, src=0)
        prioritizer.load_state_dict(box[0])
