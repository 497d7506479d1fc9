"""One encoder batch on a backend: pad the sequences (to the longest, or to the batch's length bucket), run the encoder
once over all of them (whatever task each comes from), then each task's head on the rows of that task.

Heads get exactly the inputs ``bertzoo.pipeline.predict`` gives them (states cut to the longest of their rows and zero
past each sequence's end, as ``pipeline.pad_states`` makes them), so a served answer equals the evaluated one. A
backend whose states live on a GPU may keep them there (``resident_states``): it selects each task's rows on the
device and only the heads' small outputs come back to the host. This module is pure computation; the batcher decides
what goes into a batch and calls :func:`run_batch` on its worker thread.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertzoo.pipeline import PAIR_TASKS, Backend
from bertzoo.tokenization import Encoding, QAWindow, pad_batch

from .backends.base import EMBED, pool_embeddings, row_index, rows_mask

Row = Encoding | QAWindow


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs twice as much, and the engine makes one a work
class Work:
    """Sequences that must share one encoder pass: a sentence (sentiment, embed), a pair's two sentences
    (paraphrase, similarity: ``rows == (a, b)``) or all windows of one QA item. Not changed once made."""

    task: str
    rows: tuple[Row, ...]

    @property
    def longest(self) -> int:
        rows = self.rows
        return len(rows[0].input_ids) if len(rows) == 1 else max(len(r.input_ids) for r in rows)


def encoder_tokens(works: Sequence[Work]) -> int:
    """A request's cost: the tokens of every sequence the encoder runs for it (every QA window), before padding."""
    return sum(len(row.input_ids) for work in works for row in work.rows)


def split_windows(works: Sequence[Work]) -> tuple[list[Work], list[int]]:
    """Each QA work cut into one work per window (a window's logits depend on that window alone), so a long request
    spreads over several batches; other works stay whole (a pair's two sentences share one pass). Returns the pieces
    and how many pieces each work became, for :func:`join_windows`."""
    pieces: list[Work] = []
    counts: list[int] = []
    for work in works:
        parts = [Work(work.task, (row,)) for row in work.rows] if work.task == "qa" else [work]
        pieces.extend(parts)
        counts.append(len(parts))
    return pieces, counts


def join_windows(outputs: Sequence[object], counts: Sequence[int]) -> list[object]:
    """The outputs of :func:`split_windows`' pieces put back together: one per original work, in order."""
    joined: list[object] = []
    k = 0
    for n in counts:
        parts = outputs[k:k + n]
        if n == 1:
            joined.append(parts[0])
        else:  # a QA work's windows: (start logits per window, end logits per window)
            joined.append(([s for p in parts for s in p[0]], [e for p in parts for e in p[1]]))
        k += n
    return joined


PAD_MULTIPLE = 8  # lengths rounded up to this: fewer distinct shapes for the runtime, SIMD-friendly widths


