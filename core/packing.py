"""Packed encoder inputs: a padded batch's real tokens only, and where each of them sits in the padded grid.

Why: nearly all of a small BERT's work is per token (the Q/K/V, output and FFN projections; attention over a
sentence's few dozen tokens is a small share of it). A padded batch spends that work on its padding too.
The exported encoder graph therefore takes its tokens packed, runs every per-token layer on those alone, and uses
the padded grid only inside attention (``trainer/model.py``, ``Packing``). Its output is padded again, so heads,
pooling and post-processing see the same [batch, seq, hidden] states as before (zeros at padding).

Torch-free: the server's backends pack each batch here, just before the engine runs it.
"""

from __future__ import annotations

import numpy as np

# The packed encoder graph's inputs, in its order (export/onnx_graphs.py); n is the number of real tokens.
PACKED_INPUTS = (
    "input_ids",  # [n]
    "token_type_ids",  # [n]
    "position_ids",  # [n] each token's position in its sequence
    "token_index",  # [n] each token's place in the flattened [batch * seq] grid
    "pad_index",  # [batch * seq] each grid cell's token in [n + 1]; n, one past the last, stands for padding
    "attention_mask",  # [batch, seq] the padded grid's mask, for attention
)


def is_packed(input_names: list[str] | tuple[str, ...]) -> bool:
    """Whether an encoder graph with these inputs takes packed tokens (older artifacts' graphs take padded ones)."""
    return "pad_index" in input_names


def pack_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A right- or arbitrarily padded batch {input_ids, attention_mask, token_type_ids} [batch, seq] -> the packed
    encoder's inputs (``PACKED_INPUTS``), all int64."""
    mask = np.ascontiguousarray(batch["attention_mask"], dtype=np.int64)
    if mask.ndim != 2:
        raise ValueError(f"attention_mask must be [batch, seq], got shape {mask.shape}")
    rows, width = mask.shape
    token_index = np.flatnonzero(mask.reshape(-1))
    n = len(token_index)
    pad_index = np.full(rows * width, n, dtype=np.int64)
    pad_index[token_index] = np.arange(n, dtype=np.int64)
    return {
        "input_ids": np.asarray(batch["input_ids"], dtype=np.int64).reshape(-1)[token_index],
        "token_type_ids": np.asarray(batch["token_type_ids"], dtype=np.int64).reshape(-1)[token_index],
        "position_ids": token_index % width,  # a token's column in the grid is its position in its sequence
        "token_index": token_index.astype(np.int64, copy=False),
        "pad_index": pad_index,
        "attention_mask": mask,
    }
