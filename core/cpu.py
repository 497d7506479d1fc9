"""The CPU's features from /proc/cpuinfo: what decides where bf16 pays (training's --precision, OpenVINO's auto
precision) and what every benchmark figure records beside it; and the one CPU mode the engines' threads set
(:func:`flush_denormals`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
import threading
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


# x86-64's MXCSR register: flush-to-zero (a result too small for a normal float becomes 0) and denormals-are-zero (such
# an input reads as 0). Both glibc's and musl's x86-64 fenv_t hold the x87 state (28 bytes), then MXCSR.
MXCSR_FTZ_DAZ = 0x8040
_FENV_SIZE, _MXCSR_OFFSET = 32, 28
_flushing = threading.local()


def _libm() -> ctypes.CDLL | None:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    name = ctypes.util.find_library("m")
    return ctypes.CDLL(name) if name else None


_LIBM = _libm()


def mxcsr() -> int | None:
    """The calling thread's MXCSR (x86-64 Linux); None elsewhere."""
    if _LIBM is None:
        return None
    env = (ctypes.c_ubyte * _FENV_SIZE)()
    if _LIBM.fegetenv(env) != 0:
        return None
    return int.from_bytes(bytes(env[_MXCSR_OFFSET:_MXCSR_OFFSET + 4]), "little")


def flushing_denormals() -> bool:
    """Whether the calling thread flushes denormal floats to zero (FTZ and DAZ set)."""
    return (mxcsr() or 0) & MXCSR_FTZ_DAZ == MXCSR_FTZ_DAZ


def flush_denormals() -> bool:
    """Make the calling thread flush denormal floats to zero, as a GPU or OpenVINO does (x86-64 Linux; elsewhere
    nothing), as a hot path may call it: set once per thread, then a thread-local check. Whether the thread flushes.

    Why: a masked attention row's softmax takes exp of scores far below the row's maximum, whose results are denormal,
    and x86 arithmetic on denormals is many times slower: ONNX Runtime's Softmax over a batch of padded rows ran ~3.5x
    slower than over unmasked ones, 1-8% of a served MiniLM batch (benchmarks/RESULTS.md, "Serving on CPU"). ONNX
    Runtime's own ``session.set_denormal_as_zero`` covers only its pool threads, not the thread that calls ``run``
    and computes a share of every op. Values below 1.2e-38 become 0: no served output moves. Threads the calling
    thread starts from now on inherit the mode, and code that needs denormals (hypothesis refuses to run) must not
    share the thread: the server calls it on its engines' own threads (serving/workers.py)."""
    done = getattr(_flushing, "done", None)
    if done is None:
        done = set_flush_denormals(True)
    return done


def set_flush_denormals(on: bool) -> bool:
    """Turn the calling thread's flushing of denormals on or off (x86-64 Linux); whether it now flushes."""
    env = (ctypes.c_ubyte * _FENV_SIZE)()
    if _LIBM is None or _LIBM.fegetenv(env) != 0:
        _flushing.done = False
        return False
    value = int.from_bytes(bytes(env[_MXCSR_OFFSET:_MXCSR_OFFSET + 4]), "little")
    value = value | MXCSR_FTZ_DAZ if on else value & ~MXCSR_FTZ_DAZ
    env[_MXCSR_OFFSET:_MXCSR_OFFSET + 4] = list(value.to_bytes(4, "little"))
    flushing = _LIBM.fesetenv(env) == 0 and flushing_denormals()
    _flushing.done = flushing if on else None  # off: the next flush_denormals() turns it on again
    return flushing
