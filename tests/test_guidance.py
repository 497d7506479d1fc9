"""Attention guidance (paper 003): the patterns, the head assignment, the loss and its use in fine-tuning."""

from __future__ import annotations

import json

import pytest
import torch

from bertzoo.trainer import guidance as G
from conftest import TINY_ENCODER

CLS, SEP, DOT, PAD = 101, 102, 1012, 0
TOKENS = G.PatternTokens(CLS, SEP, DOT)
# [CLS] a . b . c [SEP] | [CLS] d [SEP] pad pad pad pad
IDS = torch.tensor([[CLS, 5, DOT, 7, DOT, 8, SEP], [CLS, 9, SEP, PAD, PAD, PAD, PAD]])
MASK = (IDS != PAD).long()
U7, U3 = [1 / 7] * 7, [1 / 3] * 3 + [0] * 4
Z = [0.0] * 7


def rows(*one_hot_or_rows) -> list[list[float]]:
    """Each argument: an int (a one-hot row at that position), a list (the row itself) or None (a zero row)."""
    out = []
    for r in one_hot_or_rows:
        if r is None:
            out.append(Z)
        elif isinstance(r, int):
            out.append([1.0 if q == r else 0.0 for q in range(7)])
        else:
            out.append(r)
    return out


def check(name: str, first: list[list[float]], second: list[list[float]]) -> None:
    expected = torch.tensor([first, second])
    torch.testing.assert_close(G.build_pattern(name, IDS, MASK, TOKENS), expected)


def test_first():
    check("first", rows(0, 0, 0, 0, 0, 0, 0), rows(0, 0, 0, None, None, None, None))


def test_next_has_a_uniform_last_row():
    check("next", rows(1, 2, 3, 4, 5, 6, U7), rows(1, 2, U3, None, None, None, None))


def test_prev_has_a_uniform_first_row():
    check("prev", rows(U7, 0, 1, 2, 3, 4, 5), rows(U3, 0, 1, None, None, None, None))


def test_delim_spreads_over_cls_and_sep():
    d1 = [0.5, 0, 0, 0, 0, 0, 0.5]
    d2 = [0.5, 0, 0.5, 0, 0, 0, 0]
    check("delim", rows(*[d1] * 7), rows(d2, d2, d2, None, None, None, None))


def test_period_is_the_first_period_at_or_after_the_query():
    # Positions 0-2 -> the period at 2 (itself included), 3-4 -> 4, after the last period: uniform; no period: uniform.
    check("period", rows(2, 2, 2, 4, 4, U7, U7), rows(U3, U3, U3, None, None, None, None))


def test_every_real_row_is_a_distribution():
    for name in G.PATTERNS:
        sums = G.build_pattern(name, IDS, MASK, TOKENS).sum(-1)
        torch.testing.assert_close(sums, MASK.float(), msg=name)


def test_period_id_comes_from_the_tokenizer():
    from bertzoo.backbone import resolve_backbone
    from bertzoo.tokenization import Tokenizer

    tokenizer = Tokenizer.from_file(resolve_backbone("default", random_init=True).tokenizer_path)
    tokens = G.PatternTokens.from_tokenizer(tokenizer)
    assert (tokens.cls_id, tokens.sep_id, tokens.period_id) == (101, 102, 1012)


@pytest.mark.parametrize(("heads", "fraction", "patterns", "expected"), [
    (12, 0.5, ("next", "prev", "first"), ("next", "prev", "first", "first", "first", "first") + (None,) * 6),
    (12, 0.25, ("next", "prev", "first"), ("next", "prev", "first") + (None,) * 9),
    (12, 1.0, ("next", "prev", "first"), ("next", "prev") + ("first",) * 10),
    (4, 0.5, ("next", "prev", "first"), ("next", "prev", None, None)),  # lambda * h - 2 = 0 heads for [First]
    (4, 0.25, ("next", "prev", "first"), ("next", None, None, None)),
    (4, 0.75, ("delim",), ("delim", "delim", "delim", None)),
    (6, 0.25, ("period", "first"), ("period", "first", None, None, None, None)),  # 1.5 rounds half up to 2
    (8, 0.0, ("next", "prev", "first"), (None,) * 8),
])
def test_head_assignment(heads, fraction, patterns, expected):
    assert G.assign_heads(heads, fraction, patterns) == expected


def test_bad_patterns_and_fractions_are_refused():
    with pytest.raises(ValueError, match="unknown attention pattern"):
        G.assign_heads(4, 0.5, ("next", "diagonal"))
    with pytest.raises(ValueError, match="at least one pattern"):
        G.assign_heads(4, 0.5, ())
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        G.assign_heads(4, 1.5, ("next",))


HEADS = G.assign_heads(4, 0.75, ("next", "prev", "first"))  # next, prev, first, unguided


