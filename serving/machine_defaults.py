"""What ``auto`` means for ``bertzoo serve``'s machine-dependent settings, in one place: the defaults follow the machine
and the artifact, and any of them can still be forced by its flag. The server logs each choice at start, ModelInfo
reports the backend, variant and precision, and the README states the rules.

- ``--backend auto --variant auto`` on the CPU is measured, not read from flags (serving/engine_choice.py). The rules
  here are what it falls back on where the measurement fails, and what a forced ``--variant`` or a GPU gets:
  1. ONNX Runtime int8, where the export's parity report holds it to fp32's task bounds as
     ``parity_measures.missed_bounds`` computes them (the 95% Wilson upper bound of the same-class share at least
     99.5%: 2 disagreements in 200 items pass; Pearson within 0.002; SQuAD F1 within 0.5);
  2. OpenVINO bf16, where the CPU computes bf16 natively and OpenVINO is installed; its start-up gate checks the
     artifact with bf16's bounds. Flags do not rank engines across CPUs, hence the measurement;
  3. ONNX Runtime's optimized encoder, then fp32, whichever is fastest among those whose report meets fp32's bounds.
  On a GPU: ONNX Runtime (``--device cuda``).
- ``--instances auto`` (CPU engines): one single-thread engine instance per core on up to 4 cores, one two-thread
  instance per 2 cores above that, at most 8. Evidence: 2-core VMs only (two single-thread instances served more
  than one two-thread instance, benchmarks/RESULTS.md, "Serving on CPU"); with ``--backend auto`` the measurement
  also tries one instance on every core and keeps the faster.
- ``--frontends auto``: see :func:`frontends`; ``--engines auto``: see :func:`engines`.
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
    loop takes. A rule, with the machines it was measured on (RESULTS.md, "Serving on CPU" and "Serving on GPU"):

    - CPU, one front end per 8 engine cores (``threads`` of them where given, else every usable one). Measured on 2
      cores only (AMD EPYC VMs): a front end's request path costs a fraction of a millisecond of CPU, the engine
      needs the cores, and 2 front ends served less than one process. Above 2 cores the count is an extrapolation,
      never measured: force ``--frontends`` and compare with ``python -m benchmarks.serve_frontends``.
    - GPU, half the cores, at most 8. Measured on two H200 hosts of 16 Intel Xeon cores, torch fp16 with CUDA graphs,
      one-sentence requests from h2load: N = 8 served a little more than N = 4, and N = 12 a little more than N = 8,
      while the engine process's loop bounds the rate; 8 is kept to leave the engine its cores. Other core counts
      were not measured."""
    n = cores()
    if device == "cuda":
        return max(1, min(8, n // 2))
    return max(1, (threads or n) // 8)


def engines(device: str) -> int:
    """Engine processes (replicas): 1 on every device, until a measurement says otherwise.

    - CPU: replicas split the same cores that ``--instances`` already shares out inside one engine process, and each
      replica holds its own copy of the model; measured on the 2-core VM (RESULTS.md, "Serving on CPU", "Engine
      replicas against instances").
    - GPU: each replica brings its own CUDA graphs and stream, so one prepares its batch while another's runs; the
      prepared GPU benchmark (``benchmarks/gpu/gpu_serving.sh``) measures 1 against 2 and 4 replicas. Until it has run,
      ``auto`` stays 1: force ``--engines`` to compare."""
    return 1
