"""The encoder: shapes, masks, attention maps, weight loading, and parity with transformers on the real MiniLM."""

from __future__ import annotations

import pytest
import torch

from bertzoo.backbone import resolve_backbone
from bertzoo.packing import pack_batch
from bertzoo.trainer.model import Encoder, EncoderConfig, Packing
from conftest import TINY_ENCODER, padded_and_packed_grads


def tiny(**overrides) -> Encoder:
    torch.manual_seed(0)
    return Encoder(EncoderConfig(**{**TINY_ENCODER, **overrides})).eval()


def batch(b: int = 3, t: int = 10):
    ids = torch.randint(1000, 2000, (b, t))
    mask = torch.ones(b, t, dtype=torch.long)
    if b == 3:
        mask[1, 6:] = 0
        mask[2, 3:] = 0
    return ids, mask


@pytest.mark.parametrize("attention", ["softmax", "sparsegen_lin"])
def test_attention_maps_per_layer_with_zero_weight_on_padding(attention):
    encoder = tiny(attention=attention, sparsegen_lambda=-2.0)
    ids, mask = batch()
    out = encoder(ids, mask, output_attentions=True)
    assert out.last_hidden_state.shape == (3, 10, 32)
    assert len(out.attentions) == 2
    for probs in out.attentions:
        assert probs.shape == (3, 4, 10, 10)
        torch.testing.assert_close(probs.sum(-1), torch.ones(3, 4, 10))
        assert torch.equal(probs[1, :, :, 6:], torch.zeros_like(probs[1, :, :, 6:]))
        assert torch.equal(probs[2, :, :, 3:], torch.zeros_like(probs[2, :, :, 3:]))
    assert encoder(ids, mask).attentions is None


def test_fused_softmax_path_equals_explicit_path():
    encoder = tiny()
    ids, mask = batch()
    fused = encoder(ids, mask).last_hidden_state
    explicit = encoder(ids, mask, output_attentions=True).last_hidden_state
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_real_tokens():
    encoder = tiny(attention="sparsegen_lin", sparsegen_lambda=-1.0)
    ids, mask = batch(b=1, t=6)
    short = encoder(ids, mask).last_hidden_state
    padded_ids = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    long = encoder(padded_ids, padded_mask).last_hidden_state[:, :6]
    torch.testing.assert_close(short, long, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "sparsegen_lin"])
def test_packed_tokens_give_the_padded_states_and_zeros_at_padding(attention):
    encoder = tiny(attention=attention, sparsegen_lambda=-1.0)
    ids, mask = batch()
    types = (torch.arange(10) >= 4).long().expand(3, 10).contiguous()  # a pair's second segment from position 4
    padded = encoder(ids, mask, types).last_hidden_state
    packing = Packing.from_mask(mask)
    real = mask.bool()
    packed = encoder(ids[real], mask, types[real], packing=packing).last_hidden_state
    assert packed.shape == padded.shape
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(packed[~real], torch.zeros_like(packed[~real]))
    # The server's torch-free packing builds the same indices as the torch one.
    server = pack_batch({"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()})
    for name, tensor in zip(("position_ids", "token_index", "pad_index"), packing, strict=True):
        assert server[name].tolist() == tensor.tolist(), name
    assert server["input_ids"].tolist() == ids[real].tolist() and server["token_type_ids"].tolist() == types[real].tolist()


@pytest.mark.parametrize("attention", ["softmax", "sparsegen_lin"])
def test_packed_tokens_train_with_the_padded_gradients(attention):
    encoder = tiny(attention=attention, sparsegen_lambda=-1.0, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0).train()
    ids, mask = batch()
    padded, packed = padded_and_packed_grads(encoder, ids, mask, torch.randn(3, 10, 32))
    assert padded.keys() == packed.keys() and len(padded) > 10
    for name in padded:
        torch.testing.assert_close(packed[name], padded[name], atol=1e-4, rtol=1e-4, msg=name)


def test_config_validation_names_the_bad_value():
    with pytest.raises(ValueError, match="attention must be one of"):
        EncoderConfig(attention="linear")
    with pytest.raises(ValueError, match="sparsegen_lambda must be < 1"):
        EncoderConfig(sparsegen_lambda=1.5)
    with pytest.raises(ValueError, match="unknown encoder config keys"):
        EncoderConfig.from_dict({}, hidden_sise=3)
    with pytest.raises(ValueError, match="hidden_act"):
        EncoderConfig.from_dict({"hidden_act": "relu"})


def test_too_long_input_is_refused():
    encoder = tiny(max_position_embeddings=8)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings 8"):
        encoder(torch.ones(1, 9, dtype=torch.long), torch.ones(1, 9, dtype=torch.long))


def test_load_pretrained_rejects_mismatched_shapes():
    backbone = resolve_backbone()
    with pytest.raises(ValueError, match="has shape"):
        tiny(vocab_size=30522).load_pretrained(backbone.weights_path)


@pytest.mark.slow
def test_matches_transformers_bert_on_real_minilm():
    transformers = pytest.importorskip("transformers", reason="the parity reference needs transformers")
    backbone = resolve_backbone()
    ours = Encoder(EncoderConfig.from_dict(backbone.config())).eval()
    ours.load_pretrained(backbone.weights_path)
    reference = transformers.BertModel.from_pretrained(str(backbone.directory), add_pooling_layer=False).eval()
    torch.manual_seed(0)
    ids = torch.randint(1000, 30000, (4, 40))
    ids[:, 0] = 101
    mask = torch.ones(4, 40, dtype=torch.long)
    mask[1, 25:] = 0
    mask[3, 7:] = 0
    types = torch.zeros_like(ids)
    types[:, 20:] = 1
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        got = ours(ids, mask, types).last_hidden_state
        got_explicit = ours(ids, mask, types, output_attentions=True).last_hidden_state
    real = mask.bool()
    assert (got - expected)[real].abs().max().item() < 1e-4
    assert (got_explicit - expected)[real].abs().max().item() < 1e-4


def test_any_local_huggingface_bert_directory_loads(tmp_path):
    """A BertFor* checkpoint (keys prefixed "bert.", extra head weights) saved as safetensors works as --backbone."""
    transformers = pytest.importorskip("transformers", reason="building the HF checkpoint needs transformers")
    import shutil

    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.train import build_model

    hf_config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64)
    torch.manual_seed(0)
    reference = transformers.BertForMaskedLM(hf_config).eval()
    reference.save_pretrained(tmp_path, safe_serialization=True)
    shutil.copy(resolve_backbone().tokenizer_path, tmp_path / "tokenizer.json")
    model, tokenizer = build_model(TrainConfig(backbone=str(tmp_path), tasks=("sentiment",)))
    ids, mask = batch()
    with torch.no_grad():
        expected = reference.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model.eval().encoder(ids, mask).last_hidden_state
    assert (got - expected)[mask.bool()].abs().max().item() < 1e-5
    assert tokenizer.vocab_size == 30522
