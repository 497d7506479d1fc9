"""The encoder as captured CUDA graphs: one graph per (rows, length) shape, replayed instead of launched kernel by kernel.

A MiniLM forward pass is ~100 small kernels; at batch 1 their launch gaps, not the arithmetic, set the latency. A
replayed graph launches them as one unit. Graphs have fixed shapes, so rows are padded up to a power of two (at most
``max_rows``; larger batches run eagerly) and lengths should come from a few buckets (the server's ``--pad-to
bucket``). A shape is captured the first time it is asked for (tens of milliseconds), then replayed.

All graphs share one memory pool: they never run at the same time (one caller at a time, see ``encode``), each
keeps its own static output, so their intermediate buffers can be the same memory.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def padded_rows(rows: int) -> int:
    """The graph a batch of ``rows`` sequences runs in: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


class GraphedEncoder:
    """``encode(batch)`` for numpy int64 inputs [rows, length]: the model's encoder states [rows, length, hidden]
    (float32, on the host), through a captured graph per padded shape."""

    def __init__(self, encode, device: torch.device, max_rows: int = 64, warmup_runs: int = 2) -> None:
        self._encode = encode  # inputs dict of device tensors -> states tensor; must be shape-static and sync-free
        self.device = device
        self.max_rows = max_rows
        self._warmup_runs = warmup_runs
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self._lock = threading.Lock()

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return sorted(self._graphs)

    def _capture(self, rows: int, length: int):
        # Rows beyond a batch's real ones keep whatever the last batch left there, or these: one attendable token,
        # so no row is fully masked (a fully masked softmax row is NaN, harmless but noisy).
        static = {name: torch.zeros((rows, length), dtype=torch.int64, device=self.device) for name in INPUTS}
        static["attention_mask"][:, 0] = 1
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up outside capture: lazy initialisation, cuBLAS handles, autotuning
            for _ in range(self._warmup_runs):
                self._encode(static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._encode(static)
        entry = (graph, static, out)
        self._graphs[(rows, length)] = entry
        return entry

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray | None:
        """The states, or None when the batch has more rows than ``max_rows`` (the caller runs it eagerly)."""
        states = self.encode_tensor(batch)
        return None if states is None else states.float().cpu().numpy()  # .cpu() waits for the replay

    def encode_tensor(self, batch: dict[str, np.ndarray]) -> torch.Tensor | None:
        """:meth:`encode`'s states left on the device, in the encoder's dtype: a copy, which the next replay does not
        overwrite."""
        rows, length = batch["input_ids"].shape
        padded = padded_rows(rows)
        if padded > self.max_rows:
            return None
        with self._lock:
            graph, static, out = self._graphs.get((padded, length)) or self._capture(padded, length)
            for name in INPUTS:
                values = batch.get(name)
                if values is None:  # token_type_ids may be left out: all zeros
                    static[name][:rows].zero_()
                else:
                    static[name][:rows].copy_(torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)))
            graph.replay()
            return out[:rows].clone()
