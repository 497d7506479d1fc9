"""Shared fixtures: tiny random encoders for speed, the real MiniLM only where a test says so."""

from __future__ import annotations

import pytest

from bertzoo.datafiles import samples_dir

TINY_ENCODER = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 512,
}


@pytest.fixture
def tiny_train_config(tmp_path):
    """A TrainConfig for a tiny random encoder on the bundled samples: seconds, not minutes."""
    from bertzoo.trainer.config import TrainConfig

    def make(**overrides):
        values = dict(
            out_dir=str(tmp_path / "run"), random_init=True, encoder_overrides=dict(TINY_ENCODER),
            limit_per_task=24, eval_limit_per_task=12, batch_size=4, epochs=2, lr=1e-3, qa_max_length=128,
            qa_doc_stride=32, progress=False, log_every=1,
        )
        values.update(overrides)
        return TrainConfig(**values)

    return make


@pytest.fixture(scope="session")
def samples():
    return samples_dir()
