"""Task heads: pooling without padding, bounded similarity, QA masking, and the multitask forward."""

from __future__ import annotations

import pytest
import torch

from bertzoo.trainer.heads import ModelConfig, MultitaskModel, pool
from bertzoo.trainer.model import EncoderConfig
from conftest import TINY_ENCODER, multitask_batch


def test_mean_pool_ignores_padding():
    states = torch.tensor([[[1.0, 1.0], [3.0, 3.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(pool(states, mask, "mean"), torch.tensor([[2.0, 2.0]]))
    assert torch.equal(pool(states, mask, "cls"), torch.tensor([[1.0, 1.0]]))


@pytest.mark.parametrize("similarity_head", ["cosine", "concat"])
def test_multitask_forward_shapes_and_ranges(similarity_head):
    torch.manual_seed(0)
    model = MultitaskModel(ModelConfig(EncoderConfig(**TINY_ENCODER), sentiment_num_labels=5,
                                       similarity_head=similarity_head)).eval()
    batch = multitask_batch()
    assert model("sentiment", batch).shape == (6, 5)
    assert model("paraphrase", batch).shape == (3,)
    scores = model("similarity", batch)
    assert scores.shape == (3,) and (scores.abs() <= 5 + 1e-5).all()
    if similarity_head == "concat":
        assert (scores >= 0).all()
    start, end = model("qa", batch)
    assert start.shape == end.shape == (6, 9)
    assert (start[2, 4:] < -1e30).all(), "padding can never be an answer position"


@pytest.mark.parametrize("heads", [{}, {"sentiment_head": "self_attention", "paraphrase_head": "cross_attention",
                                       "similarity_head": "cross_pool"}])
def test_packed_tokens_give_every_head_the_same_outputs(heads):
    torch.manual_seed(0)
    model = MultitaskModel(ModelConfig(EncoderConfig(**TINY_ENCODER), sentiment_num_labels=5, **heads)).eval()
    batch = multitask_batch()
    batch["attention_mask"][4, 6:] = 0  # padding in both halves of the pairs
    for task in ("sentiment", "paraphrase", "similarity", "qa"):
        model.pack_tokens = False
        padded = model(task, batch)
        model.pack_tokens = True
        packed = model(task, batch)
        for p, q in zip(padded if task == "qa" else (padded,), packed if task == "qa" else (packed,), strict=True):
            torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-5, msg=task)


def test_unknown_task_names_the_heads():
    model = MultitaskModel(ModelConfig(EncoderConfig(**TINY_ENCODER), tasks=("sentiment",)))
    with pytest.raises(ValueError, match="no 'qa' head"):
        model("qa", {"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3)})


def test_model_config_round_trips():
    config = ModelConfig(EncoderConfig(**TINY_ENCODER, attention="sparsegen_lin", sparsegen_lambda=-3.0),
                         pooling="cls")
    again = ModelConfig.from_dict(config.to_dict())
    assert again == config
