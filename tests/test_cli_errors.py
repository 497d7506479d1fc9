"""A user's mistakes end in one line naming the path or field and what to do (exit code 1 or 2), never a traceback,
and before anything is written or a port is bound."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from bertzoo.cli import main


def run_cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    # A ClickException or usage error ends in SystemExit; anything else is the traceback a user must not see.
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def assert_one_line_error(result, *fragments: str, code: int = 1) -> None:
    assert result.exit_code == code, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1, result.output
    for fragment in fragments:
        assert fragment in error[0], error[0]


def test_train_data_directory_missing(tmp_path):
    result = run_cli("train", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"))
    assert_one_line_error(result, "'--data'", "nowhere", "does not exist", code=2)
    assert not (tmp_path / "run").exists()


def test_train_task_files_missing_suggests_tasks(tmp_path, samples):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("ids-sst-train.csv", "ids-sst-dev.csv"):
        shutil.copy(samples / name, data / name)
    result = run_cli("train", "--data", str(data), "--out", str(tmp_path / "run"))
    assert_one_line_error(result, "no paraphrase train files", "quora-train.csv",
                          "--tasks sentiment,similarity,qa")
    assert not (tmp_path / "run").exists()  # failed before the effective config was written


@pytest.mark.parametrize("command", [["predict", "--task", "sentiment"], ["eval"], ["export", "--out", "OUT"],
                                     ["serve", "--backend", "torch"]])
def test_a_path_that_is_not_a_checkpoint(tmp_path, command):
    args = [a.replace("OUT", str(tmp_path / "artifact")) for a in command]
    extra = ["some text"] if command[0] == "predict" else []
    result = run_cli(command[0], str(tmp_path), *args[1:], *extra)
    assert_one_line_error(result, str(tmp_path), "neither a checkpoint directory", "--out directory of `bertzoo train`")
    assert "listening" not in result.output and not (tmp_path / "artifact").exists()


def test_a_truncated_checkpoint(tmp_path, tiny_artifact):
    run, _ = tiny_artifact
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(run / (run / "LATEST").read_text().strip(), checkpoint)
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = run_cli("predict", str(checkpoint), "--task", "sentiment", "a fine film")
    assert_one_line_error(result, str(weights), "truncated or corrupt", "copy it again")


def test_serve_a_run_directory_says_what_to_do(tiny_artifact):
    run, _ = tiny_artifact
    result = run_cli("serve", str(run), "--port", "0", "--metrics-port", "0", "--http-port", "0")
    assert_one_line_error(result, str(run), "not an export artifact", "--backend torch", f"bertzoo export {run}")
    assert "listening" not in result.output  # checked before the port was bound


def test_serve_a_directory_without_manifest(tmp_path):
    result = run_cli("serve", str(tmp_path), "--port", "0", "--metrics-port", "0", "--http-port", "0")
    assert_one_line_error(result, str(tmp_path), "no manifest.json", "--out directory of `bertzoo export`")
    assert "listening" not in result.output


def test_bad_encoder_override(tmp_path):
    result = run_cli("train", "--encoder", "attention=foo", "--out", str(tmp_path / "run"))
    assert_one_line_error(result, "--encoder", "attention must be one of", "'foo'", code=2)
    result = run_cli("train", "--encoder", "layers=2", "--out", str(tmp_path / "run"))
    assert_one_line_error(result, "--encoder", "unknown encoder config keys: ['layers']", code=2)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("setting", "message"), [("lr=abc", "lr must be a number, got 'abc'"),
                                                   ("batch_size=2.5", "batch_size must be an integer, got 2.5"),
                                                   ("batch_size=0", "batch_size must be >= 1"),
                                                   ("lr_max=1", "unknown training config key(s) ['lr_max']")])
def test_bad_set_value(tmp_path, setting, message):
    result = run_cli("train", "--set", setting, "--out", str(tmp_path / "run"))
    assert_one_line_error(result, message, code=2)
    assert not (tmp_path / "run").exists()


def test_a_bad_override_of_a_preset_is_not_blamed_on_the_preset(tmp_path):
    result = run_cli("train", "--preset", "ssaf", "--set", "lr=abc", "--out", str(tmp_path / "run"))
    assert_one_line_error(result, "lr must be a number", code=2)
    assert "ssaf.toml" not in result.output


def damaged_copy(tmp_path, samples, damage) -> str:
    data = tmp_path / "data"
    shutil.copytree(samples, data)
    damage(data / "ids-sst-train.csv")
    return str(data)


def drop_label_column(path):
    path.write_text("".join("\t".join(line.split("\t")[:3]) + "\n" for line in path.read_text().splitlines()))


def every_label_out_of_range(path):
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], *("\t".join(line.split("\t")[:3] + ["9"]) for line in lines[1:])]) + "\n")


def bad_byte_on_line_4(path):
    lines = path.read_bytes().split(b"\n")
    lines[3] += b"\xff"
    path.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize(("damage", "message"), [
    (drop_label_column, "ids-sst-train.csv: no 'sentiment' column; train files need labels"),
    (every_label_out_of_range, "ids-sst-train.csv: no usable rows, every row was malformed; the first: line 2: "
                               "sentiment 9 is not in 0..4"),
    (bad_byte_on_line_4, "ids-sst-train.csv:4: not valid UTF-8"),
])
def test_damaged_data_files_name_the_file_and_the_place(tmp_path, samples, damage, message):
    data = damaged_copy(tmp_path, samples, damage)
    result = run_cli("train", "--data", data, "--out", str(tmp_path / "run"), "--max-steps", "1", "--no-progress")
    assert_one_line_error(result, message)


def test_a_truncated_trainer_state_names_the_checkpoint(tmp_path, tiny_artifact):
    run, _ = tiny_artifact
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    state = copy / (copy / "LATEST").read_text().strip() / "trainer_state.safetensors"
    state.write_bytes(state.read_bytes()[:100])
    result = run_cli("train", "--out", str(copy), "--resume", "--max-steps", "6", "--no-progress")
    assert_one_line_error(result, "its trainer state", "truncated or corrupt", "resume from another checkpoint")


def test_train_batch_tokens_tasks_names_the_option(tmp_path):
    result = run_cli("train", "--out", str(tmp_path / "run"), "--batch-tokens", "512", "--batch-tokens-tasks", "sst")
    assert_one_line_error(result, "--batch-tokens-tasks", "unknown task(s) ['sst']", code=2)
    result = run_cli("train", "--out", str(tmp_path / "run"), "--batch-tokens-tasks", "qa")
    assert_one_line_error(result, "batch_tokens_tasks ['qa'] needs batch_tokens", code=2)
    assert not (tmp_path / "run").exists()
