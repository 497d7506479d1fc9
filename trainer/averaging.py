"""An exponential moving average of the weights (Polyak averaging), evaluated and saved in place of the last step's.

Fine-tuning's last weights carry the noise of its last few batches; an average over the final stretch of the run is
smoother. The horizon is a share of the run's steps (``TrainConfig.weight_average``), so the same setting means the
same thing for a 1,000-step and a 5,000-step run: decay = 1 - 1 / (share x steps). Early on the decay is capped at
(1 + n) / (10 + n) after n updates, so the average does not hold on to the weights training started from.

Training always steps the raw weights. :meth:`WeightAverage.applied` puts the average into the model for evaluation
and saving, and yields the raw weights, which a checkpoint keeps beside the averaged ones so ``--resume`` continues
exactly where it left off.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

RAW_PREFIX = "raw_weights."  # the raw weights' keys in a checkpoint's trainer state


class WeightAverage:
    def __init__(self, model: torch.nn.Module, share: float, total_steps: int) -> None:
        self.decay = 1.0 - 1.0 / max(1.0, share * total_steps)
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.average = [p.detach().clone() for p in self.params]
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        """Fold the parameters as they are now into the average (after each optimizer step)."""
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1.0 - decay)

    @torch.no_grad()
    def _swap(self) -> None:
        for p, a in zip(self.params, self.average, strict=True):
            held = p.detach().clone()
            p.copy_(a)
            a.copy_(held)

    @contextmanager
    def applied(self) -> Iterator[dict[str, torch.Tensor]]:
        """Inside, the model holds the averaged weights; yields the raw ones by name (with :data:`RAW_PREFIX`)."""
        self._swap()
        try:
            yield {RAW_PREFIX + name: a for name, a in zip(self.names, self.average, strict=True)}
        finally:
            self._swap()

    def keep(self) -> None:
        """Put the average into the model for good: training is over."""
        self._swap()

    @torch.no_grad()
    def resume(self, raw: dict[str, torch.Tensor], updates: int) -> None:
        """After a resume loaded the checkpoint's (averaged) weights into the model: make those the average and put
        the raw weights back into the model."""
        for name, p, a in zip(self.names, self.params, self.average, strict=True):
            a.copy_(p)
            p.copy_(raw[RAW_PREFIX + name])
        self.updates = updates


@torch.no_grad()
def restore_raw(model: torch.nn.Module, raw: dict[str, torch.Tensor]) -> None:
    """A resume with averaging turned off, of a run that was averaging: the model loaded the checkpoint's averaged
    weights; put the raw ones back, so training goes on from the weights it had reached."""
    for name, p in model.named_parameters():
        if RAW_PREFIX + name in raw:
            p.copy_(raw[RAW_PREFIX + name])


@contextmanager
def averaged(average: WeightAverage | None) -> Iterator[dict[str, torch.Tensor]]:
    """:meth:`WeightAverage.applied`, or nothing to do (no raw weights to keep) when averaging is off."""
    if average is None:
        yield {}
    else:
        with average.applied() as raw:
            yield raw
