"""The native ONNX Runtime kernel for ``bertzoo.SparsegenLin``: built on first use, cached, optional.

``library()`` compiles ``sparsegen_lin.cc`` against the vendored ORT C API headers (``third_party/onnxruntime``) with
the system C++ compiler, once per source/compiler/ORT version, into the user's cache directory, and returns the shared
library's path, or None (with the reason in :func:`unavailable_reason`) when there is no compiler or the installed
ONNX Runtime is older than the headers. Callers then keep the portable path: the model's own ONNX function, swapped
for the faster formulation of export/sparsegen_onnx.py. Nothing is downloaded; no torch.

Build flags: -O3 and a baseline x86-64/ARM target; the row loop carries GCC ``target_clones`` (AVX2 + default), so one
library is fast on AVX2 machines and still runs on any other (a cache directory copied to another host stays safe).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import bertzoo.third_party
from bertzoo import native

log = logging.getLogger("bertzoo.export")

SOURCE = Path(__file__).with_name("sparsegen_lin.cc")
HEADERS = Path(bertzoo.third_party.__file__).parent / "onnxruntime" / "include"
HEADER_API_VERSION = 23  # ORT_API_VERSION of the vendored headers (third_party/onnxruntime/README.md); ORT >= 1.23 runs it
LIBRARY_NAME = "libbertzoo_ort_ops.so"

_reason: str | None = None


def _runtime_too_old() -> str | None:
    import onnxruntime as ort

    major, minor = (int(part) for part in ort.__version__.split(".")[:2])
    if (major, minor) < (1, HEADER_API_VERSION):
        return f"onnxruntime {ort.__version__} is older than the kernel's C API (1.{HEADER_API_VERSION})"
    return None


@functools.cache
def library() -> Path | None:
    """The compiled kernel library, building it if needed (once per process); None when it cannot be had here (the
    reason is logged once, and kept in :func:`unavailable_reason`)."""
    global _reason
    path: Path | None = None
    if os.environ.get("BERTZOO_ORT_KERNEL", "1") == "0":
        _reason = "disabled by BERTZOO_ORT_KERNEL=0"
    elif (problem := _runtime_too_old()) is not None:
        _reason = problem
    else:
        import onnxruntime as ort

        include = os.environ.get("BERTZOO_ORT_INCLUDE") or str(HEADERS)
        try:
            path = native.cached_library(SOURCE, LIBRARY_NAME, "ort_kernel", ["-I", include],
                                         key_extra=ort.__version__.encode())
        except native.BuildError as e:
            _reason = f"the kernel did not build: {e}" if native.compiler() else str(e)
    if path is None:
        log.warning("SparsegenLin: native ONNX Runtime kernel not used (%s); running the ONNX formulation", _reason)
    return path


SPARSEGEN_CHOICES = ("auto", "native", "formulation", "function")


def prepare(models: dict, options, providers: list[str], sparsegen: str = "auto") -> tuple[dict, bool]:
    """``models`` (name -> ModelProto) ready for ORT sessions made with ``options``, for the SSAF graphs among them
    (those that carry the SparsegenLin function); others are returned as they are. ``sparsegen`` picks how the op runs:

    - ``native``: our kernel, registered on ``options``; the models stay as exported (ONNX Runtime prefers a
      registered kernel to a model-local function of the same name). CPU only.
    - ``formulation``: each function swapped for the sort-free ORT formulation (export/sparsegen_onnx.py).
    - ``function``: the models as exported (the sort-based function body: TopK, CumSum).
    - ``auto``: native when ORT runs on the CPU alone and the kernel builds; else the formulation on the CPU, and the
      function body on a GPU. On an H100 every op of the function body runs on the CUDA provider, faster than the
      formulation, whose Loop copies to the host each step.

    Returns the models and whether the native kernel is in use."""
    from bertzoo.export.sparsegen_onnx import carries_function, with_ort_formulation

    if sparsegen not in SPARSEGEN_CHOICES:
        raise ValueError(f"sparsegen must be one of {SPARSEGEN_CHOICES}, got {sparsegen!r}")
    if not any(carries_function(m) for m in models.values()):
        return models, False
    cpu_only = providers == ["CPUExecutionProvider"]
    if sparsegen == "auto":
        sparsegen = "native" if cpu_only and library() is not None else ("formulation" if cpu_only else "function")
    if sparsegen == "native":
        if not cpu_only or (path := library()) is None:
            raise RuntimeError(f"the native SparsegenLin kernel runs on ONNX Runtime's CPU provider alone "
                               f"({'not built: ' + str(_reason) if cpu_only else 'providers: ' + ', '.join(providers)})")
        options.register_custom_ops_library(str(path))
        return models, True
    if sparsegen == "formulation":
        return {name: with_ort_formulation(m) for name, m in models.items()}, False
    return models, False


def unavailable_reason() -> str | None:
    """Why :func:`library` returned None (None when it did not, or has not been called)."""
    return _reason


__all__ = ["SPARSEGEN_CHOICES", "build", "library", "prepare", "unavailable_reason"]
