"""Writing files and directories so that a reader never sees half of one: build under a temporary sibling name,
flush to disk, then rename into place (a rename within one filesystem is atomic). Checkpoints, pre-trained backbones
and export artifacts are all written this way, so an interrupted or failed write leaves the previous version intact.
Torch-free."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (see :func:`atomic_open`)."""
    with atomic_open(path) as f:
        f.write(text)


@contextmanager
def atomic_open(path: Path) -> Iterator[TextIO]:
    """A text file to write ``path`` through, for output written as it comes: a temporary file beside it, fsynced
    and renamed over ``path`` when the block ends normally, removed when it raises (``path`` is then untouched).
    It gets the permissions a plain write would get under the umask (``mkstemp`` makes files owner-only)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_directory(final: Path, shareable: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``final`` to fill. When the block ends normally its files are
    fsynced and it is renamed to ``final``, replacing an existing ``final`` whole (moved aside first, then removed);
    when the block raises, it is removed and ``final`` is untouched.

    ``shareable``: give the directory, its subdirectories and files the permissions the umask allows, as a plain
    ``mkdir`` would (``mkdtemp`` makes them owner-only), for output other users are meant to read: a server or
    Triton running as another user reads checkpoints and artifacts.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        yield work
        umask = _umask()
        for root, dirs, files in os.walk(work):
            for name in files:
                f = Path(root) / name
                with open(f, "rb") as handle:
                    os.fsync(handle.fileno())
                if shareable:
                    f.chmod(0o666 & ~umask)
            if shareable:
                for name in dirs:
                    (Path(root) / name).chmod(0o777 & ~umask)
        if shareable:
            work.chmod(0o777 & ~umask)
        if final.exists():
            aside = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old."))
            os.replace(final, aside / final.name)
            os.replace(work, final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(work, final)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
