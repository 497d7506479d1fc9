"""sparsegen-lin against a brute-force reference, and the properties attention relies on."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from bertzoo.trainer.sparsegen import masked_softmax, sparsegen_lin

IMPLS = ("sort", "bisect")


def brute_force_sparsegen(z: np.ndarray, lam: float) -> np.ndarray:
    """Try every support S: the solution is the one whose threshold keeps exactly S positive (KKT conditions)."""
    z = z / (1.0 - lam)
    n = len(z)
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            s = list(support)
            tau = (z[s].sum() - 1.0) / size
            outside = [j for j in range(n) if j not in support]
            if all(z[j] > tau for j in s) and all(z[j] <= tau for j in outside):
                p = np.maximum(z - tau, 0.0)
                return p
    raise AssertionError("no support satisfied the KKT conditions")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("lam", [0.0, -3.0, -7.0, 0.5, 0.9])
def test_matches_brute_force(impl, lam):
    rng = np.random.default_rng(0)
    for _ in range(40):
        z = rng.normal(size=6) * rng.choice([0.1, 1.0, 5.0])
        expected = brute_force_sparsegen(z, lam)
        got = sparsegen_lin(torch.tensor(z[None], dtype=torch.float64), lam=lam, impl=impl)[0].numpy()
        np.testing.assert_allclose(got, expected, atol=1e-9)


@pytest.mark.parametrize("impl", IMPLS)
def test_lambda_zero_is_sparsemax_and_rows_sum_to_one(impl):
    z = torch.randn(3, 4, 9, 9) * 3
    p = sparsegen_lin(z, lam=0.0, impl=impl)
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 4, 9))
    assert (p == 0).any(), "sparsemax of spread-out scores must have exact zeros"
    # sparsemax = Euclidean projection onto the simplex; lambda scales the scores by 1/(1 - lambda).
    torch.testing.assert_close(sparsegen_lin(z, lam=-1.0, impl=impl), sparsegen_lin(z / 2, lam=0.0, impl=impl))


@pytest.mark.parametrize("impl", IMPLS)
def test_padding_keys_get_exactly_zero(impl):
    z = torch.randn(2, 3, 5, 7) * 10
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., 4:] = False
    z[0, ..., 4:] = 1e6  # huge scores on padding must not leak through the mask
    p = sparsegen_lin(z, mask, lam=-3.0, impl=impl)
    assert torch.equal(p[0, ..., 4:], torch.zeros_like(p[0, ..., 4:]))
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 3, 5))
    q = masked_softmax(z, mask)
    assert torch.equal(q[0, ..., 4:], torch.zeros_like(q[0, ..., 4:]))


@pytest.mark.parametrize("impl", IMPLS)
def test_large_scores_are_stable(impl):
    z = torch.tensor([[1e30, 0.0, 1e30 - 1e24, -1e30]])
    p = sparsegen_lin(z, lam=0.0, impl=impl)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(1))
    big = torch.randn(4, 16) * 1e4
    torch.testing.assert_close(sparsegen_lin(big, lam=-2.0, impl=impl), sparsegen_lin(big + 5e4, lam=-2.0, impl=impl))


def test_sort_and_bisect_agree_on_attention_shapes():
    torch.manual_seed(1)
    z = torch.randn(4, 12, 64, 64) * 4
    mask = torch.rand(4, 1, 1, 64) > 0.2
    mask[..., 0] = True
    for lam in (-7.0, -3.0, 0.0, 0.5):
        torch.testing.assert_close(sparsegen_lin(z, mask, lam, "sort"), sparsegen_lin(z, mask, lam, "bisect"),
                                   atol=1e-6, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck(impl):
    z = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True] * 5 + [False] * 2] * 3)
    assert torch.autograd.gradcheck(lambda x: sparsegen_lin(x, mask, -1.5, impl), (z,))


def test_fully_masked_row_is_zero_not_nan():
    p = sparsegen_lin(torch.randn(2, 4), torch.zeros(2, 4, dtype=torch.bool))
    assert torch.equal(p, torch.zeros(2, 4))


def test_lambda_must_be_below_one():
    with pytest.raises(ValueError, match="lambda < 1"):
        sparsegen_lin(torch.randn(2, 3), lam=1.0)


@pytest.mark.parametrize("scale", [0.3, 3.0, 1e4])
@pytest.mark.parametrize("lam", [0.0, -3.0, 0.5])
def test_onnx_function_bodies_match_torch(scale, lam):
    """Both ONNX definitions of SparsegenLin (the generic TopK body the model carries, and the sort-free formulation
    the ONNX Runtime backend swaps in) equal the torch reference, padded keys included."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from bertzoo.export.sparsegen_onnx import DOMAIN, OP_TYPE, function_proto, ort_function_proto

    rng = np.random.default_rng(0)
    scores = (rng.standard_normal((3, 2, 5, 37)) * scale).astype(np.float32)
    mask = np.ones((3, 1, 1, 37), dtype=bool)
    mask[1, ..., 20:] = False
    mask[2, ..., 1:] = False
    expected = sparsegen_lin(torch.from_numpy(scores), torch.from_numpy(mask), lam).numpy()
    for function in (function_proto(18), ort_function_proto(18)):
        node = helper.make_node(OP_TYPE, ["s", "m"], ["p"], domain=DOMAIN, **{"lambda": lam})
        shape = ["b", "h", "q", "k"]
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("s", TensorProto.FLOAT, shape),
                                                helper.make_tensor_value_info("m", TensorProto.BOOL, ["b", 1, 1, "k"])],
                                  [helper.make_tensor_value_info("p", TensorProto.FLOAT, shape)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)],
                                  functions=[function], ir_version=10)
        onnx.checker.check_model(model, full_check=True)
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"s": scores, "m": mask})[0]
        np.testing.assert_allclose(got, expected, atol=1e-6)
        assert (got[~np.broadcast_to(mask, got.shape)] == 0).all()
