"""Integration on the real all-MiniLM-L6-v2: a short fine-tuning run lowers the loss and beats chance."""

from __future__ import annotations

import json

import pytest

from bertzoo.trainer.config import TrainConfig
from bertzoo.trainer.train import train


@pytest.mark.slow
def test_short_sentiment_run_lowers_loss_and_beats_chance(tmp_path):
    config = TrainConfig(out_dir=str(tmp_path / "run"), tasks=("sentiment",), epochs=4, batch_size=16, lr=1e-4,
                         progress=False, log_every=5, seed=0)
    _, metrics = train(config)
    records = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"]["sentiment"] for r in records if "loss" in r]
    assert losses[-1] < losses[0] - 0.1, losses
    # The bundled SST-5 dev sample has 80 sentences, 16 per class: chance and majority are both 0.20, and 0.30 is
    # more than two binomial standard deviations (0.045) above it.
    assert metrics["sentiment"]["n"] == 80
    assert metrics["sentiment"]["accuracy"] >= 0.30, metrics
