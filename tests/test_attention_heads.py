"""The zoo's task-specific attention heads (papers 001 and 004): shapes, ranges, padding invariance, the U(0.9, 1)
initialisation, ONNX export parity, and paper 001's negative-Pearson STS loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertzoo.trainer.attention_heads import (
    CrossAttentionLayer,
    CrossAttentionPairHead,
    CrossPoolPairHead,
    SelfAttentionSentimentHead,
)
from bertzoo.trainer.heads import ModelConfig, MultitaskModel
from bertzoo.trainer.losses import negative_pearson
from bertzoo.trainer.model import EncoderConfig
from bertzoo.trainer.zoo_heads import build_zoo_head
from conftest import TINY_ENCODER, multitask_batch

HIDDEN = TINY_ENCODER["hidden_size"]
# (sentiment_head, paraphrase_head, similarity_head): together every zoo head of this module, in two models.
VARIANTS = [("self_attention", "cross_attention", "cross_pool"), ("linear", "cross_pool", "cross_attention")]


def _model(sentiment: str, paraphrase: str, similarity: str, **overrides) -> MultitaskModel:
    torch.manual_seed(0)
    config = ModelConfig(EncoderConfig(**TINY_ENCODER), tasks=("sentiment", "paraphrase", "similarity"),
                         sentiment_head=sentiment, paraphrase_head=paraphrase, similarity_head=similarity, **overrides)
    return MultitaskModel(config).eval()


def _pad(states: torch.Tensor, mask: torch.Tensor, extra: int, generator: torch.Generator
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad with ``extra`` positions of random garbage (not zeros: padding must be ignored, whatever it holds)."""
    b, _, h = states.shape
    return (torch.cat([states, 10 * torch.randn(b, extra, h, generator=generator)], 1),
            torch.cat([mask, torch.zeros(b, extra, dtype=mask.dtype)], 1))


