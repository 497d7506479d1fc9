"""Every engine that can answer, behind the one small protocol of ``bertzoo.pipeline.Backend``: ``encode(batch)`` runs
the encoder on a padded batch, ``head(task, inputs)`` one task's head on encoder states, numpy in and out. An engine
that keeps the states on its device (a GPU) sets ``resident_states`` and gives ``encode_resident(batch)``, whose
states ``serving.engine.run_batch`` selects rows of there, so no host round trip happens between encoder and heads.

- ``ort.OnnxRuntimeBackend``: an export artifact's graphs on ONNX Runtime, CPU or CUDA (torch-free);
- ``pytorch.TorchBackend``: the PyTorch model itself, fp32 / fp16 / bf16, CPU or CUDA, optionally as CUDA graphs;
- ``trt.TensorRTWithOrtHeads``: the artifact's TensorRT encoder engine with the heads on ONNX Runtime;
- ``openvino.OpenVinoBackend``: the artifact's encoder on OpenVINO (CPU, fp32 or bf16), the heads on ONNX Runtime.

:func:`create_backend` is the one place an engine is chosen: ``bertzoo serve``, ``bertzoo eval``, the export's parity
gates and the benchmarks call it. Each engine's module imports its heavy dependency (onnxruntime, torch, tensorrt,
openvino)
only when an engine is made, so the torch-free install imports all of them.
"""

from __future__ import annotations

from pathlib import Path

from bertzoo.artifact import load_manifest

from .base import BackendUnavailable
from .openvino import OpenVinoBackend
from .ort import DeviceStates, OnnxRuntimeBackend, ort_providers, provider_names, session_options
from .pytorch import TorchBackend
from .trt import TensorRTBackend, TensorRTWithOrtHeads

ENGINES = ("onnxruntime", "torch", "tensorrt", "openvino")


def create_backend(kind: str, source, *, device: str | object | None = None, variant: str = "fp32", precision: str = "fp32",
                   threads: int | None = None, spinning: bool = False, cuda_graphs: bool = False,
                   manifest: dict | None = None, resident_states: bool | None = None, sparsegen: str = "auto",
                   cache_dir: str | Path | None = None):
    """An engine. ``source``: an export artifact directory (onnxruntime, tensorrt) or a MultitaskModel (torch, whose
    ``device`` may be a torch.device; None: where the model is; the artifact engines' default is the CPU).
    ``variant``: the artifact's encoder (fp32, optimized, int8; for tensorrt, the engine, tensorrt_fp16).
    ``precision``: the torch engine's encoder (fp32, fp16, bf16), or OpenVINO's inference precision (auto, fp32,
    bf16). ``sparsegen``: how ONNX Runtime runs an SSAF encoder's SparsegenLin (export/ort_kernel). ``cache_dir``:
    OpenVINO's compiled-model cache."""
    if kind == "onnxruntime":
        return OnnxRuntimeBackend(source, variant, threads=threads, device=device or "cpu", manifest=manifest,
                                  spinning=spinning, resident_states=resident_states, sparsegen=sparsegen)
    if kind == "tensorrt":
        manifest = manifest if manifest is not None else load_manifest(Path(source))
        return TensorRTWithOrtHeads.from_artifact(source, manifest, "tensorrt_fp16" if variant == "fp32" else variant,
                                                  threads=threads)
    if kind == "openvino":
        return OpenVinoBackend(source, precision, threads=threads, manifest=manifest, cache_dir=cache_dir)
    if kind == "torch":
        if isinstance(device, str):  # "cpu", "cuda"
            import torch

            device = torch.device(device)
        return TorchBackend(source, device, precision=precision, cuda_graphs=cuda_graphs)
    raise ValueError(f"engine must be one of {ENGINES}, got {kind!r}")


def check_model_dir(backend: str, model_dir: str, verify_key: str | None = None) -> None:
    """Fail fast when ``model_dir`` is not what ``backend`` serves: an export artifact, or for torch a checkpoint."""
    if backend == "torch":
        from bertzoo.trainer.checkpoint import resolve_checkpoint

        resolve_checkpoint(model_dir)  # NotACheckpoint names the path and what to pass
    else:
        load_manifest(model_dir, verify=False, verify_key=verify_key)  # file hashes: when the model loads


def check_available(backend: str, device: str) -> None:
    """Fail fast, before a server binds its port, when ``backend`` cannot run on ``device`` in this installation."""
    if backend == "onnxruntime":
        try:
            import onnxruntime  # noqa: F401
        except ImportError as e:
            raise BackendUnavailable(f"the onnxruntime backend needs ONNX Runtime ({e}): pip install "
                                     "'bertzoo[serve]', or 'bertzoo[serve-gpu]' for --device cuda") from e
        ort_providers(device)
        return
    if backend == "openvino":
        if device != "cpu":
            raise BackendUnavailable("the openvino backend runs on the CPU: drop --device cuda")
        try:
            import onnxruntime  # noqa: F401  (the heads)
            import openvino  # noqa: F401
        except ImportError as e:
            raise BackendUnavailable(f"the openvino backend needs OpenVINO and ONNX Runtime ({e}): "
                                     "pip install 'bertzoo[openvino]'") from e
        return
    try:
        import torch
    except ImportError as e:
        raise BackendUnavailable(f"the {backend} backend needs torch ({e}): pip install 'bertzoo[train]', or serve "
                                 "an export artifact with the onnxruntime backend, which needs no torch") from e
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(f"--device cuda: torch {torch.__version__} sees no CUDA GPU; install a CUDA build of "
                                 "torch on a machine with an NVIDIA driver")
    if backend == "tensorrt":
        from bertzoo.export.tensorrt import TensorRTUnavailable, require_tensorrt

        try:
            require_tensorrt()
        except TensorRTUnavailable as e:
            raise BackendUnavailable(str(e)) from e


__all__ = ["ENGINES", "BackendUnavailable", "DeviceStates", "OnnxRuntimeBackend", "OpenVinoBackend", "TensorRTBackend",
           "TensorRTWithOrtHeads", "TorchBackend", "check_available", "check_model_dir", "create_backend",
           "ort_providers", "provider_names", "session_options"]
