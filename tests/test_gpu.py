"""The GPU paths: PyTorch on CUDA (fp32, fp16, bf16, CUDA graphs), sparsegen-lin's CUDA kernel inside the model, ONNX
Runtime's CUDA provider, and `bertzoo serve --device cuda`. Marked ``gpu``: each skips with the reason on a machine
without an NVIDIA GPU (CI), and `benchmarks/gpu_check.py` measures the same paths at full size. On the CPU, the
start-up errors for a missing GPU or onnxruntime-gpu are tested instead."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import TINY_ENCODER, padded_and_packed_grads, serve_config

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU (torch.cuda.is_available() is False)")


def _has_ort_cuda() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


def tiny_model(attention: str = "softmax", **overrides):
    from bertzoo.trainer.heads import ModelConfig, MultitaskModel
    from bertzoo.trainer.model import EncoderConfig

    torch.manual_seed(0)
    encoder = EncoderConfig(**TINY_ENCODER, attention=attention, sparsegen_lambda=-3.0, sparsegen_impl="bisect",
                            **overrides)
    return MultitaskModel(ModelConfig(encoder=encoder, tasks=("sentiment", "paraphrase", "similarity", "qa"))).eval()


def batch(rows: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 2000, size=(rows, length), dtype=np.int64)
    mask = np.ones_like(ids)
    for row in range(1, rows, 2):
        mask[row, length // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("attention", ["softmax", "sparsegen_lin"])
@pytest.mark.parametrize("precision, graphs, atol", [("fp32", False, 1e-4), ("fp32", True, 1e-4),
                                                     ("fp16", True, 2e-2), ("bf16", False, 1e-1)])
def test_torch_cuda_backend_matches_cpu(attention, precision, graphs, atol):
    from bertzoo.serving.backends import TorchBackend

    reference = TorchBackend(tiny_model(attention))
    candidate = TorchBackend(tiny_model(attention).cuda(), torch.device("cuda"), precision, cuda_graphs=graphs)
    for rows, length in ((1, 16), (5, 40), (8, 40), (3, 16)):  # 5 and 8 rows share one captured graph
        inputs = batch(rows, length, seed=rows)
        ref, got = reference.encode(inputs), candidate.encode(inputs)
        real = inputs["attention_mask"].astype(bool)
        assert got.dtype == np.float32 and got.shape == ref.shape
        assert np.abs(ref[real] - got[real]).max() < atol
        heads_in = {"states": ref, "mask": inputs["attention_mask"]}
        for r, g in zip(reference.head("sentiment", heads_in), candidate.head("sentiment", heads_in), strict=True):
            np.testing.assert_allclose(g, r, atol=1e-4)
    if graphs:
        assert candidate.graphs.shapes == [(1, 16), (4, 16), (8, 40)]


@pytest.mark.gpu
@cuda
def test_sparsegen_op_on_cuda_is_the_triton_kernel_and_matches_the_reference():
    from bertzoo.trainer.sparsegen import sparsegen_lin

    scores = torch.randn(4, 12, 33, 33) * 3
    mask = torch.rand(4, 1, 1, 33) > 0.3
    mask[..., 0] = True
    reference = sparsegen_lin(scores.double(), mask, -3.0, "sort")
    got = sparsegen_lin(scores.cuda().requires_grad_(), mask.cuda(), -3.0, "bisect")
    assert (got.double().cpu() - reference).abs().max() < 1e-5
    got.sum().backward()  # the closed-form backward runs on the kernel's output


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("attention", ["softmax", "sparsegen_lin"])
@pytest.mark.parametrize("precision, atol", [("fp32", 1e-4), ("bf16", 5e-2)])
def test_packed_training_on_cuda_gives_the_padded_gradients(attention, precision, atol):
    """Training packs its tokens by default (``TrainConfig.pack_tokens``); on CUDA, under bf16 autocast too, and with
    the Triton sparsegen-lin kernel on the padded grid."""
    # No dropout: the two passes must compute the same function.
    encoder = tiny_model(attention, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).encoder.cuda().train()
    inputs = {name: torch.from_numpy(value).cuda() for name, value in batch(6, 24, seed=3).items()}
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    weights = torch.randn(*ids.shape, TINY_ENCODER["hidden_size"], device="cuda")
    padded, packed = padded_and_packed_grads(encoder, ids, mask, weights, bf16=precision == "bf16")
    assert padded.keys() == packed.keys() and len(padded) > 10
    for name in padded:
        scale = padded[name].abs().max().clamp_min(1.0)  # bf16 rounds relative to each gradient's size
        assert (packed[name] - padded[name]).abs().max() <= atol * scale, name


@pytest.mark.gpu
@cuda
@pytest.mark.skipif(not _has_ort_cuda(), reason="onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
@pytest.mark.parametrize("sparsegen", ["function", "formulation"])
def test_onnxruntime_cuda_backend_matches_cpu(tmp_path, tiny_artifact, sparsegen):
    from bertzoo.serving.backends import OnnxRuntimeBackend

    _, artifact = tiny_artifact
    reference = OnnxRuntimeBackend(artifact, device="cpu")
    candidate = OnnxRuntimeBackend(artifact, device="cuda", sparsegen=sparsegen)
    inputs = batch(4, 24)
    np.testing.assert_allclose(candidate.encode(inputs), reference.encode(inputs), atol=1e-4)


@pytest.mark.gpu
@cuda
@pytest.mark.skipif(not _has_ort_cuda(), reason="onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
def test_onnxruntime_cuda_keeps_the_states_on_the_gpu_between_encoder_and_heads(tiny_artifact):
    import onnxruntime as ort

    from bertzoo.serving.backends import OnnxRuntimeBackend
    from bertzoo.serving.engine import HostStates

    _, artifact = tiny_artifact
    candidate = OnnxRuntimeBackend(artifact, device="cuda")
    assert candidate.resident_states  # the default on cuda
    inputs = batch(4, 24)
    states, mask = candidate.encode_resident(inputs).select([2, 0])
    assert isinstance(states, ort.OrtValue) and states.device_name().lower() == "cuda"
    want, want_mask = HostStates(OnnxRuntimeBackend(artifact).encode(inputs), inputs["attention_mask"]).select([2, 0])
    np.testing.assert_array_equal(mask, want_mask)
    np.testing.assert_allclose(states.numpy(), want, atol=1e-4)
    np.testing.assert_allclose(candidate.head("sentiment", {"states": states, "mask": mask})[0],
                               OnnxRuntimeBackend(artifact).head("sentiment", {"states": want, "mask": want_mask})[0],
                               atol=1e-4)


@pytest.mark.gpu
@cuda
def test_serve_on_cuda_reports_device_and_precision(tiny_artifact):
    from bertzoo.serving.client import BertzooClient
    from bertzoo.serving.grpc_server import ServerThread

    run, _ = tiny_artifact
    config = serve_config(run, backend="torch", device="cuda")
    with ServerThread(config) as running, BertzooClient(f"127.0.0.1:{running.port}") as client:
        client.wait_ready(timeout=120)
        info = client.model_info()
        assert (info.backend, info.device, info.precision) == ("torch", "cuda", "fp16")
        answer = client.sentiment(["a gorgeous, witty film", "dull"])
        assert len(answer.results) == 2


@pytest.mark.gpu
@cuda
def test_the_servers_largest_batch_fits_its_cuda_graphs(tiny_artifact):
    """A graph holds the server's largest batch (rows up to the next power of two), so raising --max-batch-size does
    not send the largest batches off the graphs to run eagerly."""
    from dataclasses import replace

    from bertzoo.serving.model import load_served_model

    run, _ = tiny_artifact
    config = serve_config(run, backend="torch", device="cuda")
    config = replace(config, batch=replace(config.batch, max_batch_size=100))
    assert load_served_model(config).backend.graphs.max_rows == 128


def test_cuda_device_without_a_gpu_or_onnxruntime_gpu_names_what_to_install(monkeypatch):
    """On a machine without the GPU pieces, asking for them stops at start with one line naming the package."""
    import onnxruntime as ort

    from bertzoo.serving.backends import BackendUnavailable, check_available

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(BackendUnavailable, match="onnxruntime-gpu"):
        check_available("onnxruntime", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailable, match="CUDA build of torch"):
        check_available("torch", "cuda")
    check_available("onnxruntime", "cpu")  # and the CPU needs nothing more


def test_serve_config_rejects_gpu_only_settings_on_the_cpu():
    from bertzoo.serving.config import ServeConfig

    with pytest.raises(ValueError, match="--device cuda"):
        ServeConfig("x", backend="tensorrt")
    with pytest.raises(ValueError, match="needs --device cuda"):
        ServeConfig("x", backend="torch", precision="fp16")
    with pytest.raises(ValueError, match="chosen at export"):
        ServeConfig("x", backend="onnxruntime", device="cuda", precision="fp16")
    assert ServeConfig("x", backend="torch", device="cuda").resolved_precision == "fp16"
    assert ServeConfig("x", backend="torch").resolved_precision == "fp32"
