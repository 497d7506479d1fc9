"""The default backbone is verified by sha256; only safetensors are loaded."""

from __future__ import annotations

import shutil

import pytest

from bertzoo import backbone as B


def test_default_backbone_resolves_and_verifies():
    files = B.resolve_backbone()
    assert files.weights_path is not None and files.weights_path.name == "model.safetensors"
    assert B.sha256_file(files.weights_path) == B.DEFAULT_BACKBONE_SHA256
    assert files.config()["hidden_size"] == 384


def test_tampered_default_backbone_is_refused(tmp_path, monkeypatch):
    source = B.default_backbone_dir()
    copy = tmp_path / "model"
    copy.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(source / name, copy / name)
    data = bytearray((source / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # one flipped byte in the last tensor
    (copy / "model.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr(B, "default_backbone_dir", lambda: copy)
    with pytest.raises(B.BackboneError, match="sha256 .* does not match the expected 53aa5117"):
        B.resolve_backbone("default")


def test_pickle_only_directory_is_refused(tmp_path):
    for name in ("config.json", "tokenizer.json", "pytorch_model.bin"):
        (tmp_path / name).write_text("{}")
    with pytest.raises(B.BackboneError, match="safetensors only"):
        B.resolve_backbone(str(tmp_path))
    assert B.resolve_backbone(str(tmp_path), random_init=True).weights_path is None


def test_missing_directory_and_files_are_named(tmp_path):
    with pytest.raises(B.BackboneError, match="does not exist"):
        B.resolve_backbone(str(tmp_path / "nope"))
    with pytest.raises(B.BackboneError, match="has no config.json"):
        B.resolve_backbone(str(tmp_path))


def test_a_directory_without_tokenizer_json_builds_it_from_vocab_txt(tmp_path):
    source = B.default_backbone_dir()
    copy = tmp_path / "bert"
    copy.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(source / name, copy / name)
    files = B.resolve_backbone(str(copy), random_init=True)
    assert files.tokenizer_path.name == "vocab.txt"
    built, reference = files.tokenizer(), B.resolve_backbone().tokenizer()
    text = "The Eiffel Tower's café, unbelievably CROWDED in 1889!"
    assert built.lowercase and built.vocab() == reference.vocab()
    assert [e.input_ids for e in built.encode_sentences([text], 64)] == \
        [e.input_ids for e in reference.encode_sentences([text], 64)]
    (copy / "vocab.txt").unlink()
    with pytest.raises(B.BackboneError, match="neither tokenizer.json nor vocab.txt"):
        B.resolve_backbone(str(copy), random_init=True)
