"""Timing and the machine a figure was measured on, as every benchmark records them."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bertzoo.cpu import cpu_flags, cpu_model

# The flags that decide which kernels the engines can use: recorded with every figure.
FLAGS_OF_NOTE = {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"}


def commit() -> str:
    """The checked-out commit, with "+changes" when the working tree differs from it; outside git (a copy of the
    tree on a GPU machine) what BERTZOO_COMMIT says, which the script that made the copy recorded, else "unknown"."""
    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("BERTZOO_COMMIT", "unknown")
    return head + ("+changes" if dirty else "")


def machine() -> dict:
    """Date, commit, CPU, cores and the CPU flags of note, for a benchmark's results: every result file records
    them through this one helper."""
    return {"date": time.strftime("%Y-%m-%d"), "commit": commit(), "cpu": cpu_model() or platform.machine(),
            "cores": os.cpu_count(), "cpu_flags": sorted(cpu_flags() & FLAGS_OF_NOTE)}


def median_ms(fn: Callable[[], object], repeats: int = 15, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` in milliseconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)
