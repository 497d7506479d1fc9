"""sparsegen-lin's native CPU kernel for training (trainer/sparsegen_cpu.cc): the same probabilities and gradients
as the eager reference, chosen for `bisect` on float32 CPU scores with the encoder's key mask, never for anything
else."""

from __future__ import annotations

import pytest
import torch

from bertzoo.trainer import sparsegen_native
from bertzoo.trainer.sparsegen import _sparsegen_lin_eager, sparsegen_lin

pytestmark = pytest.mark.skipif(not sparsegen_native.available(),
                                reason=f"native kernel unavailable: {sparsegen_native.unavailable_reason()}")


def _case(b: int, h: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, h, t, t, generator=g) * 4
    mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
    mask[0, ..., t // 2:] = False  # padding
    if b > 2:
        mask[2] = False  # a row with nothing to attend: all zeros
    return scores, mask


@pytest.mark.parametrize("lam", [-3.0, 0.0, 0.5])
@pytest.mark.parametrize("shape", [(3, 2, 7, 1), (4, 12, 33, 2), (2, 4, 128, 3)])
def test_native_forward_and_backward_equal_the_eager_reference(lam, shape):
    b, h, t, seed = shape
    scores, mask = _case(b, h, t, seed)
    native = scores.clone().requires_grad_(True)
    eager = scores.clone().double().requires_grad_(True)
    p_native = sparsegen_lin(native, mask, lam, "bisect")
    p_eager = _sparsegen_lin_eager(eager, mask, lam, "sort")  # float64, sorting: the textbook oracle
    torch.testing.assert_close(p_native.double(), p_eager, atol=2e-6, rtol=1e-5)
    assert torch.all(p_native[~mask.expand_as(p_native)] == 0)
    if b > 2:
        assert torch.all(p_native[2] == 0)
    weights = torch.randn(scores.shape, generator=torch.Generator().manual_seed(seed + 7))
    (p_native * weights).sum().backward()
    # The eager backward, from the same (float32) probabilities: the closed form on the support.
    support = (p_native.detach() > 0).double()
    g = weights.double() * support
    mean = g.sum(-1, keepdim=True) / support.sum(-1, keepdim=True).clamp(min=1)
    torch.testing.assert_close(native.grad.double(), support * (g - mean) / (1 - lam), atol=1e-5, rtol=1e-5)


def test_the_native_kernel_is_used_only_where_it_applies(monkeypatch):
    scores, mask = _case(2, 2, 9, 0)
    calls = []
    real = sparsegen_native.forward

    def spy(*args):
        out = real(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(sparsegen_native, "forward", spy)
    sparsegen_lin(scores, mask, -1.0, "bisect")
    sparsegen_lin(scores, mask, -1.0, "sort")  # the oracle never
    sparsegen_lin(scores.double(), mask, -1.0, "bisect")  # float64 (gradcheck): eager
    sparsegen_lin(scores, mask[:, :, :, :1].expand(2, 1, 9, 9).contiguous(), -1.0, "bisect")  # another mask shape
    assert calls == [True, False, False]


def test_a_compiler_without_openmp_gives_a_one_thread_kernel_with_the_same_results(monkeypatch, tmp_path):
    from bertzoo import native

    real = native.cached_library
    flags_tried = []

    def no_openmp(source, name, kind, flags=(), key_extra=b""):
        flags_tried.append(list(flags))
        if "-fopenmp" in flags:
            raise native.BuildError("unsupported option '-fopenmp'")
        return real(source, name, kind, flags, key_extra)

    scores, mask = _case(2, 4, 128, 5)  # 1,024 rows: the parallel path where OpenMP exists
    expected = sparsegen_native.forward(scores, mask, -3.0)  # the OpenMP build
    monkeypatch.setenv("BERTZOO_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "cached_library", no_openmp)
    sparsegen_native._library.cache_clear()
    try:
        assert sparsegen_native.available()
        assert torch.equal(sparsegen_native.forward(scores, mask, -3.0), expected)  # rows are independent
    finally:
        sparsegen_native._library.cache_clear()  # later tests load the OpenMP build again
    assert flags_tried == [["-fopenmp"], []]
