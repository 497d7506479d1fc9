"""The encoder (alone, or with one task's head after it) as captured CUDA graphs: one graph per (rows, length,
function) shape, replayed instead of launched kernel by kernel.

A MiniLM forward pass is ~100 small kernels; at batch 1 their launch gaps, not the arithmetic, set the latency. A
replayed graph launches them as one unit. Graphs have fixed shapes, so rows are padded up to a power of two (at most
``max_rows``; larger batches run eagerly) and lengths should come from a few buckets (the server's ``--pad-to
bucket``). A shape is captured the first time it is asked for (tens of milliseconds), then replayed.

A head in the same graph (:meth:`GraphedEncoder.run`) saves a batch of one task the head's own kernels, each a launch
and a Python call while the device waits, and the states' trip between them; only the head's small outputs come back.

All graphs share one memory pool: they never run at the same time (one caller at a time, see ``encode``), each
keeps its own static output, so their intermediate buffers can be the same memory. On a CPU device nothing is
captured: a "replay" runs the function on the same static inputs, so the padding, the inputs' copies and the outputs'
cuts are the same code where tests can run them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

import numpy as np
import torch

log = logging.getLogger("bertzoo.serving")

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# A captured function: the static device inputs (INPUTS) -> a tensor, or a tuple of them; shape-static and sync-free.
Captured = Callable[[dict[str, torch.Tensor]], "torch.Tensor | tuple[torch.Tensor, ...]"]


def padded_rows(rows: int) -> int:
    """The graph a batch of ``rows`` sequences runs in: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


class _Graph:
    """One captured shape: its static inputs (INPUTS, as one [3, rows, length] tensor on the device), their staging
    copy on the host (pinned on CUDA, so one asynchronous copy carries all three), the outputs a replay writes, and
    the replay."""

    def __init__(self, rows: int, length: int, device: torch.device, function: Captured) -> None:
        cuda = device.type == "cuda"
        # Rows beyond a batch's real ones keep whatever the last batch left there, or these: one attendable token,
        # so no row is fully masked (a fully masked softmax row is NaN, harmless but noisy).
        self.host = torch.zeros((len(INPUTS), rows, length), dtype=torch.int64, pin_memory=cuda)
        self.host[INPUTS.index("attention_mask"), :, 0] = 1
        self._host_view = self.host.numpy()
        self._device_inputs = self.host.to(device)
        self.static = dict(zip(INPUTS, self._device_inputs, strict=True))
        self._copied = torch.cuda.Event() if cuda else None  # the last copy from `host` is done: it may be refilled
        self._function, self._graph, self._outputs = function, None, None

    def capture(self, pool, warmup_runs: int, device: torch.device) -> None:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside capture: lazy initialisation, cuBLAS handles, autotuning
            for _ in range(warmup_runs):
                self._function(self.static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self._outputs = self._function(self.static)
        self._graph = graph

    def load(self, batch: dict[str, np.ndarray]) -> None:
        """``batch``'s inputs into the first rows of the static inputs (token_type_ids may be left out: all zeros)."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous batch's copy has left the pinned buffer
        rows = batch["input_ids"].shape[0]
        for k, name in enumerate(INPUTS):
            values = batch.get(name)
            self._host_view[k, :rows] = 0 if values is None else values
        self._device_inputs.copy_(self.host, non_blocking=self._copied is not None)
        if self._copied is not None:
            self._copied.record()

    def replay(self):
        if self._graph is None:  # a CPU device: run it again
            return self._function(self.static)
        self._graph.replay()
        return self._outputs


class GraphedEncoder:
    """``encode(batch)`` for numpy int64 inputs [rows, length]: the model's encoder states [rows, length, hidden]
    (float32, on the host), through a captured graph per padded shape; ``run(batch, key, function)`` any other
    function of the same inputs (the encoder and a head), through its own graphs."""

    def __init__(self, encode, device: torch.device, max_rows: int = 64, warmup_runs: int = 2) -> None:
        self._encode = encode  # inputs dict of device tensors -> states tensor; must be shape-static and sync-free
        self.device = device
        self.max_rows = max_rows
        self._warmup_runs = warmup_runs
        self._graphs: dict[tuple[int, int, Hashable], _Graph] = {}
        self._uncapturable: set[Hashable] = set()  # run() keys whose function could not be captured: run eagerly
        self._cuda = device.type == "cuda"
        self._pool = torch.cuda.graph_pool_handle() if self._cuda else None
        self._lock = threading.Lock()

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """The encoder's captured shapes (rows, length)."""
        return sorted((rows, length) for rows, length, key in self._graphs if key is None)

    @property
    def keys(self) -> list[tuple[int, int, Hashable]]:
        """Every captured graph: (rows, length, key), key None for the encoder alone."""
        return sorted(self._graphs, key=repr)

    def _capture(self, rows: int, length: int, key: Hashable, function: Captured) -> _Graph:
        graph = _Graph(rows, length, self.device, function)
        if self._cuda:
            graph.capture(self._pool, self._warmup_runs, self.device)
        self._graphs[(rows, length, key)] = graph
        return graph

    def _replay(self, batch: dict[str, np.ndarray], key: Hashable, function: Captured):
        """Fill the static inputs of ``batch``'s padded shape (captured on first use) and replay it; the lock must be
        held, and the outputs read before it is let go."""
        rows, length = batch["input_ids"].shape
        padded = padded_rows(rows)
        graph = self._graphs.get((padded, length, key)) or self._capture(padded, length, key, function)
        graph.load(batch)
        return graph.replay()

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray | None:
        """The states, or None when the batch has more rows than ``max_rows`` (the caller runs it eagerly)."""
        states = self.encode_tensor(batch)
        return None if states is None else states.float().cpu().numpy()  # .cpu() waits for the replay

    def encode_tensor(self, batch: dict[str, np.ndarray]) -> torch.Tensor | None:
        """:meth:`encode`'s states left on the device, in the encoder's dtype: a copy, which the next replay does not
        overwrite."""
        rows = batch["input_ids"].shape[0]
        if padded_rows(rows) > self.max_rows:
            return None
        with self._lock:
            return self._replay(batch, None, self._encode)[:rows].clone()

    def run(self, batch: dict[str, np.ndarray], key: Hashable, function: Captured, keep: Callable[[int], int]
            ) -> tuple[np.ndarray, ...] | None:
        """``function``'s outputs (a tuple of tensors, each with a leading dimension over the padded rows or some
        share of them) for ``batch``, through the graphs of ``key``, on the host as float32: each cut to its first
        ``keep(rows)`` entries (the real rows' outputs). None when the batch has more rows than ``max_rows``, or when
        ``function`` could not be captured (a head that synchronises with the host, or whose shapes follow the
        data): logged once, and the caller runs that key's batches eagerly from then on."""
        rows, length = batch["input_ids"].shape
        padded = padded_rows(rows)
        if padded > self.max_rows or key in self._uncapturable:
            return None
        with self._lock:
            try:
                outputs = self._replay(batch, key, function)
            except Exception as e:  # noqa: BLE001 (any capture failure means: run it eagerly)
                if (padded, length, key) in self._graphs:
                    raise  # a replay failed, not a capture: this batch's error
                self._uncapturable.add(key)
                log.warning("could not capture %s as a CUDA graph (%s: %s); running it eagerly", key,
                            type(e).__name__, e)
                return None
            return tuple(o[:keep(rows)].float().cpu().numpy() for o in outputs)  # .cpu() waits for the replay
