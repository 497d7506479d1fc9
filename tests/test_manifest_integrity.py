"""An artifact's manifest cannot be edited unnoticed: its sections are hashed, every file is listed, and a signed
manifest is checked against the exporter's public key."""

from __future__ import annotations

import json
import shutil

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bertzoo.artifact import MANIFEST, SECTIONS, SIGNATURE, ArtifactError, load_manifest, write_manifest
from bertzoo.export.exporter import ExportOptions, export_checkpoint
from bertzoo.serving.grpc_server import ServerThread
from conftest import serve_config


@pytest.fixture
def artifact(tiny_artifact, tmp_path):
    copy = tmp_path / "artifact"
    shutil.copytree(tiny_artifact[1], copy)
    return copy


def edit(artifact, change) -> None:
    manifest = json.loads((artifact / MANIFEST).read_text())
    change(manifest)
    (artifact / MANIFEST).write_text(json.dumps(manifest, indent=2))


@pytest.mark.parametrize(("change", "named"), [
    (lambda m: m["labels"]["sentiment"].__setitem__(0, "very negativX"), "labels"),
    (lambda m: m["labels"]["sentiment"].reverse(), "labels"),
    (lambda m: m["limits"].__setitem__("max_seq_length", 512), "limits"),
    (lambda m: m["model"].__setitem__("qa_null_threshold", -5.0), "model"),
])
def test_an_edited_section_is_refused_by_name(artifact, change, named):
    load_manifest(artifact)
    edit(artifact, change)
    with pytest.raises(ArtifactError, match=rf"section\(s\) {named} changed after export"):
        load_manifest(artifact)


def test_the_files_table_is_required(artifact):
    edit(artifact, lambda m: m.pop("files"))
    with pytest.raises(ArtifactError, match="no 'files' table"):
        load_manifest(artifact)


def test_an_unlisted_file_is_refused(artifact):
    (artifact / "extra.onnx").write_bytes(b"not from export")
    with pytest.raises(ArtifactError, match="extra.onnx not listed in manifest.json"):
        load_manifest(artifact)
    (artifact / "extra.onnx").unlink()
    (artifact / "__pycache__").mkdir()  # what Python writes beside a model.py is no artifact file
    (artifact / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"")
    load_manifest(artifact)


def keypair(directory):
    key = Ed25519PrivateKey.generate()
    private, public = directory / "sign.pem", directory / "sign.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def test_a_signed_artifact_serves_only_unchanged(tiny_artifact, tmp_path):
    run, _ = tiny_artifact
    private, public = keypair(tmp_path)
    signed = tmp_path / "signed"
    export_checkpoint(run, signed, ExportOptions(parity_limit=8, sign_key=str(private)))
    assert (signed / SIGNATURE).is_file()
    load_manifest(signed, verify_key=public)
    with ServerThread(serve_config(signed, verify_key=str(public))) as running:
        assert running.port
    (tmp_path / "other").mkdir()
    _, other = keypair(tmp_path / "other")
    with pytest.raises(ArtifactError, match="does not verify"):
        load_manifest(signed, verify_key=other)  # signed with another key

    # A consistent edit: a label, and every hash recomputed, as an attacker with write access would.
    manifest = json.loads((signed / MANIFEST).read_text())
    manifest["labels"]["sentiment"][0] = "very positive"
    manifest.pop(SECTIONS)
    manifest.pop("files")
    write_manifest(signed, manifest)
    load_manifest(signed)  # unsigned checks pass: only the signature can catch this
    with pytest.raises(ArtifactError, match="does not verify"):
        load_manifest(signed, verify_key=public)

    (signed / SIGNATURE).unlink()
    with pytest.raises(ArtifactError, match="missing, and --verify-key asks for a signed artifact"):
        load_manifest(signed, verify_key=public)
