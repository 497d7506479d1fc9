"""The CPU's features from /proc/cpuinfo: what decides where bf16 pays (training's --precision, OpenVINO's auto
precision) and what every benchmark figure records beside it."""

from __future__ import annotations

from pathlib import Path

# CPUs with these compute in bf16 natively; elsewhere bf16 is emulated, slower than fp32.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_model() -> str:
    """The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) ..."); empty off Linux."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (avx2, avx512f, avx512_bf16, amx_tile, ...); empty off Linux."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def native_bf16() -> bool:
    """Native bf16 arithmetic: AVX-512 BF16 or AMX."""
    return bool(cpu_flags() & NATIVE_BF16_FLAGS)
