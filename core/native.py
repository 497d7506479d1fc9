"""Native kernels built on first use: one C++ source compiled by the system compiler into a shared library in the
user's cache directory, once per source, compiler and whatever else the caller says changes the binary (the ONNX
Runtime version the ORT kernel is built against), written atomically. Nothing is downloaded; no torch."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

# Headers the kernels share (sparsegen-lin's threshold): on every build's include path, and part of its cache key.
INCLUDE = Path(__file__).with_name("native_include")


class BuildError(RuntimeError):
    """The compiler is missing or failed; the message says which and how."""


def cache_dir(kind: str) -> Path:
    root = os.environ.get("BERTZOO_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME")
                                                           or os.path.expanduser("~/.cache"), "bertzoo")
    return Path(root) / kind


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def compile_library(source: Path, out: Path, flags: list[str], cxx: str) -> Path:
    """Compile ``source`` into the shared library ``out`` (a temporary file renamed into place). Raises BuildError."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out.parent, suffix=".so.tmp", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        command = [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-I", str(INCLUDE), *flags,
                   str(source), "-o", str(partial)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BuildError(f"compiling {source.name} failed: {e}") from e
        if result.returncode != 0:
            raise BuildError(f"compiling {source.name} failed ({' '.join(command)}):\n{result.stderr[-3000:]}")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def cached_library(source: Path, name: str, kind: str, flags: list[str] = (), key_extra: bytes = b"") -> Path:
    """The library built from ``source`` (as ``name``, under ``cache_dir(kind)``), building it if it is not cached.
    Raises BuildError (no compiler, or it failed)."""
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (install g++, or set CXX)")
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"{cxx} --version failed: {e}") from e
    headers = b"".join(h.read_bytes() for h in sorted(INCLUDE.glob("*.h")))
    key = hashlib.sha256(source.read_bytes() + headers + version.encode() + " ".join(flags).encode()
                         + key_extra).hexdigest()
    candidate = cache_dir(kind) / key[:16] / name
    return candidate if candidate.exists() else compile_library(source, candidate, list(flags), cxx)
