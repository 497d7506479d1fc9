"""What every engine shares: the encoder's input and output names, the CPU's instruction-set flags, and the error that
says an engine cannot run here and what to install."""

from __future__ import annotations

import numpy as np

ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the encoder graph's (export/onnx_graphs.py)
ENCODER_OUTPUT = "last_hidden_state"


def rows_mask(mask: np.ndarray, rows) -> np.ndarray:
    """The attention mask of ``rows``, cut to the longest of them (right padding: the real tokens come first)."""
    mask = mask[rows]
    return np.ascontiguousarray(mask[:, :int(mask.sum(axis=1).max())], dtype=np.int64)


class BackendUnavailable(RuntimeError):
    """The backend or device asked for cannot run in this installation; the message says what to install."""
