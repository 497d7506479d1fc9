"""Long jobs show progress on a terminal (and stay silent in logs); third-party loggers speak only with --verbose."""

from __future__ import annotations

import io
import logging
import sys

import numpy as np
import pytest

from bertzoo import pipeline
from bertzoo.backbone import resolve_backbone
from bertzoo.cli import THIRD_PARTY_LOGGERS, _setup_logging
from bertzoo.datafiles import load_split, samples_dir
from bertzoo.tokenization import Tokenizer


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class ConstantBackend:
    """Encoder states of zeros and constant head outputs: enough to drive the pipeline's batching."""

    def encode(self, batch):
        return np.zeros((*batch["input_ids"].shape, 4), dtype=np.float32)

    def head(self, task, inputs):
        return (np.zeros((len(next(iter(inputs.values()))), 5), dtype=np.float32),)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(resolve_backbone("default").tokenizer_path)


@pytest.mark.parametrize("label", ["eval sentiment", None])
def test_a_labelled_pipeline_run_draws_a_bar_on_a_terminal(monkeypatch, tokenizer, label):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    examples = load_split(samples_dir(), "sentiment", "dev")[:20]
    pipeline.predict(ConstantBackend(), "sentiment", examples, tokenizer, pipeline.T.Limits(), batch_size=8,
                     progress=label)
    if label:
        assert "eval sentiment" in terminal.getvalue() and "/20 " in terminal.getvalue()  # one bar over 20 sentences
    else:
        assert terminal.getvalue() == ""


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch, tokenizer):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    examples = load_split(samples_dir(), "sentiment", "dev")[:5]
    pipeline.predict(ConstantBackend(), "sentiment", examples, tokenizer, pipeline.T.Limits(),
                     progress="eval sentiment")
    assert log.getvalue() == ""


@pytest.mark.parametrize("verbose", [False, True])
def test_third_party_loggers_speak_only_with_verbose(verbose):
    root_level = logging.getLogger().level
    try:
        _setup_logging(verbose)
        assert logging.getLogger("bertzoo.export").isEnabledFor(logging.INFO)
        for name in (*THIRD_PARTY_LOGGERS, "onnx_ir.passes.common.unused_removal", "some_other_library"):
            assert logging.getLogger(name).isEnabledFor(logging.INFO) == verbose, name
    finally:
        logging.getLogger().setLevel(root_level)
        for name in THIRD_PARTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
