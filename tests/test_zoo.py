"""The zoo's registry, CLI, training curves, sparsity report and attention pictures."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bertzoo.cli import main
from bertzoo.zoo import PresetError, load_preset, preset_names
from conftest import TINY_ENCODER

SYSTEMS = {"baseline", "ssaf", "ag", "ssa", "task_attention", "cross_pool_dtp"}


def test_every_system_has_a_valid_preset():
    assert SYSTEMS <= set(preset_names())
    for name in preset_names():
        preset = load_preset(name)
        config = preset.config()
        assert config.preset == name and preset.description and preset.paper


def test_presets_set_what_their_paper_describes():
    assert load_preset("ssaf").config().encoder_overrides["attention"] == "sparsegen_lin"
    assert load_preset("ag").config().ag_weight > 0
    ssa = load_preset("ssa").config()
    assert ssa.sentiment_head == "ssa" and ssa.ssa_rounds >= 1
    task = load_preset("task_attention").config()
    assert (task.sentiment_head, task.paraphrase_head, task.similarity_head) == (
        "self_attention", "cross_attention", "cross_attention")
    assert (task.sentiment_attention_layers, task.paraphrase_cross_layers, task.similarity_cross_layers) == (2, 1, 3)
    dtp = load_preset("cross_pool_dtp").config()
    assert dtp.sampling == "dynamic" and dtp.paraphrase_head == "cross_pool"


@pytest.mark.parametrize("body, message", [
    ('description = "d"\npaper = "p"\n[train]\nlearning_rate = 1\n', "unknown [train] key 'learning_rate'"),
    ('description = "d"\npaper = "p"\nextra = 1\n', "unknown top-level key(s) ['extra']"),
    ('paper = "p"\n', "'description' must be a non-empty string"),
    ('description = "d"\npaper = "p"\n[train]\nsampling = "sometimes"\n', "sampling must be one of"),
    ('description = "d"\npaper = "p"\n[train]\nencoder_overrides = { atention = "softmax" }\n',
     "unknown encoder_overrides key 'atention'"),
    ('description = "d"\npaper = "p"\n[train\n', "not valid TOML"),
])
def test_a_bad_preset_names_the_file_and_the_key(tmp_path, body, message):
    path = tmp_path / "mine.toml"
    path.write_text(body)
    with pytest.raises(PresetError) as info:
        load_preset(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_unknown_preset_lists_the_bundled_ones():
    with pytest.raises(PresetError, match="bundled presets: .*ssaf"):
        load_preset("nope")


def test_zoo_list_and_show():
    runner = CliRunner()
    listed = runner.invoke(main, ["zoo", "list"])
    assert listed.exit_code == 0, listed.output
    for name in SYSTEMS:
        assert name in listed.output
    shown = runner.invoke(main, ["zoo", "show", "task_attention"])
    assert shown.exit_code == 0, shown.output
    config = json.loads(shown.output[shown.output.index("{"):])
    assert config["preset"] == "task_attention" and config["similarity_cross_layers"] == 3
    assert runner.invoke(main, ["zoo", "show", "nope"]).exit_code != 0


def test_train_rejects_an_unknown_set_key():
    result = CliRunner().invoke(main, ["train", "--set", "ssa_round=2", "--no-progress"])
    assert result.exit_code != 0 and "ssa_round" in result.output


@pytest.mark.slow
def test_ssaf_preset_trains_reports_sparsity_curves_and_viz(tmp_path):
    """One short run of the SSAF preset through the CLI on a tiny encoder: the log reports per-layer exact zeros,
    curves.png is written, and viz draws the attention and prints the same kind of sparsity."""
    out = tmp_path / "run"
    runner = CliRunner()
    args = ["train", "--preset", "ssaf", "--out", str(out), "--random-init", "--tasks", "sentiment,similarity",
            "--limit-per-task", "16", "--eval-limit-per-task", "8", "--batch-size", "4", "--max-steps", "4",
            "--no-progress", "--set", "lr=0.001"]
    for key, value in TINY_ENCODER.items():
        args += ["--encoder", f"{key}={value}"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["preset"] == "ssaf" and saved["encoder_overrides"]["attention"] == "sparsegen_lin"
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    zeros = [r["attention_zero_fraction"] for r in records if "attention_zero_fraction" in r]
    assert zeros and len(zeros[-1]) == TINY_ENCODER["num_hidden_layers"]
    # A random tiny encoder's scores are nearly flat, so few weights are truncated yet; the counting itself is tested
    # on sharpened scores below.
    assert all(0.0 <= z < 1.0 for z in zeros[-1])
    assert all("step_ms" in r for r in records if "loss" in r)
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    png = tmp_path / "att.png"
    shown = runner.invoke(main, ["viz", str(out), "the movie was surprisingly good .", "--out", str(png)])
    assert shown.exit_code == 0, shown.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shown.output.count("exactly zero") == TINY_ENCODER["num_hidden_layers"]
    bad = runner.invoke(main, ["viz", str(out), "text", "--heads", "99", "--out", str(png)])
    assert bad.exit_code != 0 and "out of range" in bad.output


def test_softmax_attention_has_no_exact_zeros_but_sparsegen_does():
    import torch

    from bertzoo.tokenization import Encoding
    from bertzoo.trainer.model import Encoder, EncoderConfig
    from bertzoo.trainer.sparsity import attention_zero_fraction

    torch.manual_seed(0)
    encodings = [Encoding(list(range(5, 5 + n)), [0] * n) for n in (3, 9, 6)]
    soft = Encoder(EncoderConfig(vocab_size=50, **TINY_ENCODER))
    assert attention_zero_fraction(soft, encodings, pad_id=0) == [0.0, 0.0]  # padding is not counted
    sparse = Encoder(EncoderConfig(vocab_size=50, attention="sparsegen_lin", sparsegen_lambda=0.5, **TINY_ENCODER))
    sparse.load_state_dict(soft.state_dict())
    for module in sparse.modules():  # sharpen the scores so sparsegen-lin clearly truncates
        if isinstance(module, torch.nn.Linear) and module.out_features == TINY_ENCODER["hidden_size"]:
            module.weight.data *= 8
    fractions = attention_zero_fraction(sparse, encodings, pad_id=0)
    assert all(0.0 < f < 1.0 for f in fractions)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_one_short_run_per_preset(name, tmp_path):
    """Every preset trains end to end on a tiny encoder (its mechanisms switched on as the preset sets them), saves a
    checkpoint that loads back with the same heads, and logs its auxiliary losses."""
    from bertzoo.trainer.checkpoint import load_model
    from bertzoo.trainer.train import train

    preset = load_preset(name)
    config = preset.config(out_dir=str(tmp_path / name), random_init=True, encoder_overrides=dict(TINY_ENCODER),
                           limit_per_task=16, eval_limit_per_task=8, batch_size=4, max_steps=9, lr=1e-3,
                           qa_max_length=128, qa_doc_stride=32, progress=False, log_every=1, dtp_every=4,
                           dtp_eval_limit=8)
    model, metrics = train(config)
    assert set(metrics) == {"sentiment", "paraphrase", "similarity", "qa"}
    loaded, saved, _ = load_model(tmp_path / name)
    assert saved["train"]["preset"] == name
    assert {t: type(h).__name__ for t, h in loaded.heads.items()} == {t: type(h).__name__ for t, h in model.heads.items()}
    records = [json.loads(line) for line in (tmp_path / name / "train_log.jsonl").read_text().splitlines()]
    logged = set().union(*(r.get("loss", {}).keys() for r in records))
    expected = {"ag": {"attention_guidance"}, "ssa": {"ssa"}}.get(name, set())
    assert expected <= logged, logged
    if name == "cross_pool_dtp":
        assert any("dtp" in r for r in records)