def perfect_attentions(layers: int = 2) -> list[torch.Tensor]:
    """Attention maps that equal the patterns on the guided heads and are random on the unguided one."""
    maps = torch.softmax(torch.randn(2, 4, 7, 7), -1) * MASK[:, None, None, :].float()
    for h, name in enumerate(HEADS):
        if name:
            maps[:, h] = G.build_pattern(name, IDS, MASK, TOKENS)
    return [maps.clone() for _ in range(layers)]


def test_loss_is_zero_on_the_patterns_and_positive_elsewhere():
    attentions = perfect_attentions()
    assert float(G.guidance_loss(attentions, IDS, MASK, HEADS, TOKENS)) == 0.0
    attentions[1][0, 1, 3] = torch.tensor([0, 0, 0, 1.0, 0, 0, 0])  # one row of layer 1's [Prev] head is wrong
    # That row's squared error is 2, over sequence 0's 7 x 7 block, averaged over the 2 sequences.
    assert float(G.guidance_loss(attentions, IDS, MASK, HEADS, TOKENS)) == pytest.approx(2 / 49 / 2)


def test_padding_rows_are_ignored_and_padding_does_not_change_a_sequence_loss():
    attentions = perfect_attentions()
    attentions[0][1, 0, 5] = 0.3  # garbage in a padding query row
    assert float(G.guidance_loss(attentions, IDS, MASK, HEADS, TOKENS)) == 0.0
    # Uniform attention of one 3-token sequence, alone and padded to 7: the same per-head mean over its 3 x 3 block.
    ids, mask = IDS[1:, :3], MASK[1:, :3]
    alone = [torch.full((1, 4, 3, 3), 1 / 3)]
    padded = [torch.nn.functional.pad(alone[0], (0, 4, 0, 4))]
    loss_alone = G.guidance_loss(alone, ids, mask, HEADS, TOKENS)
    assert float(G.guidance_loss(padded, IDS[1:], MASK[1:], HEADS, TOKENS)) == pytest.approx(float(loss_alone))
    # [Next] rows 0 and 1 and [Prev] rows 1 and 2: each one-hot vs uniform over 3 -> 2/3; [First]: 3 rows x 2/3.
    assert float(loss_alone) == pytest.approx((2 * 2 / 3 + 2 * 2 / 3 + 3 * 2 / 3) / 9)


def test_weight_decays_linearly_to_zero():
    objective = G.AttentionGuidance(10.0, 0.75, ("next", "prev", "first"), TOKENS)
    attentions = [torch.full((2, 4, 7, 7), 1 / 7) * MASK[:, None, None, :]]
    raw = float(G.guidance_loss(attentions, IDS, MASK, HEADS, TOKENS))
    assert raw > 0
    for progress, factor in ((0.0, 10.0), (0.5, 5.0), (0.9, 1.0), (1.0, 0.0)):
        value = float(objective.attention_loss(attentions, IDS, MASK, progress))
        assert value == pytest.approx(factor * raw)


def test_gradient_reaches_the_encoder():
    from bertzoo.trainer.model import Encoder, EncoderConfig

    torch.manual_seed(0)
    encoder = Encoder(EncoderConfig(**TINY_ENCODER, attention_probs_dropout_prob=0.0)).train()
    out = encoder(IDS, MASK, output_attentions=True)
    objective = G.AttentionGuidance(1.0, 0.5, ("next", "prev", "first"), TOKENS)
    objective.attention_loss(out.attentions, IDS, MASK, 0.0).backward()
    for layer in encoder.encoder.layer:
        assert layer.attention.self.query.weight.grad.abs().sum() > 0
    assert encoder.embeddings.position_embeddings.weight.grad.abs().sum() > 0


def test_from_config_validates(tiny_train_config):
    from bertzoo.backbone import resolve_backbone
    from bertzoo.tokenization import Tokenizer

    tokenizer = Tokenizer.from_file(resolve_backbone("default", random_init=True).tokenizer_path)
    objective = G.AttentionGuidance.from_config(tiny_train_config(ag_weight=3.0, ag_patterns=("period",)), tokenizer)
    assert (objective.name, objective.needs_attentions, objective.weight) == ("attention_guidance", True, 3.0)
    with pytest.raises(ValueError, match="unknown attention pattern"):
        G.AttentionGuidance.from_config(tiny_train_config(ag_weight=3.0, ag_patterns=("nope",)), tokenizer)


def test_fine_tuning_logs_the_guidance_loss(tiny_train_config, tmp_path):
    from bertzoo.trainer.train import train

    # QA batches are guided too: their [CLS] question [SEP] context [SEP] windows go through the same encoder.
    config = tiny_train_config(tasks=("sentiment", "qa"), sampling="round_robin", max_steps=4, ag_weight=10.0,
                               eval_every_epoch=False)
    train(config)
    records = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    guided = [r["loss"]["attention_guidance"] for r in records if "attention_guidance" in r.get("loss", {})]
    assert len(guided) == 4 and all(v > 0 for v in guided)
    assert guided[-1] < guided[0]  # alpha_t decays linearly over the 4 steps
    assert {t for r in records for t in r.get("loss", {})} >= {"sentiment", "qa"}
