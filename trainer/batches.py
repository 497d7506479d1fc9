"""From examples to tensors: features per task, resumable seeded batch streams, and the task sampler.

Everything random here is a pure function of (seed, step) or (seed, task, pass): a resumed run, and every process of a
distributed run, draws the same task and the same example order without carrying random state around.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertzoo import tasks as T
from bertzoo.tokenization import Encoding, QAWindow, Tokenizer, pad_batch


@dataclass(frozen=True)
class Feature:
    """One training item: a sentence (sentiment), a pair (paraphrase, similarity) or one QA window."""

    encodings: tuple[Encoding | QAWindow, ...]  # one, or two for a pair
    target: tuple[float, ...]  # label / score / (start, end)


def build_features(task: str, examples: Sequence, tokenizer: Tokenizer, limits: T.Limits) -> list[Feature]:
    if task == "sentiment":
        encodings = T.encode_sentences(tokenizer, [e.text for e in examples], limits)
        return [Feature((enc,), (float(e.label),)) for enc, e in zip(encodings, examples, strict=True)]
    if task in ("paraphrase", "similarity"):
        a, b = T.encode_pairs_separately(tokenizer, [e.text_a for e in examples], [e.text_b for e in examples], limits)
        return [Feature((x, y), (float(e.label),)) for x, y, e in zip(a, b, examples, strict=True)]
    if task == "qa":
        features = []
        for e in examples:
            # Training uses the first gold answer (train files have exactly one).
            start, text = (e.answer_starts[0], e.answers[0]) if e.answers and not e.is_impossible else (None, None)
            for window in T.encode_qa(tokenizer, e.question, e.context, limits, answer_start=start, answer_text=text):
                features.append(Feature((window,), (float(window.start_position), float(window.end_position))))
        return features
    raise ValueError(f"unknown task {task!r}")


def collate(task: str, features: Sequence[Feature], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a batch. Pair tasks put all first sentences, then all second sentences, into one encoder batch."""
    if task in ("paraphrase", "similarity"):
        encodings = [f.encodings[0] for f in features] + [f.encodings[1] for f in features]
    else:
        encodings = [f.encodings[0] for f in features]
    batch = {k: torch.from_numpy(v) for k, v in pad_batch(encodings, pad_id).items()}
    targets = torch.tensor([f.target for f in features], dtype=torch.float32)
    if task == "sentiment":
        batch["labels"] = targets[:, 0].long()
    elif task == "qa":
        batch["start_positions"], batch["end_positions"] = targets[:, 0].long(), targets[:, 1].long()
    else:
        batch["labels"] = targets[:, 0]
    return batch


