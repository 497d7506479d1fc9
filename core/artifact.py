"""The artifact directory that export writes and the server loads: ``manifest.json`` and the files it lists.

Torch-free, so the server reads it without torch. The manifest records every file's sha256; :func:`load_manifest`
refuses an artifact whose files are missing or do not match (a half-copied directory, a tampered graph), naming the
file, before anything is run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .atomic import atomic_write_text
from .errors import UserError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class ArtifactError(UserError, ValueError):
    """An artifact directory cannot be used. The message names the directory or file and what is wrong."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_json_atomic(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_manifest(directory: Path, manifest: dict) -> dict:
    """Hash every file in ``directory`` (except the manifest itself) into ``manifest["files"]`` and write it last,
    atomically: a directory with a manifest is complete."""
    directory = Path(directory)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))
    manifest = {**manifest, "format_version": FORMAT_VERSION,
                "files": {str(p.relative_to(directory)): sha256_file(p) for p in files}}
    write_json_atomic(directory / MANIFEST, manifest)
    return manifest


def load_manifest(directory: str | Path, verify: bool = True) -> dict:
    """The manifest of an artifact directory, after checking that every listed file exists and matches its hash."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise ArtifactError(f"{directory}: no such directory; pass the --out directory of `bertzoo export`")
    if not path.is_file():
        # The names of a training run (LATEST, BEST) and of a checkpoint (model.safetensors) tell a user who passed
        # one what to do instead.
        if any((directory / name).is_file() for name in ("LATEST", "BEST", "model.safetensors")):
            raise ArtifactError(f"{directory}: a training run or checkpoint, not an export artifact (no {MANIFEST}): "
                                f"serve it with --backend torch, or run `bertzoo export {directory} --out DIR` and "
                                "serve DIR")
        raise ArtifactError(f"{directory}: no {MANIFEST}; pass the --out directory of `bertzoo export`")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from e
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: format_version {manifest.get('format_version')!r}, this bertzoo reads "
                            f"{FORMAT_VERSION}")
    if verify:
        for name, expected in manifest.get("files", {}).items():
            file = directory / name
            if not file.is_file():
                raise ArtifactError(f"{file}: listed in {MANIFEST} but missing")
            actual = sha256_file(file)
            if actual != expected:
                raise ArtifactError(f"{file}: sha256 {actual} does not match {expected} in {MANIFEST}; "
                                    "the file was changed after export")
    return manifest
