"""The artifact directory that export writes and the server loads: ``manifest.json`` and the files it lists.

Torch-free, so the server reads it without torch. The manifest records every file's sha256 and the sha256 of each of
its own sections (labels, limits, model settings, graphs: whatever changes answers); :func:`load_manifest` refuses,
naming what changed, an artifact with a missing, changed or unlisted file or an edited section, before anything runs.
That catches damage and careless edits. A deliberate edit that also rewrites the hashes is caught by signing:
``bertzoo export --sign-key KEY`` writes ``manifest.sig`` (Ed25519 over manifest.json's bytes) and ``bertzoo serve
--verify-key PUB`` refuses an artifact whose signature is missing or does not verify.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .atomic import atomic_write_text
from .errors import UserError

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
SECTIONS = "sections_sha256"
FORMAT_VERSION = 2  # 2: section hashes, every file listed
# Every ONNX graph bertzoo writes or builds declares this IR version: ONNX Runtime refuses a graph whose IR version is
# newer than it knows, and the onnx package's default is its own newest (onnx 1.23 writes 14; onnxruntime-gpu 1.31
# reads up to 13). 10 is read by every ONNX Runtime since 1.17.
ONNX_IR_VERSION = 10


def _section_hashes(manifest: dict) -> dict[str, str]:
    return {key: hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
            for key, value in manifest.items() if key != SECTIONS}


def _artifact_files(directory: Path) -> list[Path]:
    """The files a manifest lists: all but itself, its signature, hidden files and Python's bytecode caches (which
    Triton's Python backend writes beside model.py)."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name not in (MANIFEST, SIGNATURE)
                  and not p.name.startswith(".") and "__pycache__" not in p.relative_to(directory).parts)


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


def write_manifest(directory: Path, manifest: dict, sign_key: str | Path | None = None) -> dict:
    """Hash every file in ``directory`` into ``manifest["files"]``, and each section, and write it last, atomically:
    a directory with a manifest is complete. ``sign_key``: an Ed25519 private key (PEM) to sign it with."""
    directory = Path(directory)
    manifest = {**manifest, "format_version": FORMAT_VERSION,
                "files": {str(p.relative_to(directory)): sha256_file(p) for p in _artifact_files(directory)}}
    manifest[SECTIONS] = _section_hashes(manifest)
    write_json_atomic(directory / MANIFEST, manifest)
    if sign_key is not None:
        from .signing import sign

        (directory / SIGNATURE).write_bytes(sign((directory / MANIFEST).read_bytes(), sign_key))
    return manifest


def load_manifest(directory: str | Path, verify: bool = True, verify_key: str | Path | None = None) -> dict:
    """The manifest of an artifact directory, after checking its sections' hashes and (``verify``) that every file
    is listed, exists and matches its hash; with ``verify_key`` (an Ed25519 public key, PEM) its signature too."""
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
                            f"{FORMAT_VERSION}; export the checkpoint again with this bertzoo")
    if verify_key is not None:
        from .signing import verify_signature

        signature = directory / SIGNATURE
        if not signature.is_file():
            raise ArtifactError(f"{signature}: missing, and --verify-key asks for a signed artifact (export it with "
                                "--sign-key)")
        if not verify_signature(path.read_bytes(), signature.read_bytes(), verify_key):
            raise ArtifactError(f"{path}: the signature in {SIGNATURE} does not verify with {verify_key}: the "
                                "manifest was changed after signing, or signed with another key")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ArtifactError(f"{path}: no 'files' table; every file's sha256 is required (re-export the artifact)")
    recorded = manifest.get(SECTIONS)
    if not isinstance(recorded, dict):
        raise ArtifactError(f"{path}: no '{SECTIONS}' table; the manifest's own hashes are required")
    actual_sections = _section_hashes(manifest)
    changed = sorted(key for key in set(recorded) | set(actual_sections) if recorded.get(key) != actual_sections.get(key))
    if changed:
        raise ArtifactError(f"{path}: section(s) {', '.join(changed)} changed after export (their sha256 no longer "
                            "matches); re-export the artifact instead of editing it")
    if verify:
        for name, expected in files.items():
            file = directory / name
            if not file.is_file():
                raise ArtifactError(f"{file}: listed in {MANIFEST} but missing")
            actual = sha256_file(file)
            if actual != expected:
                raise ArtifactError(f"{file}: sha256 {actual} does not match {expected} in {MANIFEST}; "
                                    "the file was changed after export")
        unlisted = [str(p.relative_to(directory)) for p in _artifact_files(directory)
                    if str(p.relative_to(directory)) not in files]
        if unlisted:
            raise ArtifactError(f"{directory}: {', '.join(unlisted[:5])} not listed in {MANIFEST}; an artifact holds "
                                "only what export wrote: remove them or re-export")
    return manifest
