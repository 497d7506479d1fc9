"""`bertzoo export --hf`: transformers and sentence-transformers load the model and compute what bertzoo does."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertzoo import tasks as T
from bertzoo.datafiles import load_split, samples_dir
from bertzoo.export.exporter import ExportOptions, export_checkpoint
from bertzoo.export.hf import HFExportError, write_hf
from bertzoo.serving.backends import TorchBackend
from bertzoo.serving.client import BertzooClient
from bertzoo.serving.grpc_server import ServerThread
from bertzoo.tokenization import Tokenizer, pad_batch
from bertzoo.trainer.checkpoint import load_model
from bertzoo.trainer.heads import ModelConfig, MultitaskModel
from bertzoo.trainer.model import EncoderConfig
from conftest import TINY_ENCODER, serve_config

transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def hf_artifact(tiny_artifact, tmp_path_factory):
    run, _ = tiny_artifact
    artifact = tmp_path_factory.mktemp("hf") / "artifact"
    export_checkpoint(run, artifact, ExportOptions(hf=True, parity_limit=8))
    return run, artifact


@pytest.fixture(scope="module")
def sentences():
    return [e.text for e in load_split(samples_dir(), "sentiment", "dev")[:12]]


def test_automodel_computes_our_encoders_states(hf_artifact, sentences):
    run, artifact = hf_artifact
    model, _, directory = load_model(run)
    tokenizer = Tokenizer.from_file(directory / "tokenizer.json")
    batch = pad_batch(T.encode_sentences(tokenizer, sentences, T.Limits()), tokenizer.pad_id)
    ours = TorchBackend(model).encode(batch)
    hf = transformers.AutoModel.from_pretrained(artifact / "hf").eval()
    assert type(hf).__name__ == "BertModel"
    with torch.no_grad():
        theirs = hf(**{k: torch.from_numpy(v) for k, v in batch.items()}).last_hidden_state.numpy()
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(theirs[real], ours[real], atol=1e-5)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(artifact / "hf")
    assert hf_tokenizer(sentences[:3])["input_ids"] == [list(e.input_ids) for e in
                                                        T.encode_sentences(tokenizer, sentences[:3], T.Limits())]


def test_sentence_transformers_embeds_as_the_server_does(hf_artifact, sentences):
    _, artifact = hf_artifact
    embedder = sentence_transformers.SentenceTransformer(str(artifact / "hf"), device="cpu")
    theirs = embedder.encode(sentences, convert_to_numpy=True, batch_size=4)
    with ServerThread(serve_config(artifact)) as running, BertzooClient(f"127.0.0.1:{running.port}") as client:
        served = np.array([list(e.values) for e in client.embed(sentences).embeddings])
    np.testing.assert_allclose(theirs, served, atol=1e-5)


def test_the_heads_travel_with_a_recipe(hf_artifact):
    run, artifact = hf_artifact
    recipe = json.loads((artifact / "hf" / "heads.json").read_text())
    model, _, _ = load_model(run)
    assert set(recipe["tasks"]) == set(model.heads)
    assert recipe["tasks"]["similarity"]["formula"].startswith("clip(")
    assert recipe["labels"]["sentiment"][0] == "very negative"
    heads = load_file(str(artifact / "hf" / "heads.safetensors"))
    state = model.state_dict()
    assert heads and all(torch.equal(tensor, state[name]) for name, tensor in heads.items())
    assert set(heads) == {k for k in state if k.startswith("heads.")}


def test_an_ssaf_encoder_is_refused(tmp_path):
    config = ModelConfig(EncoderConfig(**TINY_ENCODER, attention="sparsegen_lin", sparsegen_lambda=-1.0))
    with pytest.raises(HFExportError, match="sparsegen_lin"):
        write_hf(MultitaskModel(config), None, tmp_path / "tokenizer.json", tmp_path / "hf", 128, {})


def assert_loads_cleanly(directory):
    """transformers' own report of the load: every weight it wanted was there and nothing was left over."""
    model, info = transformers.AutoModel.from_pretrained(directory, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(kind), f"{kind}: {info[kind]}"
    return model


def test_automodel_loads_with_no_missing_or_unexpected_weight(hf_artifact):
    _, artifact = hf_artifact
    assert_loads_cleanly(artifact / "hf")  # a random-init encoder: a fresh pooler, said so in heads.json
    assert "freshly initialised" in json.loads((artifact / "hf" / "heads.json").read_text())["pooler"]


def test_an_encoder_from_the_backbone_exports_the_backbones_pooler(tmp_path):
    from bertzoo.backbone import resolve_backbone
    from bertzoo.export.hf import backbone_pooler
    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.train import build_model

    model, tokenizer = build_model(TrainConfig(tasks=("sentiment",)))  # all-MiniLM-L6-v2's weights, untrained heads
    pooler = backbone_pooler(None, model.config.encoder.hidden_size)
    assert pooler is not None and backbone_pooler(None, 32) is None  # a width the backbone's pooler does not have
    tokenizer_file = tmp_path / "tokenizer.json"
    tokenizer_file.write_text(tokenizer.to_str())
    write_hf(model, tokenizer, tokenizer_file, tmp_path / "hf", 128, {}, pooler)
    hf = assert_loads_cleanly(tmp_path / "hf")
    original = load_file(str(resolve_backbone(None).weights_path))
    assert torch.equal(hf.pooler.dense.weight.detach(), original["pooler.dense.weight"].float())
    assert "the backbone's" in json.loads((tmp_path / "hf" / "heads.json").read_text())["pooler"]