class TaskStream:
    """Endless batches of one task: each pass is a fresh permutation seeded by (seed, task, pass).

    With several processes, each global batch of ``batch_size * world_size`` items is split between the ranks, so the
    processes see disjoint items and together the same order a single process would.

    ``batch_tokens`` (None: fixed batches of ``batch_size``) groups items of similar length: each pass's permutation
    is cut into runs of ``GROUP_BATCHES`` batches, each run sorted by length and cut into batches that hold as many
    items as fit in ``batch_tokens`` padded tokens per process (a pair counts both sentences), never fewer than
    ``batch_size``; the batches of a pass are then shuffled. Less padding, and short items (SST phrases, Quora
    questions) travel many to a batch. The budget is per process, so these batches depend on the number of processes.
    """

    GROUP_BATCHES = 50

    def __init__(self, task: str, features: list[Feature], batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, batch_tokens: int | None = None) -> None:
        if not features:
            raise ValueError(f"task {task!r} has no training examples")
        if batch_tokens is not None and batch_tokens < 1:
            raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
        self.task, self.features, self.seed = task, features, seed
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.batch_tokens = batch_tokens
        self._widths = np.array([max(len(e.input_ids) for e in f.encodings) if f.encodings else 1
                                 for f in features]) * (2 if task in ("paraphrase", "similarity") else 1)
        self.passes, self.cursor = 0, 0
        self._start_pass()

    def _permutation(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, T.TASK_NAMES.index(self.task), self.passes])
        return rng.permutation(len(self.features))

    def _start_pass(self) -> None:
        self._order = self._permutation()
        self._batches = None if self.batch_tokens is None else self._length_grouped_batches(self._order)

    def _length_grouped_batches(self, order: np.ndarray) -> list[np.ndarray]:
        ws = self.world_size
        order = np.resize(order, max(len(order), ws))  # every rank gets at least one item
        group = self.GROUP_BATCHES * self.batch_size * ws
        runs = [order[start:start + group] for start in range(0, len(order), group)]
        if len(runs) > 1 and len(runs[-1]) < ws:
            runs[-2:] = [np.concatenate(runs[-2:])]
        batches: list[np.ndarray] = []
        for run in runs:
            run = run[np.argsort(self._widths[run], kind="stable")]
            i = 0
            while i < len(run):
                count = ws  # in whole rows of ws items, so the ranks split every batch evenly
                while i + count + ws <= len(run):
                    fits = (count + ws) // ws * int(self._widths[run[i + count + ws - 1]]) <= self.batch_tokens
                    if count + ws > self.batch_size * ws and not fits:
                        break
                    count += ws
                if len(run) - (i + count) < ws:  # a remainder too small to split joins this batch
                    count = len(run) - i
                batches.append(run[i:i + count])
                i += count
        shuffle = np.random.default_rng([self.seed, T.TASK_NAMES.index(self.task), self.passes, 1])
        return [batches[k] for k in shuffle.permutation(len(batches))]

    @property
    def batches_per_pass(self) -> int:
        if self._batches is not None:
            return len(self._batches)
        return max(1, math.ceil(len(self.features) / (self.batch_size * self.world_size)))

    @property
    def sampling_size(self) -> int:
        """The task's size for the task sampler: its items, or with length-grouped batches, its batches per pass
        scaled to items (so a task's share of steps follows the steps one pass over it takes)."""
        if self._batches is None:
            return len(self.features)
        return self.batches_per_pass * self.batch_size * self.world_size

    def next_features(self) -> list[Feature]:
        return [self.features[i] for i in self.next_indices()]

    def next_indices(self) -> np.ndarray:
        """This rank's share of the next global batch, as positions in ``self.features``."""
        if self._batches is not None:
            if self.cursor >= len(self._batches):
                self.passes, self.cursor = self.passes + 1, 0
                self._start_pass()
            batch = self._batches[self.cursor]
            self.cursor += 1
            return batch[self.rank::self.world_size]
        global_size = self.batch_size * self.world_size
        if self.cursor + global_size > len(self._order) and self.cursor > 0:
            self.passes, self.cursor = self.passes + 1, 0
            self._start_pass()
        indices = np.resize(self._order[self.cursor:], global_size)  # tiny data: wrap around within the pass
        self.cursor += global_size
        return indices[self.rank::self.world_size]

    def state_dict(self) -> dict:
        return {"passes": self.passes, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.passes, self.cursor = state["passes"], state["cursor"]
        self._start_pass()


def task_for_step(step: int, tasks: Sequence[str], sizes: Sequence[int], sampling: str, total_steps: int,
                  seed: int, min_alpha: float = 0.2, weights: Sequence[float] | None = None) -> str:
    """Which task trains at ``step``.

    round_robin: tasks in turn. proportional: P(task) ~ its number of training items. annealed (Stickland & Murray
    2019): P(task) ~ size ** alpha with alpha going linearly from 1 to ``min_alpha``, so large tasks dominate early
    and small ones catch up later. dynamic: P(task) ~ the given ``weights`` (trainer/prioritization.py).
    """
    if sampling == "round_robin":
        return tasks[step % len(tasks)]
    sizes_arr = np.asarray(sizes, dtype=np.float64)
    if sampling == "proportional":
        weights = sizes_arr
    elif sampling == "annealed":
        progress = min(step / max(total_steps - 1, 1), 1.0)
        weights = sizes_arr ** (1.0 - (1.0 - min_alpha) * progress)
    elif sampling == "dynamic":
        if weights is None:
            raise ValueError("dynamic sampling needs the prioritizer's weights")
        weights = np.asarray(weights, dtype=np.float64)
    else:
        raise ValueError(f"unknown sampling {sampling!r}")
    rng = np.random.default_rng([seed, 7919, step])
    return tasks[int(rng.choice(len(tasks), p=weights / weights.sum()))]
