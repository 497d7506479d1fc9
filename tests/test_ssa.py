"""Self-supervised attention (trainer/ssa.py): the head, batched probing, the objective's rounds, and a tiny run."""

from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from bertzoo.tokenization import Encoding
from bertzoo.trainer.batches import Feature
from bertzoo.trainer.heads import ForwardDetails, ModelConfig, MultitaskModel
from bertzoo.trainer.model import EncoderConfig
from bertzoo.trainer.ssa import SelfSupervisedAttention, SSASentimentHead, probe
from conftest import TINY_ENCODER

CLS, SEP, PAD, MASK, KEY = 101, 102, 0, 103, 777
SPECIALS = (CLS, SEP, PAD, MASK)


def sentence(*ids: int, label: int = 0) -> Feature:
    full = [CLS, *ids, SEP]
    return Feature((Encoding(full, [0] * len(full)),), (float(label),))


class KeyTokenModel(nn.Module):
    """Predicts class 1 exactly when the sentence contains KEY: only KEY can ever flip the prediction."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # probe() asks the parameters for the device
        self.calls: list[int] = []  # batch size of every forward pass
        self.saw_training = False

    def forward(self, task: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.calls.append(batch["input_ids"].shape[0])
        self.saw_training |= self.training
        has_key = ((batch["input_ids"] == KEY) & batch["attention_mask"].bool()).any(1).float()
        return torch.stack([1 - has_key, has_key], dim=-1) + self.anchor


def tiny_model(mode: str = "attention", seed: int = 0) -> MultitaskModel:
    torch.manual_seed(seed)
    return MultitaskModel(ModelConfig(EncoderConfig(**TINY_ENCODER), tasks=("sentiment",), sentiment_num_labels=5,
                                      sentiment_head="ssa", ssa_mode=mode))


def random_features(n: int, seed: int = 0) -> list[Feature]:
    rng = np.random.default_rng(seed)
    return [sentence(*rng.integers(1000, 2000, int(rng.integers(1, 12))).tolist()) for _ in range(n)]


# ------------------------------------------------------------------------------------------------------------- head


@pytest.mark.parametrize("mode", ["attention", "classifier", "both"])
def test_head_shapes_padding_invariance_and_report(mode):
    torch.manual_seed(0)
    head = SSASentimentHead(32, 5, dropout=0.1, mode=mode).eval()
    states, mask = torch.randn(3, 7, 32), torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    report: dict = {}
    logits = head(states, mask, report=report)
    assert logits.shape == (3, 5)
    assert torch.equal(logits, head(states, mask)), "the report must not change the output"
    # More padding, with garbage states under it, changes nothing.
    padded_states = torch.cat([states, 100 * torch.randn(3, 5, 32)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(3, 5, dtype=torch.long)], dim=1)
    torch.testing.assert_close(head(padded_states, padded_mask), logits, rtol=1e-5, atol=1e-6)
    if mode in ("attention", "both"):
        attention = report["token_attention"]
        assert attention.shape == report["token_scores"].shape == (3, 7)
        torch.testing.assert_close(attention.sum(-1), torch.ones(3))
        assert (attention[1, 4:] == 0).all() and (attention[1, :4] > 0).all()
    else:
        assert "token_attention" not in report
    assert ("token_logits" in report) == (mode in ("classifier", "both"))
    if "token_logits" in report:
        assert report["token_logits"].shape == (3, 7)


def test_multitask_forward_reports_only_with_details():
    model = tiny_model("both").train()
    batch = {"input_ids": torch.randint(1000, 2000, (2, 6)), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    details = model("sentiment", batch, details=True)
    assert details.outputs.shape == (2, 5)
    assert set(details.head) == {"token_scores", "token_attention", "token_logits"}
    assert model("sentiment", batch).shape == (2, 5)


def test_ssa_head_exports_and_onnxruntime_matches_torch(tmp_path):
    import onnxruntime as ort

    from bertzoo.export.onnx_graphs import export_graphs

    model = tiny_model("both").eval()
    export_graphs(model, tmp_path)
    session = ort.InferenceSession(str(tmp_path / "head_sentiment.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, t in ((1, 3), (5, 23)):
        states = rng.standard_normal((b, t, 32)).astype(np.float32)
        mask = np.ones((b, t), dtype=np.int64)
        mask[-1, t // 2:] = 0
        (got,) = session.run(None, {"states": states, "mask": mask})
        with torch.no_grad():
            want = model.heads["sentiment"](torch.from_numpy(states), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------- probing


def test_probe_labels_exactly_the_decisive_token_in_few_forward_passes():
    features = [sentence(5, KEY, 6, 7), sentence(8, 9), sentence(KEY), sentence(KEY, 4, KEY), sentence(1, 2, 3, KEY, 5)]
    model = KeyTokenModel().train()
    labels, stats = probe(model, features, MASK, SPECIALS, PAD, batch_size=4)
    expected = [[0, 0, 1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0],
                [0, 0, 0, 0, 0],  # KEY twice: masking one copy never flips the prediction
                [0, 0, 0, 0, 1, 0, 0]]
    assert [lab.tolist() for lab in labels] == expected
    assert all(lab.dtype == np.int8 for lab in labels)
    variants = sum(len(f.encodings[0].input_ids) - 2 for f in features)
    assert stats.variants == variants == 15 and stats.important == 3
    # Batched: ceil(5 / 4) originals + ceil(15 / 4) variant passes, never one pass per variant.
    assert len(model.calls) == stats.forwards == 2 + 4 < variants
    assert max(model.calls) == 4
    assert not model.saw_training and model.training, "probing runs in eval mode and restores training mode"


def test_probe_is_batched_and_matches_one_at_a_time_on_a_real_model():
    model = tiny_model().train()
    features = random_features(10)
    calls: list[int] = []
    hook = model.heads["sentiment"].register_forward_hook(lambda m, args, out: calls.append(out.shape[0]))
    try:
        labels, stats = probe(model, features, MASK, SPECIALS, PAD, batch_size=16)
    finally:
        hook.remove()
    assert len(calls) == stats.forwards == math.ceil(10 / 16) + math.ceil(stats.variants / 16) < stats.variants
    for feature, lab in zip(features, labels, strict=True):
        assert lab.shape == (len(feature.encodings[0].input_ids),) and lab[0] == lab[-1] == 0
    single, _ = probe(model, features, MASK, SPECIALS, PAD, batch_size=1)
    assert [a.tolist() for a in single] == [b.tolist() for b in labels], "batching and padding must not change labels"
    assert model.training


# -------------------------------------------------------------------------------------------------------- objective


def stream(features: list[Feature]) -> dict:
    return {"sentiment": SimpleNamespace(features=features)}


def test_phases_probe_once_at_each_round_start_and_again_after_resume():
    features = [sentence(KEY, 3), sentence(4, 5), sentence(6, KEY)]
    objective = SelfSupervisedAttention(2, 1.0, MASK, SPECIALS, PAD, probe_batch_size=8)
    model = KeyTokenModel()
    for step in range(9):  # 9 steps, 3 phases: [0, 3) plain, [3, 6) round 1, [6, 9) round 2
        objective.prepare(step, 9, model, stream(features))
        assert bool(objective.labels) == (step >= 3)
    assert [(phase, step) for phase, step, _ in objective.history] == [(1, 3), (2, 6)]
    assert {i: lab.tolist() for i, lab in objective.labels.items()} == {0: [0, 1, 0, 0], 1: [0, 0, 0, 0],
                                                                         2: [0, 0, 1, 0]}
    resumed = SelfSupervisedAttention(2, 1.0, MASK, SPECIALS, PAD)
    for step in range(7, 9):  # a --resume at step 7 (inside round 2) re-probes at its first step only
        resumed.prepare(step, 9, model, stream(features))
    assert [(phase, step) for phase, step, _ in resumed.history] == [(2, 7)]


def test_probe_subset_is_seeded_fixed_and_limited(caplog):
    features = random_features(20)
    objective = SelfSupervisedAttention(1, 1.0, MASK, SPECIALS, PAD, probe_limit=6, seed=3)
    with caplog.at_level(logging.INFO, logger="bertzoo.ssa"):
        objective.prepare(5, 10, KeyTokenModel(), stream(features))
    assert len(objective.labels) == 6
    assert sorted(objective.labels) == objective.probe_subset(20).tolist()
    assert objective.probe_subset(20).tolist() == SelfSupervisedAttention(
        1, 1.0, MASK, SPECIALS, PAD, probe_limit=6, seed=3).probe_subset(20).tolist()
    assert "ssa round 1/1 at step 5" in caplog.text and "0 tokens labelled important" in caplog.text


def test_loss_is_lower_when_the_scores_match_the_labels_and_skips_what_it_cannot_supervise():
    objective = SelfSupervisedAttention(1, 0.5, MASK, SPECIALS, PAD)
    objective.labels = {10: np.array([0, 1, 0, 0, 0], dtype=np.int8), 11: np.array([0, 0, 0, 1, 0], dtype=np.int8)}
    ids = torch.tensor([[CLS, 7, 8, 9, SEP, PAD], [CLS, 7, 8, 9, SEP, PAD], [CLS, KEY, SEP, PAD, PAD, PAD]])
    batch = {"input_ids": ids, "attention_mask": (ids != PAD).long()}
    indices = np.array([10, 11, 99])  # 99 was not probed: it adds nothing

    def details(scores: torch.Tensor) -> ForwardDetails:
        return ForwardDetails(torch.zeros(3, 5), None, {"token_scores": scores, "token_attention": scores.softmax(-1)})

    matching = torch.full((3, 6), -4.0)
    matching[0, 1] = matching[1, 3] = 4.0
    wrong = torch.full((3, 6), -4.0)
    wrong[0, 2] = wrong[1, 1] = 4.0
    good = objective.loss("sentiment", indices, batch, details(matching), 0.6)
    bad = objective.loss("sentiment", indices, batch, details(wrong), 0.6)
    assert good is not None and bad is not None and good < bad
    # Unlabelled rows do not count: changing row 2's scores changes nothing.
    noisy = matching.clone()
    noisy[2] = 9.0
    assert objective.loss("sentiment", indices, batch, details(noisy), 0.6) == good
    assert objective.loss("paraphrase", indices, batch, details(matching), 0.6) is None
    assert objective.loss("sentiment", np.array([97, 98, 99]), batch, details(matching), 0.6) is None
    assert SelfSupervisedAttention(1, 1.0, MASK, SPECIALS).loss("sentiment", indices, batch, details(matching),
                                                                 0.1) is None, "no labels before the first round"


def test_from_config_needs_the_ssa_head(tiny_train_config):
    tokenizer = SimpleNamespace(cls_id=CLS, sep_id=SEP, pad_id=PAD, mask_id=MASK)
    with pytest.raises(ValueError, match="sentiment_head='ssa'"):
        SelfSupervisedAttention.from_config(tiny_train_config(ssa_rounds=1), tokenizer)
    objective = SelfSupervisedAttention.from_config(
        tiny_train_config(ssa_rounds=2, sentiment_head="ssa", ssa_probe_limit=7, ssa_probe_batch_size=32), tokenizer)
    assert (objective.rounds, objective.probe_limit, objective.probe_batch_size) == (2, 7, 32)


# ---------------------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_tiny_training_run_logs_the_ssa_loss_after_the_phase_boundary(tiny_train_config, caplog):
    from bertzoo.trainer.train import train

    config = tiny_train_config(tasks=("sentiment",), sentiment_head="ssa", ssa_rounds=1, ssa_mode="both",
                               max_steps=8, eval_every_epoch=False, ssa_probe_limit=16, ssa_probe_batch_size=64)
    with caplog.at_level(logging.INFO, logger="bertzoo.ssa"):
        model, _ = train(config)
    records = [json.loads(line) for line in open(f"{config.out_dir}/train_log.jsonl", encoding="utf-8")]
    steps = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(steps) == list(range(1, 9))
    # Steps 0-3 (logged as 1-4) are plain fine-tuning; round 1 probes before step 4 and supervises from there on.
    assert all("ssa" not in steps[s] for s in range(1, 5))
    assert all("ssa" in steps[s] and math.isfinite(steps[s]["ssa"]) for s in range(5, 9))
    assert "ssa round 1/1 at step 4: probed 16 sentences" in caplog.text
    assert model.heads["sentiment"].mode == "both"
