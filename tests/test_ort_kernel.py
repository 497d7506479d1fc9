"""The native ONNX Runtime SparsegenLin kernel (export/ort_kernel): same result as the torch reference, chosen by
ORT over the model's own function, and a clear error on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertzoo.trainer.sparsegen import sparsegen_lin

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from bertzoo.export import ort_kernel  # noqa: E402
from bertzoo.export.sparsegen_onnx import DOMAIN, OP_TYPE, attach_function  # noqa: E402


@pytest.fixture(scope="module")
def library():
    path = ort_kernel.library()
    if path is None:
        pytest.skip(f"native SparsegenLin kernel unavailable: {ort_kernel.unavailable_reason()}")
    return path


def _model(scores_shape: list, mask_shape: list, lam: float, function: onnx.FunctionProto | None = None):
    node = helper.make_node(OP_TYPE, ["s", "m"], ["p"], domain=DOMAIN, **{"lambda": lam})
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("s", TensorProto.FLOAT, scores_shape),
                                            helper.make_tensor_value_info("m", TensorProto.BOOL, mask_shape)],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, scores_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    model = attach_function(model)
    if function is not None:
        del model.functions[:]
        model.functions.append(function)
    return model


def _run(model, library, feeds: dict) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.register_custom_ops_library(str(library))
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("lam", [0.0, -3.0, 0.7])
@pytest.mark.parametrize("scale", [1.0, 30.0, 1e4])
@pytest.mark.parametrize("mask_shape", [(3, 1, 1, 37), (3, 1, 5, 37), (37,), (3, 2, 5, 1)])
def test_kernel_matches_torch(library, lam, scale, mask_shape) -> None:
    rng = np.random.default_rng(int(scale) + len(mask_shape))
    scores = (rng.standard_normal((3, 2, 5, 37)) * scale).astype(np.float32)
    mask = rng.random(mask_shape) > 0.3
    mask.reshape(-1)[:1] = False  # at least one masked key (or a fully masked row, for the broadcast last dim)
    if len(mask_shape) == 4 and mask_shape[-1] > 1:
        mask[0, ..., :] = False  # fully masked rows: all zeros, no NaN
        mask[1, ..., 1:] = False  # a single key left: probability exactly 1
    expected = sparsegen_lin(torch.from_numpy(scores), torch.from_numpy(mask), lam).numpy()
    model = _model(["b", "h", "q", "k"], [f"d{i}" for i in range(len(mask_shape))], lam)
    got = _run(model, library, {"s": scores, "m": mask})
    np.testing.assert_allclose(got, expected, atol=2e-6 * max(1.0, scale / 100))
    assert not np.isnan(got).any()
    assert (got[~np.broadcast_to(mask, got.shape)] == 0).all()


def test_ort_prefers_the_kernel_to_the_models_function(library) -> None:
    """A model whose function body is wrong on purpose (all zeros) still gives sparsegen-lin with the kernel
    registered: the kernel, not the function, ran. Without it, the wrong body runs (the test can fail)."""
    zeros = onnx.parser.parse_function(f"""
        <domain: "{DOMAIN}", opset_import: ["": 18]>
        {OP_TYPE} <lambda> (scores, mask) => (probs) {{
            probs = Sub (scores, scores)
        }}""")
    model = _model(["b", "k"], ["b", "k"], -1.0, function=zeros)
    scores = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    mask = np.ones((4, 16), dtype=bool)
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert (plain.run(None, {"s": scores, "m": mask})[0] == 0).all()
    got = _run(model, library, {"s": scores, "m": mask})
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(got, sparsegen_lin(torch.from_numpy(scores), torch.from_numpy(mask), -1.0).numpy(),
                               atol=1e-6)


def test_bad_lambda_and_bad_mask_fail_with_a_message(library) -> None:
    with pytest.raises(Exception, match="lambda must be < 1"):
        _run(_model(["b", "k"], ["b", "k"], 1.0), library, {"s": np.zeros((2, 3), np.float32),
                                                            "m": np.ones((2, 3), bool)})
    with pytest.raises(Exception, match="mask does not broadcast"):
        _run(_model(["b", "k"], ["x", "y"], 0.0), library, {"s": np.zeros((2, 3), np.float32),
                                                            "m": np.ones((2, 4), bool)})


def test_prepare_registers_the_kernel_only_for_ssaf_graphs_on_cpu(library) -> None:
    from bertzoo.export.sparsegen_onnx import ort_function_proto

    ssaf = _model(["b", "k"], ["b", "k"], 0.0)
    plain = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    models, native = ort_kernel.prepare({"plain": plain}, ort.SessionOptions(), ["CPUExecutionProvider"])
    assert not native and models["plain"] is plain
    models, native = ort_kernel.prepare({"ssaf": ssaf}, ort.SessionOptions(), ["CPUExecutionProvider"])
    assert native and models["ssaf"] is ssaf
    # A GPU provider in the list: the function body as exported (the kernel is CPU-only; on the GPU the body's TopK
    # and CumSum beat the formulation's Loop); asked for, the formulation.
    models, native = ort_kernel.prepare({"ssaf": ssaf}, ort.SessionOptions(),
                                        ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert not native and models["ssaf"] is ssaf
    models, native = ort_kernel.prepare({"ssaf": ssaf}, ort.SessionOptions(),
                                        ["CUDAExecutionProvider", "CPUExecutionProvider"], "formulation")
    assert not native
    assert models["ssaf"].functions[0] == ort_function_proto(18)
    with pytest.raises(RuntimeError, match="CPU provider alone"):
        ort_kernel.prepare({"ssaf": ssaf}, ort.SessionOptions(), ["CUDAExecutionProvider", "CPUExecutionProvider"],
                           "native")
