"""What ``auto`` means for ``bertzoo serve``'s machine-dependent settings, in one place: the defaults follow the machine
and the artifact, and any of them can still be forced by its flag. The server logs each choice at start, ModelInfo
reports the variant, and the README states the rules.

- ``--variant auto``: the fastest encoder the artifact holds whose export parity gates passed (int8, then optimized,
  then fp32): on 2 AVX-512 cores int8 served 1.9-2.2x fp32's sentences/s (benchmarks/RESULTS.md, "Serving on CPU"),
  and its gates held it to fp32's answers on the dev samples (same class >= 99.5%, SQuAD F1 within 0.5).
- ``--instances auto`` (CPU engines): one single-thread engine instance per core on up to 4 cores (two single-thread
  instances beat one two-thread instance by 1.2-1.5x on 2 cores: RESULTS.md), one two-thread instance per 2 cores
  above that, at most 8. Only 2 cores were measured.
- ``--frontends auto``: see :func:`frontends`.
"""

from __future__ import annotations

import os

from bertzoo.artifact import load_manifest

from .backends import BACKENDS
from .workers import usable_cores

VARIANT_PREFERENCE = ("int8", "optimized", "fp32")  # fastest first (ONNX Runtime on the CPU)
MAX_AUTO_INSTANCES = 8


def cores() -> int:
    return len(usable_cores()) or os.cpu_count() or 1


def variant(model_dir: str) -> str:
    """The artifact's fastest encoder whose parity gates passed, else fp32."""
    manifest = load_manifest(model_dir, verify=False)
    encoders = manifest["graphs"]["encoder"]["files"]
    parity = manifest.get("parity", {})
    for name in VARIANT_PREFERENCE:
        if name in encoders and parity.get(name, {}).get("passed", name == "fp32"):
            return name
    return "fp32"


def instances(backend: str, device: str, threads: int | None) -> int:
    """Engine instances for a CPU engine on ``threads`` (None: every usable core); 1 elsewhere."""
    if device != "cpu" or not BACKENDS[backend].cpu_instances:
        return 1
    n = threads or cores()
    return max(1, min(MAX_AUTO_INSTANCES, n if n <= 4 else n // 2))


def frontends(device: str) -> int:
    """Front-end processes: one process (no front ends apart) unless the engine answers more requests than one event
    loop takes. A front end carries about 2,000 one-sentence requests/s per core (the front-end probe,
    benchmarks/serve_frontends.py). On the CPU the engine needs the cores itself and serves a few hundred sentences/s
    per 2 cores: one front end per 8 cores. On a GPU the engine serves ~10,000/s from any core count: half the
    cores, at most 8."""
    n = cores()
    if device == "cuda":
        return max(1, min(8, n // 2))
    return max(1, n // 8)
