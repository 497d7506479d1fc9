"""sparsegen-lin's forward and backward as one native pass per row on the CPU (``sparsegen_cpu.cc``), for training.

Built on first use with the system C++ compiler into the user's cache (``bertzoo.native``) and called through ctypes
on the tensors' memory: no torch headers, no build step at install. Built with OpenMP, its rows run on the OpenMP
threads torch already uses (the .cc says why); a compiler without OpenMP gives a one-thread build. Where it cannot be
had (no compiler, or ``BERTZOO_SPARSEGEN_NATIVE=0``) the functions here return None and sparsegen-lin stays on the
eager PyTorch code, which gives the same result (tests/test_sparsegen_native.py); the reason is logged once.

Takes float32 scores on the CPU with the encoder's key mask ([batch, 1, 1, keys], or none); anything else (another
dtype or device, another mask shape) is left to the eager code too.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch
from torch import Tensor

from bertzoo import native

log = logging.getLogger("bertzoo.trainer")

SOURCE = Path(__file__).with_name("sparsegen_cpu.cc")
LIBRARY_NAME = "libbertzoo_sparsegen_cpu.so"
_reason: str | None = None


@functools.cache
def _library() -> ctypes.CDLL | None:
    global _reason
    if os.environ.get("BERTZOO_SPARSEGEN_NATIVE", "1") == "0":
        _reason = "disabled by BERTZOO_SPARSEGEN_NATIVE=0"
        return None
    try:
        try:
            path = native.cached_library(SOURCE, LIBRARY_NAME, "sparsegen_cpu", ["-fopenmp"])
        except native.BuildError as openmp_error:  # a compiler without OpenMP (Apple clang): the caller's thread only
            path = native.cached_library(SOURCE, LIBRARY_NAME, "sparsegen_cpu")
            log.warning("sparsegen-lin: the native CPU kernel runs on one thread (the OpenMP build failed: %s)",
                        str(openmp_error).splitlines()[0])
        lib = ctypes.CDLL(str(path))
    except (native.BuildError, OSError) as e:
        _reason = str(e)
        log.warning("sparsegen-lin: the native CPU kernel is not used (%s); training runs the eager code", _reason)
        return None
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    lib.bertzoo_sparsegen_forward.argtypes = [ptr, ptr, ptr, i64, i64, i64, f32]
    lib.bertzoo_sparsegen_backward.argtypes = [ptr, ptr, ptr, i64, i64, f32]
    return lib


def available() -> bool:
    return _library() is not None


def unavailable_reason() -> str | None:
    _library()
    return _reason


def _key_mask(scores: Tensor, mask: Tensor | None) -> tuple[Tensor | None, int] | None:
    """The mask as contiguous bytes [batch, keys] and the score rows per mask row; None for a mask shape not handled."""
    if mask is None:
        return None, 1
    b, keys = scores.shape[0], scores.shape[-1]
    if scores.dim() != 4 or tuple(mask.shape) != (b, 1, 1, keys) or mask.device.type != "cpu":
        return None
    return mask.reshape(b, keys).to(torch.uint8).contiguous(), scores.shape[1] * scores.shape[2]


def forward(scores: Tensor, mask: Tensor | None, lam: float) -> Tensor | None:
    """sparsegen-lin over the last axis, or None where the native kernel does not apply (the caller runs eager)."""
    lib = _library()
    if lib is None or scores.dtype != torch.float32 or scores.device.type != "cpu" or scores.numel() == 0:
        return None
    keyed = _key_mask(scores, mask)
    if keyed is None:
        return None
    key_mask, rows_per_mask = keyed
    scores = scores.contiguous()
    out = torch.empty_like(scores)
    keys = scores.shape[-1]
    lib.bertzoo_sparsegen_forward(scores.data_ptr(), None if key_mask is None else key_mask.data_ptr(),
                                  out.data_ptr(), scores.numel() // keys, keys, rows_per_mask, 1.0 / (1.0 - lam))
    return out


def backward(probs: Tensor, grad_probs: Tensor, lam: float) -> Tensor | None:
    """d(scores) from the forward's output and d(probs), or None where the native kernel does not apply."""
    lib = _library()
    if (lib is None or probs.dtype != torch.float32 or grad_probs.dtype != torch.float32
            or probs.device.type != "cpu" or probs.numel() == 0):
        return None
    probs, grad_probs = probs.contiguous(), grad_probs.contiguous()
    out = torch.empty_like(probs)
    keys = probs.shape[-1]
    lib.bertzoo_sparsegen_backward(probs.data_ptr(), grad_probs.data_ptr(), out.data_ptr(), probs.numel() // keys,
                                   keys, 1.0 / (1.0 - lam))
    return out
