"""A batch the batcher cut from its queue: the items it holds, their works in order and their padded inputs, and the
part of it still worth running when a worker takes it (serving/batcher.py decides when and where it runs)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .bucket_queue import QueuedItem
from .engine import Work, prepare_inputs


@dataclass
class Batch:
    items: list[QueuedItem]
    works: list[Work]  # the items' works, in order (works_of)
    bucket: int
    inputs: dict
    rows: int

    @classmethod
    def cut(cls, items: list[QueuedItem], bucket: int, width: int | None, pad_id: int) -> Batch:
        """``items`` of ``bucket``, padded to ``width`` (None: their longest row, rounded up; engine.prepare_inputs)."""
        works = works_of(items)
        return cls(items, works, bucket, prepare_inputs(works, width, pad_id), sum(item.rows for item in items))

    def live_part(self) -> tuple[list[QueuedItem], list[Work], dict] | None:
        """The items whose requests are still waited for and within their deadlines, their works and padded inputs:
        a batch cut ahead may hold some cancelled or expired since, whose rows leave it so that they never reach the
        model. None when no item is left. Read-only looks at the jobs (a worker thread calls it)."""
        now = time.monotonic()  # the event loop's clock
        items = [item for item in self.items if not (item.job.abandoned() or item.job.expired(now))]
        if not items:
            return None
        if len(items) == len(self.items):
            return items, self.works, self.inputs
        return items, works_of(items), self._rows_of(items)

    def _rows_of(self, items: list[QueuedItem]) -> dict:
        """The padded inputs of ``items`` (some of this batch's, in their order) alone."""
        kept = set(map(id, items))
        index: list[int] = []
        row = 0
        for item in self.items:
            if id(item) in kept:
                index.extend(range(row, row + item.rows))
            row += item.rows
        return {name: values[index] for name, values in self.inputs.items()}


def works_of(items: list[QueuedItem]) -> list[Work]:
    """The works of ``items``, in order: what the batch runner gets, one output back for each."""
    return [item.job.works[i] for item in items for i in item.indices]
