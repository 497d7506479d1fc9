"""Training's memory allocator: tcmalloc where it is installed, preloaded by restarting the process.

Packed batches hold a different number of tokens every step, so every step's activations have new sizes. glibc's
malloc keeps the memory they free (its heap fragments and is only trimmed from the top): the full-data recipe peaks
far higher with it than with tcmalloc, which also runs the loop faster (benchmarks/RESULTS.md, "Training recipe and
scores"). An allocator can only be swapped before the process starts, so ``bertzoo train`` execs itself again
with the library in ``LD_PRELOAD`` (as PyTorch's and Intel's CPU launchers do); the restart happens before torch
is imported, and the new process sees the library already preloaded and goes on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHOICES = ("auto", "tcmalloc", "system")
# Debian/Ubuntu's libtcmalloc-minimal4 (apt install libtcmalloc-minimal4), gperftools' full library, and the places
# distributions and source builds put them.
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
               "/usr/local/lib", "/usr/local/lib64")
INSTALL_HINT = "install it (Debian/Ubuntu: apt install libtcmalloc-minimal4) or pass --allocator system"


class AllocatorError(RuntimeError):
    """``--allocator tcmalloc`` on a machine without the library."""


def find_tcmalloc(search_dirs: tuple[str, ...] | None = None) -> Path | None:
    for directory in SEARCH_DIRS if search_dirs is None else search_dirs:
        for name in TCMALLOC_NAMES:
            if (path := Path(directory) / name).is_file():
                return path
    return None


def preloaded(environ: dict[str, str]) -> str | None:
    """The tcmalloc library this process was started with in ``LD_PRELOAD``, if any."""
    for entry in environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if Path(entry).name.startswith("libtcmalloc"):
            return entry
    return None


def library_to_preload(choice: str, environ: dict[str, str], search_dirs: tuple[str, ...] | None = None
                       ) -> Path | None:
    """The library to restart with, or None to go on as we are: ``system`` was chosen, tcmalloc is already
    preloaded, this is not Linux, or (``auto``) no tcmalloc is installed."""
    if choice not in CHOICES:
        raise ValueError(f"allocator must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "system" or preloaded(environ) or not sys.platform.startswith("linux"):
        return None
    path = find_tcmalloc(search_dirs)
    if path is None and choice == "tcmalloc":
        searched = ", ".join(SEARCH_DIRS if search_dirs is None else search_dirs)
        raise AllocatorError(f"--allocator tcmalloc: none of {', '.join(TCMALLOC_NAMES)} in {searched}; {INSTALL_HINT}")
    return path


def restart_with(library: Path, python_args: list[str]) -> None:
    """Replace this process by ``python PYTHON_ARGS...`` with ``library`` preloaded (does not return)."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(library), env.get("LD_PRELOAD", "")]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *python_args], env)


def describe(environ: dict[str, str] | None = None) -> str:
    """The allocator this process runs with, for the run's log."""
    library = preloaded(dict(os.environ) if environ is None else environ)
    return f"tcmalloc ({library}, preloaded)" if library else "the C library's malloc"


def started_as_bertzoo(argv: list[str]) -> bool:
    """This process is the ``bertzoo`` command or ``python -m bertzoo``, not a host calling the CLI in-process (a
    test, a notebook), whose process must never be replaced."""
    path = Path(argv[0]) if argv else Path()
    return path.name == "bertzoo" or (path.name == "__main__.py" and path.parent.name == "bertzoo")
