"""sparsegen-lin as a Triton kernel: one program per attention row, sort-free, fp32 inside.

This is the GPU implementation behind the TensorRT ``SparsegenLin`` plugin (``export/tensorrt.py``). It mirrors
``_prepare`` + ``_threshold_bisect`` of ``trainer/sparsegen.py`` step by step, so the torch reference is its test oracle:

1. ``z = scores / (1 - lambda)`` in float32; masked keys are left out of everything below.
2. Shift by the row max over valid keys, so the largest valid z is 0 and ``tau`` lies in [-1, 0).
3. ``BISECT_STEPS`` halvings of [-1, 0] keep ``lo`` with ``mass(lo) = sum(max(0, z - lo)) >= 1``.
4. ``MICHELOT_STEPS`` fixed-point steps ``tau = (sum of z over {z > tau} - 1) / |{z > tau}|`` from ``lo`` (below the
   true threshold) land on the exact threshold once the support is right.
5. ``p = max(0, z - tau)`` on valid keys, exactly 0 on masked keys, stored in the input dtype.

Why sort-free: a row lives in registers (BLOCK <= 512 floats), and every step is one reduction over it; a sort would
need a bitonic network per row for the same answer.

The mask is passed per *group* of rows rather than per row: the graphs' mask is [batch, 1, 1, keys], so all
``heads * queries`` rows of one batch item share one mask row, and expanding it to [batch * heads * queries, keys]
would cost a copy as large as the scores themselves.

Set ``TRITON_INTERPRET=1`` before importing triton to run the kernel on CPU tensors (how the tests check it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_KEYS = 512  # one row per program in registers; BERT-style encoders stop at 512 positions
BISECT_STEPS = 24  # same as trainer/sparsegen.py::_BISECT_STEPS
MICHELOT_STEPS = 3  # same as trainer/sparsegen.py::_MICHELOT_STEPS


@triton.jit
def _sparsegen_lin_kernel(
    scores_ptr, mask_ptr, out_ptr,
    n_keys, rows_per_group, stride_row, stride_out, stride_mask,
    denom,
    BLOCK: tl.constexpr, BISECT_STEPS: tl.constexpr, MICHELOT_STEPS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # int64: rows * stride can pass 2**31 for long batches
    group = row // rows_per_group
    cols = tl.arange(0, BLOCK)
    in_row = cols < n_keys
    keep = tl.load(mask_ptr + group * stride_mask + cols, mask=in_row, other=0)
    valid = in_row & (keep != 0)
    x = tl.load(scores_ptr + row * stride_row + cols, mask=in_row, other=0.0).to(tl.float32)

    # Masked keys are kept finite (0) and excluded with `valid` below, instead of -inf as in the torch reference:
    # same result, without inf - inf arithmetic.
    z = x / denom
    n_valid = tl.sum(valid.to(tl.int32), axis=0)
    row_max = tl.max(tl.where(valid, z, float("-inf")), axis=0)
    row_max = tl.where(n_valid > 0, row_max, 0.0)  # a fully masked row: nothing to shift, its output is all 0
    z = tl.where(valid, z - row_max, 0.0)

    # Bisection (static_range unrolls: the loop-carried scalars need no fixed type across iterations).
    lo = row_max * 0.0 - 1.0
    hi = row_max * 0.0
    for _ in tl.static_range(BISECT_STEPS):
        mid = (lo + hi) * 0.5
        mass = tl.sum(tl.where(valid, tl.maximum(z - mid, 0.0), 0.0), axis=0)
        too_low = mass >= 1.0
        lo = tl.where(too_low, mid, lo)
        hi = tl.where(too_low, hi, mid)

    tau = lo
    for _ in tl.static_range(MICHELOT_STEPS):
        support = valid & (z > tau)
        size = tl.maximum(tl.sum(support.to(tl.float32), axis=0), 1.0)
        tau = (tl.sum(tl.where(support, z, 0.0), axis=0) - 1.0) / size

    p = tl.where(valid, tl.maximum(z - tau, 0.0), 0.0)
    tl.store(out_ptr + row * stride_out + cols, p.to(out_ptr.dtype.element_ty), mask=in_row)


def _mask_groups(mask: torch.Tensor | None, shape: torch.Size, rows: int, keys: int,
                 device: torch.device) -> tuple[torch.Tensor, int]:
    """(mask as int8 [groups, keys], rows per group) for a mask broadcastable to ``shape``."""
    if mask is None:
        return torch.ones((1, keys), dtype=torch.int8, device=device), rows
    mask = mask.to(device)
    if mask.dim() == len(shape) >= 2 and all(d == 1 for d in mask.shape[1:-1]):
        # [batch or 1, 1, ..., 1, keys or 1]: one mask row per leading index, shared by the rows behind it.
        lead = shape[0]
        groups = mask.expand(lead, *mask.shape[1:-1], keys).reshape(lead, keys)
        return groups.to(torch.int8).contiguous(), rows // lead if lead else 1
    # Any other broadcast: one mask row per score row (correct, costs a [rows, keys] int8 copy).
    return mask.expand(shape).reshape(rows, keys).to(torch.int8).contiguous(), 1


def sparsegen_lin_triton(scores: torch.Tensor, mask: torch.Tensor | None, lam: float,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """sparsegen-lin over the last axis of ``scores`` (e.g. [b, h, q, k]) with a broadcastable bool ``mask`` (e.g.
    [b, 1, 1, k], True = may attend). Returns (or fills ``out``, same shape and dtype) probabilities in the input dtype.
    """
    if not lam < 1.0:
        raise ValueError(f"sparsegen-lin needs lambda < 1, got {lam}")
    if scores.dim() == 0:
        raise ValueError("scores needs at least one axis (the keys)")
    keys = scores.shape[-1]
    if not 1 <= keys <= MAX_KEYS:
        raise ValueError(f"the sparsegen-lin kernel handles 1..{MAX_KEYS} keys per row, got {keys}")
    shape = scores.shape
    x = scores.reshape(-1, keys)
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = x.shape[0]
    result = torch.empty(shape, dtype=scores.dtype, device=scores.device) if out is None else out
    if result.shape != shape or result.dtype != scores.dtype:
        raise ValueError(f"out must be {tuple(shape)} {scores.dtype}, got {tuple(result.shape)} {result.dtype}")
    if rows == 0:
        return result
    # TRT hands the plugin contiguous buffers, so this view is the buffer itself; a strided `out` gets a copy-back.
    y = result.view(-1, keys) if result.is_contiguous() else torch.empty_like(x)
    groups, rows_per_group = _mask_groups(mask, shape, rows, keys, scores.device)
    block = triton.next_power_of_2(keys)
    _sparsegen_lin_kernel[(rows,)](
        x, groups, y, keys, rows_per_group, x.stride(0), y.stride(0), groups.stride(0), float(1.0 - lam),
        BLOCK=block, BISECT_STEPS=BISECT_STEPS, MICHELOT_STEPS=MICHELOT_STEPS,
        num_warps=4 if block >= 256 else (2 if block >= 128 else 1),
    )
    if not result.is_contiguous():
        result.copy_(y.view(shape))
    return result


__all__ = ["BISECT_STEPS", "MAX_KEYS", "MICHELOT_STEPS", "sparsegen_lin_triton"]
