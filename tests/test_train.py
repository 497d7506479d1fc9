"""Training end to end on tiny random encoders: checkpoints, resume, the CLI's train/eval/predict."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from bertzoo.cli import main
from bertzoo.data import DataError
from bertzoo.trainer import train as train_module
from bertzoo.trainer.checkpoint import load_model, resolve_checkpoint
from conftest import TINY_ENCODER, interrupt_training, raise_on_call


def test_train_writes_atomic_checkpoints_and_log(tiny_train_config):
    config = tiny_train_config(keep_checkpoints=1)
    model, metrics = train_module.train(config)
    run = resolve_checkpoint(config.out_dir)
    assert {p.name for p in run.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json", "metrics.json",
                                              "trainer_state.safetensors", "trainer_state.json"}
    checkpoints = sorted(p.name for p in run.parent.glob("checkpoint-*"))
    assert len(checkpoints) <= 2 and (run.parent / "LATEST").read_text() == checkpoints[-1]
    assert not list(run.parent.glob(".checkpoint-*")), "no temporary directory may be left behind"
    saved = json.loads((run / "config.json").read_text())
    assert saved["train"]["encoder_overrides"] == TINY_ENCODER and saved["model"]["encoder"]["hidden_size"] == 32
    assert set(metrics) == {"sentiment", "paraphrase", "similarity", "qa"}
    assert set(json.loads((run / "metrics.json").read_text())) == set(metrics)
    records = [json.loads(line) for line in (run.parent / "train_log.jsonl").read_text().splitlines()]
    assert any("dev" in r for r in records) and all("step" in r for r in records)
    reloaded, _, _ = load_model(config.out_dir)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reloaded.state_dict()[name]), name


def test_resume_after_interruption_gives_the_same_weights(tiny_train_config, tmp_path, monkeypatch):
    uninterrupted = tiny_train_config(out_dir=str(tmp_path / "a"), eval_every_epoch=False)
    expected, _ = train_module.train(uninterrupted)

    interrupted = tiny_train_config(out_dir=str(tmp_path / "b"), eval_every_epoch=False)
    interrupt_training(monkeypatch, interrupted, at_loss_call=40)  # after the first epoch's checkpoint
    assert (tmp_path / "b" / "LATEST").exists()
    resumed, _ = train_module.train(interrupted, resume=True)
    for name, tensor in expected.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), f"{name} differs after resume"


def test_a_run_killed_during_a_mid_epoch_save_resumes_losing_at_most_save_every_steps(tiny_train_config, tmp_path,
                                                                                      monkeypatch):
    from bertzoo.trainer import checkpoint as ckpt

    uninterrupted = tiny_train_config(out_dir=str(tmp_path / "a"), eval_every_epoch=False, save_every=3)
    expected, _ = train_module.train(uninterrupted)

    # Killed while writing the checkpoint of step 9: the one of step 6 stays LATEST.
    interrupted = tiny_train_config(out_dir=str(tmp_path / "b"), eval_every_epoch=False, save_every=3)
    # Each checkpoint writes two safetensors files: the 5th write is the first of the 3rd checkpoint.
    real_save = raise_on_call(monkeypatch, ckpt, "save_file", 5)
    with pytest.raises(KeyboardInterrupt):
        train_module.train(interrupted)
    monkeypatch.setattr(ckpt, "save_file", real_save)
    assert (tmp_path / "b" / "LATEST").read_text().strip() == "checkpoint-000006"
    assert not (tmp_path / "b" / "checkpoint-000009").exists()  # the half-written one never took its name
    resumed, _ = train_module.train(interrupted, resume=True)
    for name, tensor in expected.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), f"{name} differs after resume"
    steps = [json.loads(line)["step"] for line in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == sorted(set(steps))  # no step logged twice across the kill and the resume


def test_sst_phrases_in_length_grouped_batches_train_and_resume_exactly(tiny_train_config, samples, tmp_path,
                                                                        monkeypatch, caplog):
    options = dict(eval_every_epoch=False, tasks=("sentiment", "similarity"), save_every=4, batch_tokens=160,
                   sst_phrases=str(samples / "sst-trees" / "train.txt"))
    with caplog.at_level("INFO", logger="bertzoo.train"):
        expected, _ = train_module.train(tiny_train_config(out_dir=str(tmp_path / "a"), **options))
    assert "sentiment/train: 24 sentences + 24 phrases" in caplog.text
    interrupted = tiny_train_config(out_dir=str(tmp_path / "b"), **options)
    interrupt_training(monkeypatch, interrupted, at_loss_call=7)
    resumed, _ = train_module.train(interrupted, resume=True)
    for name, tensor in expected.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), f"{name} differs after resume"


def test_a_missing_phrase_file_fails_before_the_run_directory_is_written(tiny_train_config, tmp_path):
    config = tiny_train_config(sst_phrases=str(tmp_path / "trees.txt"))
    with pytest.raises(DataError, match=f"{tmp_path / 'trees.txt'}: file not found"):
        train_module.train(config)
    assert not (tmp_path / "run").exists()


def test_sst_phrases_need_sst5(tiny_train_config, samples):
    with pytest.raises(ValueError, match="sst_phrases .*sst5, not 'sst2'"):
        tiny_train_config(sentiment_dataset="sst2", sst_phrases=str(samples / "sst-trees" / "train.txt"))


def test_cli_train_eval_predict_all_tasks(tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli-run"
    encoder = [f"--encoder={k}={v}" for k, v in TINY_ENCODER.items()]
    result = runner.invoke(main, ["train", "--out", str(out), "--random-init", *encoder, "--limit-per-task", "8",
                                  "--eval-limit-per-task", "6", "--max-steps", "6", "--batch-size", "4",
                                  "--qa-max-length", "96", "--qa-doc-stride", "32", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "pearson" in result.output and "HasAns_f1" in result.output
    result = runner.invoke(main, ["eval", str(out), "--limit", "5", "--json-out", str(tmp_path / "m.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "m.json").read_text())["sentiment"]["n"] == 5

    def predict(task, *texts):
        r = runner.invoke(main, ["predict", str(out), "--task", task, "--json", *texts])
        assert r.exit_code == 0, r.output
        assert "the run's BEST checkpoint" in r.stderr  # which checkpoint answered goes to stderr, JSON to stdout
        return json.loads(r.stdout)["results"]

    sentiment = predict("sentiment", "a gorgeous, witty film", "dull and lifeless")
    assert len(sentiment) == 2 and abs(sum(sentiment[0]["probabilities"]) - 1) < 1e-6
    assert sentiment[0]["label"] in ("very negative", "negative", "neutral", "positive", "very positive")
    paraphrase = predict("paraphrase", "How do I learn?", "How can I learn?")[0]
    assert 0 <= paraphrase["probability"] <= 1 and paraphrase["is_paraphrase"] == (paraphrase["probability"] >= 0.5)
    assert 0 <= predict("similarity", "A man plays guitar.", "A person plays music.")[0]["score"] <= 5
    context = "The Eiffel Tower is in Paris. It was finished in 1889."
    qa = predict("qa", "When was it finished?", context)[0]
    assert qa["answer"] == (context[qa["start_char"]:qa["end_char"]] if qa["start_char"] >= 0 else "")
    readable = runner.invoke(main, ["predict", str(out), "--task", "sentiment", "a gorgeous, witty film"])
    assert readable.stdout.rstrip("\n").endswith("\ta gorgeous, witty film") and "(p=0." in readable.stdout
    bad = runner.invoke(main, ["predict", str(out), "--task", "paraphrase", "only one"])
    assert bad.exit_code != 0 and "exactly two texts" in bad.output


def test_cli_resume_keeps_saved_config_but_takes_explicit_options(tmp_path):
    runner = CliRunner()
    out = tmp_path / "r"
    encoder = [f"--encoder={k}={v}" for k, v in TINY_ENCODER.items()]
    common = ["--out", str(out), "--no-progress", "--no-eval"]
    first = runner.invoke(main, ["train", *common, "--random-init", *encoder, "--tasks", "sentiment",
                                 "--limit-per-task", "8", "--batch-size", "4", "--max-steps", "2"])
    assert first.exit_code == 0, first.output
    second = runner.invoke(main, ["train", *common, "--resume", "--max-steps", "4"])
    assert second.exit_code == 0, second.output
    config = json.loads((out / "train_config.json").read_text())
    assert config["max_steps"] == 4 and config["tasks"] == ["sentiment"] and config["random_init"] is True
    assert (out / "LATEST").read_text() == "checkpoint-000004"
    assert load_file(str(out / "checkpoint-000004" / "model.safetensors"))


def test_next_steps_suggest_a_predict_on_a_trained_task_that_runs(tmp_path):
    """A QA-only run must not suggest predicting sentiment with a head it never trained; the hint runs as printed."""
    runner = CliRunner()
    out = tmp_path / "qa"
    encoder = [f"--encoder={k}={v}" for k, v in TINY_ENCODER.items()]
    trained = runner.invoke(main, ["train", "--out", str(out), "--no-progress", "--no-eval", "--random-init", *encoder,
                                   "--tasks", "qa", "--limit-per-task", "8", "--batch-size", "4", "--max-steps", "1"])
    assert trained.exit_code == 0, trained.output
    # `bertzoo predict ...`, or the script's path where `bertzoo` is not on PATH (tests/test_train_cli.py)
    words = next(shlex.split(line) for line in trained.output.splitlines() if line.split()[1:2] == ["predict"])
    assert words[words.index("--task") + 1] == "qa"
    answered = runner.invoke(main, words[1:])
    assert answered.exit_code == 0, answered.output
    answer = answered.stdout.strip()  # a random encoder's span of the context, or no answer
    assert answer == "no answer" or "(characters " in answer, answer


def test_missing_data_file_fails_naming_it(tiny_train_config, tmp_path):
    config = tiny_train_config(data_dir=str(tmp_path))
    with pytest.raises(Exception, match="ids-sst-train.csv"):
        train_module.train(config)


def test_layer_wise_lr_decay_scales_each_encoder_layer_and_leaves_heads_alone(tiny_train_config):
    config = tiny_train_config(lr=1e-4, head_lr=1e-3, lr_layer_decay=0.5)  # TINY_ENCODER has 2 layers
    model, _ = train_module.build_model(config)
    optimizer = train_module.make_optimizer(model, config.lr, config.weight_decay, config.head_lr,
                                            config.lr_layer_decay)
    rate_of = {id(p): group["base_lr"] for group in optimizer.param_groups for p in group["params"]}
    rates = {name: rate_of[id(p)] for name, p in model.named_parameters()}
    assert rates["encoder.encoder.layer.1.output.dense.weight"] == pytest.approx(1e-4)  # the top layer: lr
    assert rates["encoder.encoder.layer.0.output.dense.weight"] == pytest.approx(5e-5)
    assert rates["encoder.embeddings.word_embeddings.weight"] == pytest.approx(2.5e-5)
    assert {r for n, r in rates.items() if n.startswith("heads.")} == {1e-3}
    plain = train_module.make_optimizer(model, config.lr, config.weight_decay, config.head_lr)
    assert {g["base_lr"] for g in plain.param_groups} == {1e-4, 1e-3}
    with pytest.raises(ValueError, match="lr_layer_decay"):
        tiny_train_config(lr_layer_decay=0.0)


def test_batch_tokens_tasks_group_only_the_tasks_named(tiny_train_config, tmp_path):
    # 24 items per task, batches of 4: 6 batches a pass. A 10,000-token budget takes a task's whole pass in 1 batch.
    def epoch_steps(**options) -> int:
        config = tiny_train_config(tasks=("sentiment", "paraphrase"), epochs=1, eval_every_epoch=False,
                                   batch_tokens=10_000, out_dir=str(tmp_path / str(len(options))), **options)
        train_module.train(config)
        records = (Path(config.out_dir) / "train_log.jsonl").read_text().splitlines()
        return [json.loads(line) for line in records if "loss" in json.loads(line)][-1]["step"]

    assert epoch_steps() == 1 + 1
    assert epoch_steps(batch_tokens_tasks=("sentiment",)) == 1 + 6  # paraphrase keeps batches of 4
    assert tiny_train_config(batch_tokens=64, batch_tokens_tasks=["qa"]).batch_tokens_of("sentiment") is None
    with pytest.raises(ValueError, match="batch_tokens_tasks"):
        tiny_train_config(batch_tokens_tasks=("sentiment",))  # no batch_tokens
    with pytest.raises(ValueError, match="batch_tokens_tasks"):
        tiny_train_config(tasks=("sentiment",), batch_tokens=64, batch_tokens_tasks=("qa",))  # not trained


def test_task_weights_scale_a_tasks_share_of_steps_and_the_epoch(tiny_train_config):
    # 24 items in batches of 4: 6 batches a pass per task; sentiment weighted 0.25 -> an epoch of 1.5 + 6 = 8 steps
    config = tiny_train_config(tasks=("sentiment", "paraphrase"), epochs=2, eval_every_epoch=False,
                               task_weights={"sentiment": 0.25})
    train_module.train(config)
    records = [json.loads(line) for line in (Path(config.out_dir) / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert steps[-1]["step"] == 16
    trained = [task for r in steps for task in r["loss"]]  # log_every=1: one task per record
    assert trained.count("sentiment") < trained.count("paraphrase") / 2
    for bad in ({"qa": 1.0}, {"sentiment": 0}, {"sentiment": "x"}):
        with pytest.raises(ValueError, match="task_weights"):
            tiny_train_config(tasks=("sentiment", "paraphrase"), task_weights=bad)
    with pytest.raises(ValueError, match="task_weights need proportional"):
        tiny_train_config(sampling="round_robin", task_weights={"sentiment": 0.5})
