"""The SparsegenLin Triton kernel against the torch reference, and the TensorRT engine path.

The kernel runs anywhere: on CPU under the Triton interpreter, in a subprocess because TRITON_INTERPRET must be set
before triton is imported and must not leak into other tests of this pytest process. The TensorRT tests need the
tensorrt package and an NVIDIA GPU and skip with TensorRTUnavailable's message (what is missing, what to install).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import onnx
import pytest
import torch

from bertzoo.export import sparsegen_onnx
from bertzoo.export import tensorrt as bz_trt
from bertzoo.export.tensorrt import TensorRTUnavailable, require_tensorrt
from bertzoo.serving.backends import TensorRTBackend

# Run as `python -c KERNEL_CHECK <device>`; exits non-zero with the failing case on any mismatch.
KERNEL_CHECK = textwrap.dedent("""
    import os, sys
    device = sys.argv[1]
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch
    from bertzoo.export.sparsegen_gpu_kernel import sparsegen_lin_triton
    from bertzoo.trainer.sparsegen import sparsegen_lin

    def check(name, scores, mask, lam, atol=1e-5):
        got = sparsegen_lin_triton(scores, mask, lam)
        assert got.dtype == scores.dtype and got.shape == scores.shape, name
        for impl in ("bisect", "sort"):
            want = sparsegen_lin(scores.float(), mask, lam, impl).to(scores.dtype)
            err = (got.float() - want.float()).abs().max().item()
            assert err <= atol, f"{name} vs {impl}: max abs diff {err}"
        got = got.float()
        valid = torch.ones_like(got, dtype=torch.bool) if mask is None else mask.expand_as(got).bool()
        assert (got[~valid] == 0).all(), f"{name}: masked keys must get exactly 0"
        assert (got >= 0).all(), f"{name}: negative probability"
        live = valid.any(-1)
        sums = got.sum(-1)
        assert torch.allclose(sums[live], torch.ones_like(sums[live]), atol=10 * atol), f"{name}: rows do not sum to 1"
        assert (sums[~live] == 0).all(), f"{name}: fully masked rows must be all 0"

    gen = torch.Generator().manual_seed(0)
    n = 0
    for b, h, q, k in [(2, 3, 5, 7), (2, 2, 4, 100), (1, 2, 3, 512), (3, 1, 2, 16), (2, 1, 3, 1)]:
        for lam in (0.0, -2.0, 0.5):
            for scale in (3.0, 1e4):
                scores = (torch.randn(b, h, q, k, generator=gen) * scale).to(device)
                lengths = torch.randint(1, k + 1, (b,), generator=gen)
                mask = (torch.arange(k)[None, :] < lengths[:, None])[:, None, None, :].to(device)  # right padding
                check(f"{(b, h, q, k)} lam={lam} scale={scale}", scores, mask, lam)
                n += 1
    scores = torch.randn(3, 2, 4, 9, generator=gen).to(device)
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool, device=device)
    mask[1] = False  # a batch item with no real token at all
    check("fully masked item", scores, mask, -1.0)
    check("no mask", scores, None, 0.0)
    row_mask = torch.rand(3, 2, 4, 9, generator=gen).to(device) > 0.4  # one mask row per score row
    check("per-row mask", scores, row_mask, 0.0)
    check("strided scores", scores.transpose(1, 2), mask.transpose(1, 2), -2.0)
    check("ties", torch.zeros(1, 1, 2, 6, device=device), None, 0.0)
    check("fp16", (torch.randn(2, 2, 3, 20, generator=gen) * 4).to(device).half(), mask[:2, ..., :1].expand(2, 1, 1, 20),
          0.0, atol=1e-3)
    for bad in (lambda: sparsegen_lin_triton(scores, None, 1.0), lambda: sparsegen_lin_triton(torch.zeros(1, 513), None, 0)):
        try:
            bad()
        except ValueError:
            pass
        else:
            raise AssertionError("expected ValueError")
    print(f"checked {n + 6} cases on {device}")