def _inputs(b: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[-1, t // 2:] = 0  # one shorter sentence inside the batch
    return torch.randn(b, t, HIDDEN, generator=g), mask


@pytest.mark.parametrize("variant", VARIANTS)
def test_multitask_forward_shapes_and_ranges(variant):
    model = _model(*variant)
    batch = multitask_batch()
    assert model("sentiment", batch).shape == (6, 5)
    assert model("paraphrase", batch).shape == (3,)
    scores = model("similarity", batch)
    assert scores.shape == (3,) and torch.isfinite(scores).all()
    if variant[2] == "cross_pool":  # 2.5 * (cos + 1): the paper's [-1, 1] -> [0, 5]
        assert ((scores >= 0) & (scores <= 5)).all()
    else:  # 5 * cos, clipped at 0 in post-processing
        assert (scores.abs() <= 5 + 1e-5).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_does_not_change_any_output(variant):
    model = _model(*variant)
    g = torch.Generator().manual_seed(1)
    states_a, mask_a = _inputs(3, 7, seed=2)
    states_b, mask_b = _inputs(3, 5, seed=3)
    with torch.no_grad():
        sentiment = model.heads["sentiment"](states_a, mask_a)
        assert torch.allclose(model.heads["sentiment"](*_pad(states_a, mask_a, 4, g)), sentiment, atol=1e-5)
        for task in ("paraphrase", "similarity"):
            head = model.heads[task]
            ref = head(states_a, mask_a, states_b, mask_b)
            padded_a, padded_b = _pad(states_a, mask_a, 6, g), _pad(states_b, mask_b, 3, g)
            assert torch.allclose(head(*padded_a, states_b, mask_b), ref, atol=1e-5), task
            assert torch.allclose(head(states_a, mask_a, *padded_b), ref, atol=1e-5), task
            assert torch.allclose(head(*padded_a, *padded_b), ref, atol=1e-5), task


@pytest.mark.parametrize("kind", ["cross_attention", "cross_pool"])
def test_pair_heads_attend_across_in_both_directions(kind):
    torch.manual_seed(0)
    head = (CrossAttentionPairHead(HIDDEN, "paraphrase", 2, 4, 0.0, 1e-12) if kind == "cross_attention"
            else CrossPoolPairHead(HIDDEN, "paraphrase", 0.0, 1e-12)).eval()
    encode = head.encodes if kind == "cross_attention" else head.pooled
    states_a, mask_a = _inputs(2, 6, seed=4)
    states_b, mask_b = _inputs(2, 4, seed=5)
    u, v = encode(states_a, mask_a, states_b, mask_b)
    changed_b = states_b.clone()
    changed_b[:, 1:] += 1.0  # not b's first token: sentence a's encode sees these only by attending to b
    assert not torch.allclose(encode(states_a, mask_a, changed_b, mask_b)[0], u)
    # One set of weights serves both directions: swapping the sentences swaps their encodes.
    u2, v2 = encode(states_b, mask_b, states_a, mask_a)
    assert torch.allclose(u2, v, atol=1e-5) and torch.allclose(v2, u, atol=1e-5)
    if kind == "cross_attention":  # and the dot-product combination is symmetric
        assert torch.allclose(head(states_b, mask_b, states_a, mask_a), head(states_a, mask_a, states_b, mask_b),
                              atol=1e-5)


def test_config_values_reach_the_heads():
    model = _model("self_attention", "cross_attention", "cross_attention", sentiment_attention_layers=3,
                   paraphrase_cross_layers=2, similarity_cross_layers=1, head_dropout=0.25)
    sentiment, paraphrase, similarity = (model.heads[t] for t in ("sentiment", "paraphrase", "similarity"))
    assert isinstance(sentiment, SelfAttentionSentimentHead) and len(sentiment.layers) == 3
    assert sentiment.layers[0].num_heads == TINY_ENCODER["num_attention_heads"]
    assert sentiment.classifier.out_features == 5 and sentiment.dropout.p == 0.25
    assert isinstance(paraphrase, CrossAttentionPairHead) and len(paraphrase.layers) == 2
    assert isinstance(similarity, CrossAttentionPairHead) and len(similarity.layers) == 1
    # Paper 001, Table 3: an H x H transform for paraphrase, H x 4H for STS.
    assert paraphrase.projection.out_features == HIDDEN and similarity.projection.out_features == 4 * HIDDEN
    assert all(isinstance(layer, CrossAttentionLayer) for layer in similarity.layers)
    config = ModelConfig(EncoderConfig(**TINY_ENCODER))
    config.sentiment_head = "cross_pool"  # past ModelConfig's own check: the dispatcher refuses it too
    with pytest.raises(ValueError, match="no 'sentiment' head named 'cross_pool'"):
        build_zoo_head("sentiment", config)


def test_uniform_init_covers_the_attention_weights_only():
    plain = _model("self_attention", "cross_attention", "cross_attention")
    uniform = _model("self_attention", "cross_attention", "cross_attention", head_uniform_init=True)
    for task in ("sentiment", "paraphrase", "similarity"):
        for name, param in uniform.heads[task].layers.named_parameters():
            if "LayerNorm" in name:
                continue
            if name.endswith("weight"):
                assert param.min() >= 0.9 and param.max() <= 1.0 and param.std() > 0, (task, name)
            else:
                assert torch.count_nonzero(param) == 0, (task, name)
        plain_weights = [p for n, p in plain.heads[task].layers.named_parameters() if n.endswith("query.weight")]
        assert all(p.min() < 0.9 for p in plain_weights), "default init is not U(0.9, 1)"
    # The readout after the attention layers keeps its usual initialisation.
    assert uniform.heads["sentiment"].classifier.weight.min() < 0.9
    assert uniform.heads["paraphrase"].projection.weight.min() < 0.9
    # Near-equal weights on centred (LayerNorm-ed) states give near-uniform attention, the paper's point.
    layer = uniform.heads["sentiment"].layers[0]
    x = torch.nn.functional.layer_norm(torch.randn(2, 6, HIDDEN), (HIDDEN,))
    q, k = layer._heads(layer.query(x)), layer._heads(layer.key(x))
    probs = (q @ k.transpose(-1, -2) / layer.head_size ** 0.5).softmax(-1)
    assert (probs - 1 / 6).abs().max() < 0.05


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_head_parameter_gets_a_gradient(variant):
    model = _model(*variant).train()
    ids = torch.randint(1000, 2000, (4, 7))
    batch = {"input_ids": ids, "attention_mask": torch.ones(4, 7, dtype=torch.long)}
    for task in ("sentiment", "paraphrase", "similarity"):
        model.zero_grad()
        model(task, batch).float().sum().backward()
        # A key bias adds the same score to every key of a query, which the softmax cancels: no gradient there.
        missing = [n for n, p in model.heads[task].named_parameters()
                   if not n.endswith("key.bias") and (p.grad is None or not p.grad.any())]
        assert not missing, (task, missing)


@pytest.mark.parametrize("variant", VARIANTS)
def test_onnx_export_matches_torch_on_new_shapes(variant, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from bertzoo.export.onnx_graphs import export_graphs

    model = _model(*variant, head_uniform_init=variant[0] == "linear")
    graphs = export_graphs(model, tmp_path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for task in ("sentiment", "paraphrase", "similarity"):
        session = ort.InferenceSession(str(tmp_path / graphs[task].file), options, providers=["CPUExecutionProvider"])
        # Shapes unlike the export's example (batch 2, lengths 16 and 11), and for pairs seq_a != seq_b both ways.
        for (b, ta, tb), seed in (((1, 5, 9), 6), ((7, 23, 4), 7)):
            states_a, mask_a = _inputs(b, ta, seed)
            states_b, mask_b = _inputs(b, tb, seed + 100)
            if task == "sentiment":
                feed = {"states": states_a, "mask": mask_a}
            else:
                feed = {"states_a": states_a, "mask_a": mask_a, "states_b": states_b, "mask_b": mask_b}
            with torch.no_grad():
                expected = model.heads[task](**feed).numpy()
            got = session.run(None, {k: v.numpy() for k, v in feed.items()})[0]
            assert got.shape == expected.shape, (task, b)
            np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4, err_msg=f"{task} {variant}")


def test_zoo_heads_train_end_to_end(tiny_train_config):
    """A few real training steps with every zoo head and paper 001's loss: finite losses, a saved checkpoint."""
    from bertzoo.trainer.train import train

    config = tiny_train_config(tasks=("sentiment", "paraphrase", "similarity"), sentiment_head="self_attention",
                               paraphrase_head="cross_pool", similarity_head="cross_attention",
                               head_uniform_init=True, similarity_loss="neg_pearson", max_steps=6,
                               eval_every_epoch=False, sampling="round_robin")
    model, _ = train(config)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert isinstance(model.heads["paraphrase"], CrossPoolPairHead)


def test_negative_pearson_is_minus_one_for_perfect_correlation():
    target = torch.tensor([0.0, 1.5, 2.0, 4.0, 5.0])
    assert negative_pearson(target.clone(), target).item() == pytest.approx(-1.0, abs=1e-6)
    assert negative_pearson(-target, target).item() == pytest.approx(1.0, abs=1e-6)
    pred = torch.tensor([0.3, 0.1, 2.0, 3.5, 4.0])
    expected = -np.corrcoef(pred.numpy(), target.numpy())[0, 1]
    assert negative_pearson(pred, target).item() == pytest.approx(expected, abs=1e-6)


def test_negative_pearson_ignores_scale_and_shift():
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(16, generator=g), 5 * torch.rand(16, generator=g)
    loss = negative_pearson(pred, target)
    for scale, shift in ((3.0, 2.0), (0.01, -7.0)):
        assert negative_pearson(scale * pred + shift, target).item() == pytest.approx(loss.item(), abs=1e-5)
        assert negative_pearson(pred, scale * target + shift).item() == pytest.approx(loss.item(), abs=1e-5)


def test_negative_pearson_gradient_raises_the_correlation():
    g = torch.Generator().manual_seed(1)
    target = 5 * torch.rand(32, generator=g)
    pred = torch.randn(32, generator=g, requires_grad=True)
    loss = negative_pearson(pred, target)
    loss.backward()
    assert torch.isfinite(pred.grad).all() and pred.grad.abs().sum() > 0
    # The gradient is orthogonal to shifting and scaling pred (the loss cannot change along them).
    assert pred.grad.sum().item() == pytest.approx(0.0, abs=1e-5)
    assert (pred.grad * pred.detach()).sum().item() == pytest.approx(0.0, abs=1e-5)
    # Matches a central finite difference, and a small step against it lowers the loss.
    i, h = 3, 1e-3
    bumped = [pred.detach().clone() for _ in range(2)]
    bumped[0][i] += h
    bumped[1][i] -= h
    numeric = (negative_pearson(bumped[0].double(), target.double()) - negative_pearson(bumped[1].double(),
                                                                                        target.double())) / (2 * h)
    assert pred.grad[i].item() == pytest.approx(numeric.item(), rel=1e-2, abs=1e-5)
    assert negative_pearson(pred.detach() - 0.1 * pred.grad, target) < loss.detach()
