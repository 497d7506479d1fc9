"""The TensorRT backend: the artifact's TensorRT encoder engine (``bertzoo export --trt``, with the SparsegenLin plugin)
and the heads on ONNX Runtime. tensorrt and torch (its CUDA streams and pinned buffers) are imported when one is made
(:func:`create`, its entry in ``serving.backends.BACKENDS``); the engine builder and the plugin are
export/tensorrt.py's."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from bertzoo.artifact import ArtifactError, load_manifest

from .base import ENCODER_INPUTS as INPUTS
from .base import ENCODER_OUTPUT as OUTPUT
from .base import BackendUnavailable
from .ort import OnnxRuntimeBackend

# What serve --backend tensorrt needs, in one line: tensorrt for the engine, triton for its SparsegenLin plugin, a CUDA
# build of torch for its streams and buffers, onnxruntime for the heads (on the GPU with onnxruntime-gpu).
INSTALL_HINT = ("on a machine with an NVIDIA GPU and driver, install a CUDA build of torch, then "
                "`pip install tensorrt triton 'bertzoo[serve-gpu]'` (PyPI's tensorrt fetches NVIDIA's tensorrt-cu* "
                "wheels at install time)")


class TensorRTBackend:
    """``encode`` on a TensorRT encoder engine (the Backend protocol of bertzoo.pipeline, without ``head``: heads
    stay on ONNX Runtime, see :class:`TensorRTWithOrtHeads`).

    One execution context per optimization profile, each bound to its profile once at start (switching a single
    context's profile costs a synchronisation per switch). Inputs and outputs pass through pinned host buffers, so the
    copies to and from the GPU are asynchronous on the engine's stream. Calls are serialized with a lock: the buffers
    and the stream are shared."""

    def __init__(self, engine_path: str | os.PathLike, device: int = 0) -> None:
        from bertzoo.export.tensorrt import _logger, register_sparsegen_plugin, require_tensorrt

        trt = require_tensorrt()
        register_sparsegen_plugin()  # the engine's plugin layers are looked up while deserializing
        import torch

        self._torch = torch
        self.device = torch.device("cuda", device)
        self._lock = threading.Lock()
        with torch.cuda.device(self.device):
            self._runtime = trt.Runtime(_logger(trt))  # kept alive: the engine must not outlive its runtime
            self._engine = self._runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
            if self._engine is None:
                raise RuntimeError(f"TensorRT could not deserialize {engine_path} (built by another TensorRT version "
                                   "or GPU?)")
            self._stream = torch.cuda.Stream(self.device)
            # (batch min, batch max, seq min, seq max) per profile, read from the engine so no side file is needed.
            self.profiles = []
            self._contexts = []
            for p in range(self._engine.num_optimization_profiles):
                low, _, high = self._engine.get_tensor_profile_shape(INPUTS[0], p)
                self.profiles.append((int(low[0]), int(high[0]), int(low[1]), int(high[1])))
                context = self._engine.create_execution_context()
                context.set_optimization_profile_async(p, self._stream.cuda_stream)
                self._contexts.append(context)
            self._stream.synchronize()
        self._dtypes = {name: self._torch_dtype(trt, name) for name in (*INPUTS, OUTPUT)}
        self._pinned: dict[str, object] = {}  # name -> pinned host tensor, grown to the largest call so far

    def _torch_dtype(self, trt, name: str):
        np_dtype = np.dtype(trt.nptype(self._engine.get_tensor_dtype(name)))
        return self._torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype

    def _profile_for(self, batch: int, seq: int) -> int:
        for p, (b_lo, b_hi, t_lo, t_hi) in enumerate(self.profiles):
            if b_lo <= batch <= b_hi and t_lo <= seq <= t_hi:
                return p
        raise ValueError(f"no TensorRT profile covers batch {batch} x length {seq}; the engine's profiles "
                         f"(batch min, max, length min, max) are {self.profiles}")

    def _host(self, name: str, shape: tuple[int, ...]):
        """A pinned host view of ``shape`` for tensor ``name`` (the buffer is reused, and grown when too small)."""
        size = int(np.prod(shape))
        buffer = self._pinned.get(name)
        if buffer is None or buffer.numel() < size:
            buffer = self._torch.empty(size, dtype=self._dtypes[name], pin_memory=True)
            self._pinned[name] = buffer
        return buffer[:size].view(shape)

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        torch = self._torch
        ids = np.asarray(batch["input_ids"])
        b, t = ids.shape
        context = self._contexts[self._profile_for(b, t)]
        arrays = {"input_ids": ids, "attention_mask": batch["attention_mask"],
                  "token_type_ids": batch.get("token_type_ids", np.zeros_like(ids))}
        with self._lock, torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            # Everything below is queued on one stream: the copies in, the engine, the copy out.
            feeds = {}
            for name in INPUTS:
                host = self._host(name, (b, t))
                host.copy_(torch.from_numpy(np.ascontiguousarray(arrays[name])))
                feeds[name] = host.to(self.device, non_blocking=True)
                context.set_input_shape(name, (b, t))
                context.set_tensor_address(name, feeds[name].data_ptr())
            shape = tuple(context.get_tensor_shape(OUTPUT))
            out = torch.empty(shape, dtype=self._dtypes[OUTPUT], device=self.device)
            context.set_tensor_address(OUTPUT, out.data_ptr())
            if not context.execute_async_v3(self._stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")
            result = self._host(OUTPUT, shape)
            result.copy_(out, non_blocking=True)
            self._stream.synchronize()  # the pinned buffers are reused by the next call
            # A copy: the pinned buffer is the next call's. float32 whatever the engine's output type.
            return result.to(torch.float32, copy=True).numpy()


class TensorRTWithOrtHeads:
    """The artifact's TensorRT encoder engine (``export/tensorrt.py``) with the heads on ONNX Runtime, which are small
    and stay float32 (on the same GPU where onnxruntime-gpu is installed, else on the CPU)."""

    def __init__(self, encoder, heads: OnnxRuntimeBackend, variant: str = "tensorrt_fp16") -> None:
        self._encoder, self._heads = encoder, heads
        self.tasks = heads.tasks
        self.variant = variant  # the artifact's engine
        self.precision = variant.removeprefix("tensorrt_")  # what the engine was built to compute in

    @classmethod
    def from_artifact(cls, directory: str | Path, manifest: dict, variant: str = "tensorrt_fp16",
                      threads: int | None = None) -> TensorRTWithOrtHeads:
        from bertzoo.export.tensorrt import TensorRTUnavailable

        encoders = manifest["graphs"]["encoder"]["files"]
        if variant not in encoders:
            raise ArtifactError(f"{directory}: no TensorRT engine in this artifact (its encoders: {sorted(encoders)}); "
                                "export it with `bertzoo export --trt` on the GPU that will serve it")
        try:
            encoder = TensorRTBackend(Path(directory) / encoders[variant])
        except TensorRTUnavailable as e:
            raise BackendUnavailable(str(e)) from e
        try:
            heads = OnnxRuntimeBackend(directory, threads=threads, device="cuda", manifest=manifest, encoder=False)
        except BackendUnavailable:
            heads = OnnxRuntimeBackend(directory, threads=threads, device="cpu", manifest=manifest, encoder=False)
        return cls(encoder, heads, variant)

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return self._encoder.encode(batch)

    def head(self, task: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        return self._heads.head(task, inputs)


def create(source: str | Path, *, variant: str = "fp32", threads: int | None = None, manifest: dict | None = None,
           **_) -> TensorRTWithOrtHeads:
    """The backend's factory in the registry. ``variant``: the artifact's engine; fp32 (serve's default) means its
    one engine, tensorrt_fp16."""
    manifest = manifest if manifest is not None else load_manifest(Path(source))
    return TensorRTWithOrtHeads.from_artifact(source, manifest, "tensorrt_fp16" if variant == "fp32" else variant,
                                              threads=threads)


def check(device: str) -> None:
    """A torch that sees the GPU (for the engine's streams and buffers); the modules are the registry's to check, so
    that one refusal names everything missing."""
    from .pytorch import check as torch_check

    torch_check(device)
