"""What ``auto`` means for ``bertzoo serve``'s machine-dependent settings, in one place: the defaults follow the machine
and the artifact, and any of them can still be forced by its flag. The server logs each choice at start, ModelInfo
reports the backend, variant and precision, and the README states the rules.

- ``--backend auto --variant auto`` (on the CPU): the fastest engine and precision that keeps fp32-level agreement,
  ranked by what 2 AVX-512 cores served (benchmarks/RESULTS.md, "Serving on CPU": ONNX Runtime int8 > OpenVINO bf16 >
  ONNX Runtime optimized > fp32):
  1. ONNX Runtime int8, where the export's parity report holds it to fp32's own task bounds (same class >= 99.5%,
     Pearson within 0.002, SQuAD F1 within 0.5): int8 passes its own, looser gates (95% same class) and was 92.6%
     same class with fp32 on the SST-5 dev set for one model (RESULTS.md, "Agreement with fp32"), so it is a default
     only where its report shows more;
  2. OpenVINO bf16, where the CPU computes bf16 natively and OpenVINO is installed (the serving profile installs it):
     99.8% same class on SST-5 and Quora dev, STS Pearson within 0.0001; its start-up gate checks the artifact;
  3. ONNX Runtime's optimized encoder, then fp32, whichever is fastest among those whose report meets fp32's bounds.
  On a GPU: ONNX Runtime (``--device cuda``), as before.
- ``--instances auto`` (CPU engines): one single-thread engine instance per core on up to 4 cores (two single-thread
  instances beat one two-thread instance by 1.2-1.5x on 2 cores: RESULTS.md), one two-thread instance per 2 cores
  above that, at most 8. Only 2 cores were measured.
- ``--frontends auto``: see :func:`frontends`.
"""

from __future__ import annotations

import importlib.util
import os

from bertzoo.artifact import load_manifest
from bertzoo.cpu import native_bf16
from bertzoo.parity_measures import BOUNDS, missed_bounds

from .backends import BACKENDS
from .workers import usable_cores

VARIANT_PREFERENCE = ("int8", "optimized", "fp32")  # fastest first (ONNX Runtime on the CPU)
MAX_AUTO_INSTANCES = 8


def cores() -> int:
    return len(usable_cores()) or os.cpu_count() or 1


def fp32_level_variants(model_dir: str) -> list[str]:
    """The artifact's encoders whose export parity report meets fp32's task bounds, fastest first (fp32 always)."""
    manifest = load_manifest(model_dir, verify=False)
    encoders = manifest["graphs"]["encoder"]["files"]
    parity = manifest.get("parity", {})
    found = []
    for name in VARIANT_PREFERENCE:
        report = parity.get(name)
        if name == "fp32" or (name in encoders and report is not None and report.get("passed")
                              and not missed_bounds(BOUNDS["fp32"], {}, report.get("tasks", {}))):
            found.append(name)
    return found


def variant(model_dir: str) -> str:
    """ONNX Runtime's encoder for ``--variant auto``: the fastest at fp32-level agreement."""
    return fp32_level_variants(model_dir)[0]


def backend(model_dir: str, device: str, variant_forced: bool) -> str:
    """The backend for ``--backend auto`` (rules above); a forced ``--variant`` means ONNX Runtime."""
    if device != "cpu" or variant_forced or variant(model_dir) == "int8":
        return "onnxruntime"
    if native_bf16() and importlib.util.find_spec("openvino") is not None:
        return "openvino"
    return "onnxruntime"


def instances(backend: str, device: str, threads: int | None) -> int:
    """Engine instances for a CPU engine on ``threads`` (None: every usable core); 1 elsewhere."""
    if device != "cpu" or not BACKENDS[backend].cpu_instances:
        return 1
    n = threads or cores()
    return max(1, min(MAX_AUTO_INSTANCES, n if n <= 4 else n // 2))


def frontends(device: str, threads: int | None = None) -> int:
    """Front-end processes: one process (no front ends apart) unless the engine answers more requests than one event
    loop takes. A front end carries about 2,100 one-sentence requests/s per core (the front-end probe,
    benchmarks/serve_frontends.py). On the CPU the engine needs the cores itself (``threads`` of them where given,
    else every usable one) and serves a few hundred sentences/s per 2 cores: one front end per 8 cores. On a GPU the
    engine serves 11,000-15,000/s from any core count: half the cores, at most 8 (on an H200's 16 host cores, 8 front
    ends served 1.11x what 4 did and 12 1.04x what 8 did: the engine process's loop bounds the rest)."""
    n = cores()
    if device == "cuda":
        return max(1, min(8, n // 2))
    return max(1, (threads or n) // 8)
