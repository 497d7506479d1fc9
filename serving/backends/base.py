"""What every backend shares: the encoder's input and output names, how a padded batch becomes the encoder's feed
(packed where the graph takes packed tokens), how states become sentence embeddings, and the error that says a
backend cannot run here and what to install. (The CPU's instruction-set flags are ``bertzoo.cpu``'s.)"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertzoo.packing import is_packed, pack_batch

# A padded encoder graph's inputs (export/onnx_graphs.py): TensorRT's, Triton's, and older artifacts' encoder.onnx.
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
ENCODER_OUTPUT = "last_hidden_state"
EMBED = "embed"  # the Embed RPC's task: not a head, the pooled encoder states


def encoder_feed(batch: dict[str, np.ndarray], input_names: list[str] | tuple[str, ...]) -> dict[str, np.ndarray]:
    """The encoder graph's inputs for a padded ``batch``: packed where the graph takes packed tokens, else the
    padded arrays as they are; int64 and contiguous either way."""
    if is_packed(input_names):
        return pack_batch(batch)
    return {name: np.ascontiguousarray(batch[name], dtype=np.int64) for name in ENCODER_INPUTS if name in input_names}


def row_index(rows: Sequence[int]) -> Sequence[int] | slice:
    """``rows`` (increasing) as a slice where they are consecutive (a batch of one task: all of it), which numpy
    takes as a view instead of gathering a copy."""
    return slice(rows[0], rows[-1] + 1) if rows and rows[-1] - rows[0] == len(rows) - 1 else rows


def rows_mask(mask: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    """The attention mask of ``rows``, cut to the longest of them (right padding: the real tokens come first)."""
    mask = mask[row_index(rows)]
    return np.ascontiguousarray(mask[:, :int(mask.sum(axis=1).max())], dtype=np.int64)


def pool_embeddings(states: np.ndarray, mask: np.ndarray, pooling: str) -> np.ndarray:
    """Sentence embeddings [n, h]: the model's pooling ([CLS], or the mean over real tokens), L2-normalised."""
    if pooling == "cls":
        pooled = states[:, 0].astype(np.float64)
    else:
        weights = mask[..., None].astype(np.float64)
        pooled = (states * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
    norms = np.linalg.norm(pooled, axis=-1, keepdims=True)
    return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


class BackendUnavailable(RuntimeError):
    """The backend or device asked for cannot run in this installation; the message says what to install."""