""")


def _run_kernel_check(device: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", KERNEL_CHECK, device], cwd=tempfile.gettempdir(), env=env,
                          capture_output=True, text=True, timeout=600)


def _require_triton() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("could not import 'triton': the SparsegenLin kernel needs it (pip install triton)")


def test_kernel_matches_reference_under_triton_interpreter():
    _require_triton()
    result = _run_kernel_check("cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checked" in result.stdout


def test_kernel_on_cuda_matches_reference():
    _require_triton()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the compiled (non-interpreted) kernel needs one")
    result = _run_kernel_check("cuda")
    assert result.returncode == 0, result.stdout + result.stderr


def test_require_tensorrt_names_what_is_missing():
    try:
        trt = require_tensorrt()
    except TensorRTUnavailable as e:
        message = str(e)
        assert "tensorrt" in message.lower() or "gpu" in message.lower()
        assert "pip install tensorrt" in message
        if importlib.util.find_spec("tensorrt") is None:
            assert "`tensorrt` Python package" in message
        if not torch.cuda.is_available():
            assert "CUDA GPU" in message
    else:
        assert trt.__version__


def test_require_tensorrt_without_the_package_or_a_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` raise ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TensorRTUnavailable) as info:
        require_tensorrt()
    assert "`tensorrt` Python package" in str(info.value)
    assert "CUDA GPU" in str(info.value)
    assert isinstance(info.value, RuntimeError)


def test_profiles_cover_every_length_up_to_the_last_bucket():
    profiles = bz_trt._profiles((1, 8, 32), (128, 32, 64))
    assert [p["seq"] for p in profiles] == [(1, 32, 32), (33, 64, 64), (65, 128, 128)]
    assert all(p["batch"] == (1, 32, 32) for p in profiles)
    with pytest.raises(ValueError):
        bz_trt._profiles((), (32,))


def test_plugin_graph_points_the_node_at_the_plugin(tmp_path):
    T = onnx.TensorProto
    node = onnx.helper.make_node(sparsegen_onnx.OP_TYPE, ["scores", "mask"], ["probs"], domain=sparsegen_onnx.DOMAIN,
                                 **{"lambda": -1.0})
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("scores", T.FLOAT, [2, 4, 3, 3]),
                      onnx.helper.make_tensor_value_info("mask", T.BOOL, [2, 1, 1, 3])],
        [onnx.helper.make_tensor_value_info("probs", T.FLOAT, [2, 4, 3, 3])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    path = tmp_path / "g.onnx"
    onnx.save_model(sparsegen_onnx.attach_function(model), str(path))
    data, count = bz_trt._plugin_graph(path)
    assert count == 1
    rewritten = onnx.load_from_string(data)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in rewritten.graph.node[0].attribute}
    assert attrs == {bz_trt.LAMBDA_ATTR: pytest.approx(-1.0), "plugin_namespace": b"bertzoo"}
    assert not [f for f in rewritten.functions if f.name == sparsegen_onnx.OP_TYPE]
    assert len(onnx.load(str(path)).functions) == 1  # the artifact's own graph is untouched


@pytest.fixture(scope="module")
def trt_module():
    try:
        return require_tensorrt()
    except TensorRTUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tiny_export(trt_module, tmp_path_factory):
    from bertzoo.export.onnx_graphs import export_padded_encoder
    from bertzoo.trainer.heads import ModelConfig, MultitaskModel
    from bertzoo.trainer.model import EncoderConfig

    torch.manual_seed(0)
    encoder = EncoderConfig(vocab_size=3000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, attention="sparsegen_lin", sparsegen_lambda=-1.0)
    model = MultitaskModel(ModelConfig(encoder)).eval()
    out = tmp_path_factory.mktemp("trt")
    export_padded_encoder(model, out)  # TensorRT's profiles work on the padded [batch, seq] graph
    return model, out


def _batch(b: int, t: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.zeros((b, t), dtype=np.int64)
    for row, length in enumerate(rng.integers(1, t + 1, size=b)):
        mask[row, :length] = 1
    ids = np.where(mask == 1, rng.integers(1000, 2000, size=(b, t)), 0)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


@pytest.mark.parametrize("fp16, atol", [(False, 1e-2), (True, 6e-2)])  # fp32 engines may still use TF32 matmuls
def test_engine_matches_torch(tiny_export, trt_module, fp16, atol):
    model, out = tiny_export
    engine = out / f"encoder.{'fp16' if fp16 else 'fp32'}.plan"
    cache = out / "timing.cache"
    report = bz_trt.build_engine(out / "encoder.padded.onnx", engine, batch_sizes=(1, 4), seq_buckets=(8, 16, 32), fp16=fp16,
                                 timing_cache_path=cache)
    assert engine.is_file() and cache.is_file()
    assert not list(out.glob(".*.tmp"))
    assert report["sparsegen_plugins"] == 2  # one per layer: the plugin, not the ONNX function body
    assert report["precision"] == ("fp16" if fp16 and hasattr(trt_module.BuilderFlag, "FP16") else "fp32")
    assert [p["seq"] for p in report["profiles"]] == [[1, 8, 8], [9, 16, 16], [17, 32, 32]]

    bz_trt.register_sparsegen_plugin()  # idempotent: the backend registers again
    backend = TensorRTBackend(engine)
    for seed, (b, t) in enumerate([(1, 5), (3, 16), (4, 30), (2, 9)]):
        batch = _batch(b, t, seed)
        got = backend.encode(batch)
        with torch.no_grad():
            want = model.encode({k: torch.from_numpy(v) for k, v in batch.items()}).numpy()
        assert got.shape == want.shape == (b, t, 32) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=atol, err_msg=f"batch {b} x {t}")
    with pytest.raises(ValueError, match="no TensorRT profile"):
        backend.encode(_batch(1, 40, 0))
