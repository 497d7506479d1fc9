"""Masked-language-model pre-training: BERT's masking, the MLM head, and `bertzoo pretrain` end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from bertzoo.backbone import resolve_backbone
from bertzoo.tokenization import Tokenizer
from bertzoo.trainer import pretrain as P
from bertzoo.trainer.masked_lm import IGNORE
from conftest import TINY_ENCODER

TINY_OPTIONS = [arg for key, value in TINY_ENCODER.items() for arg in ("--encoder", f"{key}={value}")]
SENTENCES = [
    "the cat sat on the mat .", "a dog ran in the park .", "we like green tea in the morning .",
    "rain fell on the old town .", "she reads a book every night .", "the train left the station early .",
    "birds sing when the sun rises .", "he painted the door bright red .", "children played by the river .",
    "the market opens at nine .",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(resolve_backbone("default", random_init=True).tokenizer_path)


def test_masking_statistics(tokenizer):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (512, 64), generator=gen)
    lengths = torch.randint(3, 65, (512,), generator=gen)
    mask = (torch.arange(64)[None, :] < lengths[:, None]).long()
    ids[:, 0] = tokenizer.cls_id
    ids[torch.arange(512), lengths - 1] = tokenizer.sep_id
    ids[:, 5] = torch.where(lengths > 6, tokenizer.unk_id, ids[:, 5])
    ids = ids.masked_fill(mask == 0, tokenizer.pad_id)
    specials = P.special_ids(tokenizer)
    inputs, labels = P.mask_tokens(ids, mask, specials, tokenizer.mask_id, tokenizer.vocab_size, gen)

    candidates = mask.bool() & ~torch.isin(ids, specials)
    selected = labels != IGNORE
    assert not (selected & ~candidates).any()  # specials and padding are never selected
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(inputs[~selected], ids[~selected])  # nothing else changes
    # BERT's count per sequence: max(1, round(15% of its real tokens)).
    n = candidates.sum(1)
    expected = torch.where(n > 0, (n * 0.15).round().long().clamp(min=1), 0)
    assert torch.equal(selected.sum(1), expected)
    total = int(selected.sum())
    masked = int((inputs[selected] == tokenizer.mask_id).sum()) / total
    unchanged = int((inputs[selected] == ids[selected]).sum()) / total
    replaced = 1 - masked - unchanged
    assert masked == pytest.approx(0.8, abs=0.03)
    assert unchanged == pytest.approx(0.1, abs=0.02)
    assert replaced == pytest.approx(0.1, abs=0.02)
    random_ids = inputs[selected & (inputs != tokenizer.mask_id) & (inputs != ids)]
    assert not torch.isin(random_ids, specials).any()


def test_masking_is_seeded(tokenizer):
    ids = torch.randint(1000, 30000, (8, 20))
    mask = torch.ones_like(ids)
    specials = P.special_ids(tokenizer)
    runs = [P.mask_tokens(ids, mask, specials, tokenizer.mask_id, tokenizer.vocab_size,
                          torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_corpus_from_files_and_a_data_dir(tmp_path, samples):
    path = tmp_path / "c.txt"
    path.write_text("first line\n\n  second line \nfirst line\n", encoding="utf-8")
    assert P.load_corpus((str(path),)) == ["first line", "second line"]
    texts = P.load_corpus((str(path),), str(samples))
    assert texts[:2] == ["first line", "second line"] and len(texts) > 100 and len(set(texts)) == len(texts)


def test_cli_defaults_match_the_config():
    from bertzoo.cli_pretrain import DEFAULTS

    defaults = {f.name: f.default for f in dataclasses.fields(P.PretrainConfig)}
    assert {k: defaults[k] for k in DEFAULTS} == DEFAULTS


def run_cli(tmp_path, *extra: str) -> tuple[object, Path]:
    from bertzoo.cli import main

    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    out = tmp_path / "pre"
    result = CliRunner().invoke(main, ["pretrain", str(corpus), "--random-init", *TINY_OPTIONS, "--out", str(out),
                                       "--batch-size", "4", "--max-seq-length", "16", "--lr", "3e-3",
                                       "--log-every", "5", "--no-progress", *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result, out


def test_pretrain_cli_end_to_end_and_fine_tune_from_it(tmp_path, tiny_train_config):
    from bertzoo.trainer.model import Encoder, EncoderConfig
    from bertzoo.trainer.train import train

    result, out = run_cli(tmp_path, "--max-steps", "20", "--ag-weight", "10", "--eval-every", "10")
    assert "held-out MLM loss:" in result.output
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "mlm_loss" in r]
    assert [r["step"] for r in steps] == [5, 10, 15, 20]
    assert all(r["ag_loss"] > 0 and r["elapsed_s"] >= 0 and r["step_ms"] > 0 for r in steps)
    assert [r["step"] for r in records if "heldout_mlm_loss" in r] == [10, 20]
    assert (out / "loss_curve.png").stat().st_size > 1000
    assert json.loads((out / "pretrain_config.json").read_text())["ag_weight"] == 10.0
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary directory left behind

    files = resolve_backbone(str(out / "backbone"))
    config = EncoderConfig.from_dict(files.config())
    assert config.hidden_size == TINY_ENCODER["hidden_size"] and files.config()["model_type"] == "bert"
    encoder = Encoder(config)
    encoder.load_pretrained(files.weights_path)
    Tokenizer.from_file(files.tokenizer_path)
    # Continued pre-training picks the MLM head up again.
    model, _ = P.build_model(P.PretrainConfig(corpus=("x",), backbone=str(out / "backbone")))
    saved = load_file(str(files.weights_path))
    assert torch.equal(model.cls.predictions.bias, saved["cls.predictions.bias"])
    # `bertzoo train --backbone OUT/backbone` fine-tunes from it.
    trained, _ = train(tiny_train_config(backbone=str(out / "backbone"), random_init=False, encoder_overrides={},
                                         tasks=("sentiment",), max_steps=2, eval_every_epoch=False))
    assert trained.encoder.config.hidden_size == TINY_ENCODER["hidden_size"]


def test_mlm_loss_goes_down_on_a_repeated_corpus(tmp_path):
    result, out = run_cli(tmp_path, "--max-steps", "60", "--lr", "1e-2")
    losses = [json.loads(line)["mlm_loss"] for line in (out / "train_log.jsonl").read_text().splitlines()
              if "mlm_loss" in json.loads(line)]
    assert losses[-1] < losses[0] - 2.0, losses


def test_runs_are_reproducible(tmp_path):
    logs = []
    for name in ("a", "b"):
        _, out = run_cli(tmp_path / name, "--max-steps", "5")
        logs.append([{k: v for k, v in json.loads(line).items() if k not in ("elapsed_s", "step_ms")}
                     for line in (out / "train_log.jsonl").read_text().splitlines()])
    assert logs[0] == logs[1]


def test_bad_options_are_usage_errors(tmp_path):
    from bertzoo.cli import main

    result = CliRunner().invoke(main, ["pretrain"])
    assert result.exit_code == 2 and "CORPUS" in result.output
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n")
    result = CliRunner().invoke(main, ["pretrain", str(corpus), "--ag-patterns", "next,bogus"])
    assert result.exit_code == 2 and "bogus" in result.output