def padded_width(length: int) -> int:
    """The width a sequence of ``length`` tokens is padded to with ``pad_to="longest"``: rounded up to PAD_MULTIPLE."""
    return -(-length // PAD_MULTIPLE) * PAD_MULTIPLE


def prepare_inputs(works: Sequence[Work], width: int | None, pad_id: int) -> dict[str, np.ndarray]:
    """Encoder inputs [rows, width] (int64): every row of every work, in order, right-padded to ``width`` (a bucket
    length), or with ``width=None`` to the longest row rounded up to a multiple of ``PAD_MULTIPLE``."""
    rows = [r for w in works for r in w.rows]
    batch = pad_batch(rows, pad_id, pad_to_multiple_of=PAD_MULTIPLE if width is None else 1)
    extra = 0 if width is None else width - batch["input_ids"].shape[1]
    if extra > 0:  # pad to the bucket: a few fixed shapes instead of one per length
        batch = {k: np.pad(v, ((0, 0), (0, extra)), constant_values=pad_id if k == "input_ids" else 0)
                 for k, v in batch.items()}
    return batch


class HostStates:
    """The encoder's states of one batch as a host array: what every backend's ``encode`` returns."""

    def __init__(self, states: np.ndarray, mask: np.ndarray) -> None:
        self.states, self.mask = states, mask

    def select(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """States and mask of ``rows``, cut to their longest sequence and zero past each one's end (right padding),
        equal to ``pipeline.pad_states`` of the trimmed rows."""
        mask = rows_mask(self.mask, rows)
        return self.states[row_index(rows), :mask.shape[1]] * mask[..., None].astype(self.states.dtype), mask

    host = select  # the states already are on the host

    def embeddings(self, rows: Sequence[int], pooling: str) -> np.ndarray:
        return pool_embeddings(*self.select(rows), pooling)


def encoded_states(backend: Backend, inputs: dict[str, np.ndarray]):
    """The encoder's states, on the backend's device where it keeps them there (``select`` then gives device values
    its ``head`` takes, ``host`` host arrays, ``embeddings`` the pooled unit vectors), else as :class:`HostStates`."""
    if getattr(backend, "resident_states", False):
        return backend.encode_resident(inputs)
    return HostStates(backend.encode(inputs), inputs["attention_mask"])


def run_batch(backend: Backend, works: Sequence[Work], inputs: dict[str, np.ndarray], pooling: str) -> Sequence:
    """One output per work, in order. sentiment: logits [labels]; paraphrase / similarity: the head's scalar;
    qa: (start logits, end logits), one array per window trimmed to its length; embed: a unit vector [h]. A batch
    of sentiment or embed works alone gives its head's [works, n] array itself (its rows the works' outputs): a hop's
    answers then leave as slices of it, not as rows stacked again.

    A batch of one task on a backend that runs the encoder and that task's head as one unit (``runs_tasks``, then
    ``run_task``: the torch engine's CUDA graphs) takes that path; every other batch runs the encoder once, then each
    task's head on its rows."""
    task = works[0].task
    if getattr(backend, "runs_tasks", False) and all(work.task == task for work in works):
        outputs = backend.run_task(task, inputs, pooling)
        if outputs is not None:
            return task_results(task, works, outputs)
    encoded = encoded_states(backend, inputs)
    first_row = list(itertools.accumulate((len(w.rows) for w in works), initial=0))  # plain ints: a few works

    by_task: dict[str, list[int]] = defaultdict(list)
    for i, work in enumerate(works):
        by_task[work.task].append(i)
    results: list | None = None if len(by_task) == 1 else [None] * len(works)
    for task, members in by_task.items():
        rows = [first_row[i] for i in members]
        if task == EMBED:
            outputs = (encoded.embeddings(rows, pooling),)
        elif task in PAIR_TASKS:
            states_a, mask_a = encoded.select(rows)
            states_b, mask_b = encoded.select([r + 1 for r in rows])
            outputs = backend.head(task, {"states_a": states_a, "mask_a": mask_a, "states_b": states_b,
                                          "mask_b": mask_b})
        elif task == "qa":
            states, mask = encoded.select([r + k for i, r in zip(members, rows, strict=True)
                                           for k in range(len(works[i].rows))])
            outputs = backend.head("qa", {"states": states, "mask": mask})
        else:  # a sentence head (sentiment)
            outputs = backend.head(task, dict(zip(("states", "mask"), encoded.select(rows), strict=True)))
        if results is None:  # every work of this one task
            return task_results(task, works, outputs)
        for i, result in zip(members, task_results(task, [works[i] for i in members], outputs), strict=True):
            results[i] = result
    assert results is not None
    return results


def task_results(task: str, works: Sequence[Work], outputs: Sequence) -> Sequence:
    """One result per work of ``task`` from its head's ``outputs`` over their rows, in order: the embeddings [works,
    h] (the array); a pair head's scores [works]; QA's start and end logits [windows, length], cut per work and
    window; a sentence head's logits [works, labels] (the array)."""
    if task == EMBED:
        return np.asarray(outputs[0])
    if task in PAIR_TASKS:
        return [float(x) for x in np.asarray(outputs[0]).reshape(-1)]
    if task == "qa":
        start, end = outputs
        results, k = [], 0
        for work in works:
            lengths = [len(w.input_ids) for w in work.rows]
            results.append(([start[k + j, :n] for j, n in enumerate(lengths)],
                            [end[k + j, :n] for j, n in enumerate(lengths)]))
            k += len(lengths)
        return results
    return np.asarray(outputs[0])


class EngineRunner:
    """:func:`run_batch` bound to one engine instance: what the batcher calls on that instance's worker thread."""

    def __init__(self, backend: Backend, pooling: str) -> None:
        self.backend, self.pooling = backend, pooling

    def __call__(self, works: Sequence[Work], inputs: dict[str, np.ndarray]) -> Sequence:
        return run_batch(self.backend, works, inputs, self.pooling)
