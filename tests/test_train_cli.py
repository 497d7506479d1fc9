"""`bertzoo train` as a user meets it: a repeated command never takes over a run (refuse, --resume, --force), and a
damaged run or data file ends in one line, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from bertzoo.cli import main
from conftest import TINY_ENCODER

# A 1-3 step run of the tiny encoder on 8 bundled samples (sentiment unless a test says otherwise): a few seconds.
TINY_MODEL = ["--no-progress", "--no-eval", "--random-init", *[f"--encoder={k}={v}" for k, v in TINY_ENCODER.items()],
              "--limit-per-task", "8", "--batch-size", "4"]
TINY = [*TINY_MODEL, "--tasks", "sentiment"]


def train(*args: str):
    return CliRunner().invoke(main, ["train", *args])


def one_line_error(result) -> str:
    """The single ``Error:`` line of a failed command that printed no traceback."""
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    return errors[0]


def logged_steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "train_log.jsonl").read_text().splitlines()) if "loss" in r]


def test_a_repeated_train_refuses_resume_continues_and_force_replaces(tmp_path):
    run = tmp_path / "run"
    first = train("--out", str(run), *TINY, "--max-steps", "2", "--log-every", "1")
    assert first.exit_code == 0, first.output
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}

    error = one_line_error(train("--out", str(run), *TINY, "--max-steps", "1"))
    assert str(run) in error and "--resume" in error and "--force" in error
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before  # nothing touched

    assert "pass one of them" in one_line_error(train("--out", str(run), "--resume", "--force"))

    resumed = train("--out", str(run), "--resume", "--max-steps", "3", "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    assert (run / "LATEST").read_text() == "checkpoint-000003" and logged_steps(run) == [1, 2, 3]

    (run / "notes.txt").write_text("mine")  # not the run's: --force leaves it
    forced = train("--out", str(run), *TINY, "--max-steps", "1", "--log-every", "1", "--force")
    assert forced.exit_code == 0, forced.output
    assert logged_steps(run) == [1]  # the new run's log alone, not appended to the old one's
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-000001"]
    assert (run / "LATEST").read_text() == "checkpoint-000001"
    assert json.loads((run / "train_config.json").read_text())["max_steps"] == 1
    assert (run / "notes.txt").read_text() == "mine"


def test_train_without_out_run_twice_keeps_both_runs_and_names_the_second(tmp_path, monkeypatch):
    """README command 1 ends in `bertzoo train` with no --out: run again, it trains a new run beside the first."""
    monkeypatch.chdir(tmp_path)
    first = train(*TINY, "--max-steps", "1")
    assert first.exit_code == 0, first.output
    default = tmp_path / "runs" / "default"
    before = {p.name: p.stat().st_mtime_ns for p in default.iterdir()}

    second = train(*TINY, "--max-steps", "1")
    assert second.exit_code == 0, second.output
    assert "runs/default holds a run: this one goes to runs/default-2" in second.output
    assert "run directory: runs/default-2" in second.output
    assert "predict runs/default-2 " in second.output and "--out artifacts/default-2 " in second.output
    assert (tmp_path / "runs" / "default-2" / "LATEST").read_text() == "checkpoint-000001"
    assert {p.name: p.stat().st_mtime_ns for p in default.iterdir()} == before  # the first run untouched

    assert train(*TINY, "--max-steps", "1").exit_code == 0 and (tmp_path / "runs" / "default-3").is_dir()
    resumed = train("--resume", "--max-steps", "2", "--no-progress")  # --resume without --out: runs/default
    assert resumed.exit_code == 0, resumed.output
    assert (default / "LATEST").read_text() == "checkpoint-000002"


def test_a_fresh_directory_or_one_without_a_run_needs_no_flag(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "README").write_text("a folder the user made")
    result = train("--out", str(tmp_path / "run"), *TINY, "--max-steps", "1")
    assert result.exit_code == 0, result.output


def test_resume_of_a_truncated_latest_checkpoint_is_one_line(tmp_path):
    run = tmp_path / "run"
    assert train("--out", str(run), *TINY, "--max-steps", "2", "--save-every", "1").exit_code == 0
    weights = run / (run / "LATEST").read_text().strip() / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # the header cut short, as a full disk or a killed copy leaves
    error = one_line_error(train("--out", str(run), "--resume", "--max-steps", "3"))
    assert str(weights) in error and "truncated" in error
    assert str(run / "LATEST") in error and "--force" in error  # what to do


def test_squad_training_file_without_a_usable_question_is_one_line(tmp_path):
    data = tmp_path / "data" / "squad"
    data.mkdir(parents=True)
    question = {"id": "q1", "question": "Who?", "answers": [], "is_impossible": False}  # answerable, no answer
    squad = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": "Ann ran.", "qas": [question]}]}]}
    (data / "train-v2.0.json").write_text(json.dumps(squad))
    result = CliRunner().invoke(main, ["train", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"),
                                       *TINY_MODEL, "--tasks", "qa", "--max-steps", "1"])
    error = one_line_error(result)
    assert str(data / "train-v2.0.json") in error and "no usable qa train examples" in error
    assert "malformed" in error and "fix the file" in error
