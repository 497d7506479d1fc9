"""Every backend that can answer, behind the one small protocol of ``bertzoo.pipeline.Backend``: ``encode(batch)`` runs
the encoder on a padded batch, ``head(task, inputs)`` one task's head on encoder states, numpy in and out. A backend
that keeps the states on its device (a GPU: ONNX Runtime's I/O binding, the torch backend's tensors) sets
``resident_states`` and gives ``encode_resident(batch)``, whose states ``serving.engine.run_batch`` selects rows of and
pools embeddings from there, so no host round trip happens between encoder and heads.

- ``ort.OnnxRuntimeBackend``: an export artifact's graphs on ONNX Runtime, CPU or CUDA (torch-free);
- ``openvino.OpenVinoBackend``: the artifact's encoder on OpenVINO (CPU, fp32 or bf16), the heads on ONNX Runtime;
- ``trt.TensorRTWithOrtHeads``: the artifact's TensorRT encoder engine with the heads on ONNX Runtime;
- ``pytorch.TorchBackend``: the PyTorch model itself, fp32 / fp16 / bf16, CPU or CUDA, optionally as CUDA graphs.

:data:`BACKENDS` is the one table of them: each entry's factory, what it imports and the one-line install hint, its
devices and precisions. ``bertzoo serve`` (its flags' choices, its settings' checks, the model it loads), ``bertzoo
eval``, the export's parity gates, the server's start-up gate and the benchmarks read it, through
:func:`create_backend` and :func:`check_available`. A new backend is one module here plus one entry in the table.
Each module imports its heavy dependency (onnxruntime, torch, tensorrt, openvino) only when a backend is made, so the
torch-free install imports all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bertzoo.artifact import load_manifest

from . import openvino, ort, pytorch, trt
from .base import BackendUnavailable
from .openvino import OpenVinoBackend
from .ort import DeviceStates, OnnxRuntimeBackend, ort_providers, provider_names, session_options
from .pytorch import TorchBackend
from .trt import TensorRTBackend, TensorRTWithOrtHeads

if TYPE_CHECKING:
    from bertzoo.pipeline import Backend

# How a device is named in a refusal, and what to change on the command line.
_WHERE = {"cpu": ("the CPU", "drop --device cuda"), "cuda": ("a GPU", "add --device cuda")}


@dataclass(frozen=True)
class BackendEntry:
    """One backend in :data:`BACKENDS`."""

    name: str  # serve's --backend
    summary: str  # what MODEL_DIR is for it, in serve --backend's help
    # (source, **options) -> a Backend; options it has no use for are ignored (see create_backend)
    create: Callable[..., Backend]
    requires: tuple[str, ...]  # the modules it imports; any missing -> BackendUnavailable naming them and `install`
    install: str  # the one-line hint: what to install
    # device -> the --precision values it takes there ("auto" alone: the artifact's variant or engine decides)
    precisions: dict[str, tuple[str, ...]]
    check: Callable[[str], None] | None = None  # what else must hold on a device; raises BackendUnavailable
    serves: str = "artifact"  # MODEL_DIR: a `bertzoo export` artifact, or a training "checkpoint" (or run)
    variants: tuple[str, ...] = ()  # the artifact encoders --variant picks among (auto: serving/machine_defaults.py)
    # On the CPU, several instances run batches side by side (serve --instances) and the long-request lane gets one
    # of its own (serving/model.py)
    cpu_instances: bool = False
    # It compiles the artifact itself, so the server checks it against the artifact's fp32 ONNX Runtime encoder
    # before reporting ready (serving/startup_gate.py)
    startup_gate: bool = False
    packages: tuple[str, ...] = ()  # distributions whose versions ModelInfo reports

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.precisions)

    def device_refusal(self, device: str) -> str | None:
        """Why this backend cannot run on ``device``, or None where it can."""
        if device in self.precisions:
            return None
        if len(self.devices) == 1:
            where, change = _WHERE[self.devices[0]]
            return f"the {self.name} backend runs on {where} only: {change}"
        return f"the {self.name} backend runs on {' or '.join(_WHERE[d][0] for d in self.devices)} only"

    def precision_refusal(self, device: str, precision: str) -> str | None:
        """Why this backend cannot compute in ``precision`` on ``device``, or None where it can."""
        allowed = self.precisions[device]
        if precision in allowed:
            return None
        elsewhere = [d for d, values in self.precisions.items() if precision in values]
        if elsewhere:
            return f"precision {precision} of the {self.name} backend needs --device {elsewhere[0]}"
        if allowed == ("auto",):
            return (f"precision is chosen at export for the {self.name} backend (the artifact's variant or engine); "
                    "leave it at auto")
        return (f"the {self.name} backend computes in {' or '.join(p for p in allowed if p != 'auto')} (auto picks), "
                f"not {precision}")


BACKENDS: dict[str, BackendEntry] = {entry.name: entry for entry in (
    BackendEntry(
        "onnxruntime", "MODEL_DIR is a `bertzoo export` artifact", ort.create, ("onnxruntime",), ort.INSTALL_HINT,
        {"cpu": ("auto",), "cuda": ("auto",)}, check=ort.check, variants=ort.VARIANTS, cpu_instances=True,
        packages=("onnxruntime", "onnxruntime-gpu")),
    BackendEntry(
        "openvino", f"the same artifact on OpenVINO (CPU; {openvino.INSTALL_HINT})", openvino.create,
        ("onnxruntime", "openvino"), openvino.INSTALL_HINT, {"cpu": openvino.PRECISIONS}, cpu_instances=True,
        startup_gate=True, packages=("openvino", "onnxruntime")),
    BackendEntry(
        "tensorrt", "an artifact exported with --trt (needs --device cuda)", trt.create,
        ("tensorrt", "triton", "torch", "onnxruntime"), trt.INSTALL_HINT, {"cuda": ("auto",)}, check=trt.check,
        packages=("tensorrt", "onnxruntime", "onnxruntime-gpu")),
    BackendEntry(
        "torch", "a checkpoint or run directory (the PyTorch reference backend)", pytorch.create, ("torch",),
        pytorch.INSTALL_HINT, {"cpu": ("auto", "fp32"), "cuda": ("auto", *pytorch.PRECISIONS)}, check=pytorch.check,
        serves="checkpoint", packages=("torch",)),
)}


def backend_entry(name: str) -> BackendEntry:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"backend must be one of {tuple(BACKENDS)}, got {name!r}") from None


def create_backend(name: str, source, *, device: str | object | None = None, variant: str = "fp32",
                   precision: str = "fp32", threads: int | None = None, spinning: bool = False,
                   cuda_graphs: bool = False, manifest: dict | None = None, resident_states: bool | None = None,
                   sparsegen: str = "auto", cache_dir: str | Path | None = None, graph_rows: int = 64) -> Backend:
    """A backend of :data:`BACKENDS`. ``source``: an export artifact directory, or for torch a MultitaskModel (whose
    ``device`` may be a torch.device; None: where the model is; the artifact backends' default is the CPU).
    ``variant``: the artifact's encoder (fp32, optimized, int8; for tensorrt, the engine, tensorrt_fp16).
    ``precision``: the torch backend's encoder (fp32, fp16, bf16), or OpenVINO's inference precision (auto, fp32,
    bf16). ``sparsegen``: how ONNX Runtime runs an SSAF encoder's SparsegenLin (export/ort_kernel). ``cache_dir``:
    OpenVINO's compiled-model cache. ``graph_rows``: the rows a CUDA graph holds, rounded up to a power of two
    (larger batches run eagerly). Each factory takes the options it uses."""
    return backend_entry(name).create(source, device=device, variant=variant, precision=precision, threads=threads,
                                      spinning=spinning, cuda_graphs=cuda_graphs, manifest=manifest,
                                      resident_states=resident_states, sparsegen=sparsegen, cache_dir=cache_dir,
                                      graph_rows=graph_rows)


def check_model_dir(backend: str, model_dir: str, verify_key: str | None = None) -> None:
    """Fail fast when ``model_dir`` is not what ``backend`` serves: an export artifact, or a checkpoint."""
    if backend_entry(backend).serves == "checkpoint":
        from bertzoo.trainer.checkpoint import resolve_checkpoint

        resolve_checkpoint(model_dir)  # NotACheckpoint names the path and what to pass
    else:
        load_manifest(model_dir, verify=False, verify_key=verify_key)  # file hashes: when the model loads


def check_available(backend: str, device: str) -> None:
    """Fail fast, before a server binds its port, when ``backend`` cannot run on ``device`` in this installation:
    one line naming everything to install or change, so that a user does not meet one missing piece per attempt."""
    entry = backend_entry(backend)
    if refusal := entry.device_refusal(device):
        raise BackendUnavailable(refusal)
    missing = []
    for module in entry.requires:
        try:
            importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{module} ({e})")
    refusals = [f"the {backend} backend needs {', '.join(missing)}: {entry.install}"] if missing else []
    if entry.check is not None:  # what the device needs besides the modules (a GPU that torch or onnxruntime sees)
        try:
            entry.check(device)
        except BackendUnavailable as e:
            refusals.append(str(e))
        except ImportError:  # the check's own module is missing: named above
            if not missing:
                raise
    if refusals:
        raise BackendUnavailable("; and ".join(refusals))


__all__ = ["BACKENDS", "BackendEntry", "BackendUnavailable", "DeviceStates", "OnnxRuntimeBackend", "OpenVinoBackend",
           "TensorRTBackend", "TensorRTWithOrtHeads", "TorchBackend", "backend_entry", "check_available",
           "check_model_dir", "create_backend", "ort_providers", "provider_names", "session_options"]
