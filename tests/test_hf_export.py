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
