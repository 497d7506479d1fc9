"""Attention probability functions: softmax and sparsegen-lin (Laha et al. 2018; used by SSAF, Cui et al. 2019).

sparsegen-lin with coefficient ``lam < 1`` is ``p = max(0, (z - tau) / (1 - lam))`` with ``tau`` chosen so that ``p`` sums
to 1. It equals sparsemax of ``z / (1 - lam)``: lam = 0 is sparsemax, lam -> 1 approaches argmax, and a negative lam
flattens the scores first, so fewer weights become exactly zero.

Two ways to find the threshold, both exact:
- ``sort``: the textbook algorithm (sort, cumulative sum, support size k).
- ``bisect``: sort-free. Bisection on ``tau`` brackets the support without sorting, then Michelot's fixed-point step
  ``tau = (sum of z over {z > tau} - 1) / |{z > tau}|`` recomputes ``tau`` in closed form from that support. Michelot's
  step only moves up and stops at the exact threshold once the support is right, so a few steps after the bracket give
  the same answer as sorting, to float rounding.

The backward pass is the closed form shared by both (Martins & Astudillo 2016): on the support S,
``dz = (g - mean_S(g)) / (1 - lam)``, and zero elsewhere. It needs only ``p`` from the forward pass.

Where each runs: ``bisect`` on CUDA is a Triton program per row (export/sparsegen_gpu_kernel.py), and on the CPU, for
float32 scores with the encoder's key mask, one native pass per row for the forward and one for the backward
(trainer/sparsegen_cpu.cc via sparsegen_native.py); everything else runs the eager code below.

Masked keys (padding) get exactly zero weight under both functions. Scores are computed in float32 and shifted by
each row's maximum first, so very large scores neither overflow nor lose the support.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import sparsegen_native

ATTENTION_FUNCTIONS = ("softmax", "sparsegen_lin")
SPARSEGEN_IMPLS = ("sort", "bisect")
_BISECT_STEPS = 24  # brackets tau to 2**-24 of the [max - 1, max] interval: the support is then right in practice
_MICHELOT_STEPS = 3  # each fixes the rare elements left inside the last bracket; exact once nothing changes


def _at_least_fp32(x: Tensor) -> Tensor:
    # bf16/fp16 scores are upcast (the cumulative sums need the range); float64 stays float64 for gradcheck.
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _prepare(scores: Tensor, mask: Tensor | None, lam: float) -> tuple[Tensor, Tensor]:
    """Scale by 1/(1 - lam), shift each row so its largest real score is 0, and fill masked keys with -inf."""
    if not lam < 1.0:
        raise ValueError(f"sparsegen-lin needs lambda < 1, got {lam}")
    z = _at_least_fp32(scores) / (1.0 - lam)
    valid = torch.ones_like(z, dtype=torch.bool) if mask is None else mask.expand_as(z).bool()
    z = z.masked_fill(~valid, float("-inf"))
    row_max = z.amax(dim=-1, keepdim=True)
    # A fully masked row has max -inf; shifting by 0 keeps it -inf (its output is all zeros below).
    z = z - torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    return z, valid


def _threshold_sort(z: Tensor, valid: Tensor) -> Tensor:
    z_sorted, _ = torch.sort(z, dim=-1, descending=True)
    finite = torch.isfinite(z_sorted)
    z_sorted = torch.where(finite, z_sorted, torch.zeros_like(z_sorted))  # masked keys sort last; add nothing
    cumsum = z_sorted.cumsum(dim=-1)
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    in_support = finite & (1.0 + k * z_sorted > cumsum)
    support_size = in_support.sum(dim=-1, keepdim=True).clamp(min=1)
    return (cumsum.gather(-1, support_size - 1) - 1.0) / support_size.to(z.dtype)


def _threshold_bisect(z: Tensor, valid: Tensor) -> Tensor:
    # With the row max at 0, tau lies in [-1, 0): p_max = 0 - tau <= 1 and p sums to 1.
    lo = torch.full_like(z[..., :1], -1.0)
    hi = torch.zeros_like(lo)
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        mass = (z - mid).clamp(min=0).sum(dim=-1, keepdim=True)  # masked keys: -inf - mid clamps to 0
        too_low = mass >= 1.0
        lo = torch.where(too_low, mid, lo)
        hi = torch.where(too_low, hi, mid)
    tau = lo  # mass(lo) >= 1, so lo <= tau*: Michelot's steps from below converge to tau* exactly
    z_finite = torch.where(valid, z, torch.zeros_like(z))
    for _ in range(_MICHELOT_STEPS):
        support = valid & (z > tau)
        size = support.sum(dim=-1, keepdim=True).clamp(min=1)
        tau = ((z_finite * support).sum(dim=-1, keepdim=True) - 1.0) / size.to(z.dtype)
    return tau


# A registered custom op rather than an autograd.Function: eager training runs the same code, and torch.export sees
# one opaque ``bertzoo::sparsegen_lin`` node, which the ONNX export maps to a single ``SparsegenLin`` node of our own
# domain (bertzoo.export) instead of tracing the sort or the bisection loop into primitive ops.
@torch.library.custom_op("bertzoo::sparsegen_lin", mutates_args=())
def _sparsegen_lin_op(scores: Tensor, mask: Tensor | None, lam: float, impl: str) -> Tensor:
    return _sparsegen_lin_eager(scores, mask, lam, impl)


def _sparsegen_lin_eager(scores: Tensor, mask: Tensor | None, lam: float, impl: str) -> Tensor:
    z, valid = _prepare(scores, mask, lam)
    tau = _threshold_sort(z, valid) if impl == "sort" else _threshold_bisect(z, valid)
    return torch.where(valid, (z - tau).clamp(min=0), torch.zeros_like(z)).to(scores.dtype)


@_sparsegen_lin_op.register_kernel("cuda")
def _(scores: Tensor, mask: Tensor | None, lam: float, impl: str) -> Tensor:
    # On a GPU the bisect threshold runs as one Triton program per row (export/sparsegen_gpu_kernel.py, the same steps as
    # _threshold_bisect) instead of ~60 eager kernels over the whole score tensor. float64 (gradcheck), rows longer
    # than the kernel's register block and machines without triton stay on the eager code; so does `sort`, the
    # textbook oracle.
    if impl == "bisect" and scores.dtype != torch.float64:
        try:
            from bertzoo.export import sparsegen_gpu_kernel
        except ImportError:
            sparsegen_gpu_kernel = None
        if sparsegen_gpu_kernel is not None and 0 < scores.shape[-1] <= sparsegen_gpu_kernel.MAX_KEYS:
            return sparsegen_gpu_kernel.sparsegen_lin_triton(scores, mask, lam)
    return _sparsegen_lin_eager(scores, mask, lam, impl)


@_sparsegen_lin_op.register_kernel("cpu")
def _(scores: Tensor, mask: Tensor | None, lam: float, impl: str) -> Tensor:
    # On the CPU the bisect threshold runs as one native pass per row (trainer/sparsegen_cpu.cc, Michelot's exact
    # iteration) instead of ~40 eager passes over the whole score tensor; where it does not apply (no compiler, another
    # dtype or mask shape) the eager code gives the same result. `sort`, the textbook oracle, stays eager.
    if impl == "bisect":
        probs = sparsegen_native.forward(scores, mask, lam)
        if probs is not None:
            return probs
    return _sparsegen_lin_eager(scores, mask, lam, impl)


@_sparsegen_lin_op.register_fake
def _(scores: Tensor, mask: Tensor | None, lam: float, impl: str) -> Tensor:
    return torch.empty_like(scores)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(output)
    ctx.lam, ctx.impl = inputs[2], inputs[3]


def _backward(ctx, grad_p: Tensor):
    (p,) = ctx.saved_tensors
    if ctx.impl == "bisect":  # on the CPU, one native pass per row where it applies (as the forward)
        grad_scores = sparsegen_native.backward(p, grad_p, ctx.lam)
        if grad_scores is not None:
            return grad_scores, None, None, None
    p = _at_least_fp32(p)
    support = (p > 0).to(p.dtype)
    g = _at_least_fp32(grad_p) * support
    mean_g = g.sum(dim=-1, keepdim=True) / support.sum(dim=-1, keepdim=True).clamp(min=1)
    grad_scores = support * (g - mean_g) / (1.0 - ctx.lam)
    return grad_scores.to(grad_p.dtype), None, None, None


_sparsegen_lin_op.register_autograd(_backward, setup_context=_setup_context)


def sparsegen_lin(scores: Tensor, mask: Tensor | None = None, lam: float = 0.0, impl: str = "sort") -> Tensor:
    """sparsegen-lin over the last dimension. ``mask`` is True (or 1) for keys that may be attended, broadcastable."""
    if impl not in SPARSEGEN_IMPLS:
        raise ValueError(f"sparsegen impl must be one of {SPARSEGEN_IMPLS}, got {impl!r}")
    if not lam < 1.0:
        raise ValueError(f"sparsegen-lin needs lambda < 1, got {lam}")
    return _sparsegen_lin_op(scores, mask, float(lam), impl)


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax in float32 whose masked keys get exactly zero (an additive -10000 bias would leave tiny weights)."""
    z = _at_least_fp32(scores)
    if mask is not None:
        valid = mask.expand_as(z).bool()
        z = z.masked_fill(~valid, float("-inf"))
        p = torch.softmax(z, dim=-1)
        p = torch.nan_to_num(p, nan=0.0)  # a fully masked row: 0/0 -> 0
    else:
        p = torch.softmax(z, dim=-1)
    return p.to(scores.dtype)


def attention_probs(scores: Tensor, mask: Tensor | None, function: str, lam: float = 0.0, impl: str = "sort") -> Tensor:
    if function == "softmax":
        return masked_softmax(scores, mask)
    if function == "sparsegen_lin":
        return sparsegen_lin(scores, mask, lam, impl)
    raise ValueError(f"attention function must be one of {ATTENTION_FUNCTIONS}, got {function!r}")
