"""One CLI vocabulary: every option says what it does, `bertzoo --help` shows whole summaries, and a word means one
thing across commands (--data a data directory, --input a file of inputs, --auth-token the server's bearer token),
the old spellings kept as hidden aliases."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from bertzoo.cli import main


def commands(group: click.Group = main, prefix: str = "bertzoo"):
    for name, command in group.commands.items():
        yield f"{prefix} {name}", command
        if isinstance(command, click.Group):
            yield from commands(command, f"{prefix} {name}")


def test_every_option_of_every_command_has_help_text():
    missing = [f"{path} {'/'.join(param.opts)}" for path, command in [("bertzoo", main), *commands()]
               for param in command.params if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert not missing, f"options without help: {missing}"


@pytest.mark.parametrize("group", [[], ["zoo"]])
def test_command_summaries_are_whole_sentences(group):
    shown = CliRunner().invoke(main, [*group, "--help"], terminal_width=80).output
    listed = shown.split("Commands:\n", 1)[1].splitlines()
    assert listed and not [line for line in listed if line.rstrip().endswith("...")], shown
    for path, command in commands():
        summary = command.get_short_help_str(limit=45)  # click's own default width
        assert summary.endswith(".") and not summary.endswith("..."), f"{path}: {summary!r}"


class Called(Exception):
    """Raised by the stand-ins below once they have seen what the command passed them."""


def test_client_takes_auth_token_as_serve_spells_it_and_token_as_a_hidden_alias(monkeypatch):
    from bertzoo.serving import client

    seen: list[str | None] = []

    def fake_client(**kwargs):
        seen.append(kwargs["token"])
        raise Called

    monkeypatch.setattr(client, "BertzooClient", fake_client)
    for flag in ("--auth-token", "--token"):
        result = CliRunner().invoke(main, ["client", "info", flag, "s3cret"])
        assert isinstance(result.exception, Called), result.output
    assert seen == ["s3cret", "s3cret"]
    both = CliRunner().invoke(main, ["client", "info", "--auth-token", "a", "--token", "b"])
    assert both.exit_code == 2 and "--token is the old name of --auth-token" in both.output
    shown = CliRunner().invoke(main, ["client", "--help"]).output
    assert "--auth-token" in shown and "--token " not in shown


def test_bench_serve_reads_a_file_of_inputs_from_input_and_data_as_a_hidden_alias(monkeypatch, samples):
    from bertzoo.serving import load

    seen: list[str | None] = []

    def fake_load_items(task, path):
        seen.append(path)
        raise Called

    monkeypatch.setattr(load, "load_items", fake_load_items)
    dev = str(samples / "ids-sst-dev.csv")
    for flag in ("--input", "--data"):
        result = CliRunner().invoke(main, ["bench-serve", flag, dev])
        assert isinstance(result.exception, Called), result.output
    assert seen == [dev, dev]
    shown = CliRunner().invoke(main, ["bench-serve", "--help"]).output
    assert "--input" in shown and "--data" not in shown


def test_train_helps_state_the_training_configs_defaults():
    """train's options default to None (a preset or a resumed run's config fills them), so their help states
    TrainConfig's default in words: it must stay the dataclass's."""
    import re
    from dataclasses import fields

    from bertzoo.trainer.config import TrainConfig

    defaults = {f.name: f.default for f in fields(TrainConfig)}
    checked = 0
    for param in main.commands["train"].params:
        stated = re.search(r"\[default: ([^;\]]+)", param.help or "")
        if not stated or param.name not in defaults or param.name == "batch_tokens_tasks":  # "all" means ()
            continue
        value, default = stated.group(1).strip(), defaults[param.name]
        if isinstance(default, tuple):
            assert value == ",".join(default), param.name
        elif isinstance(default, (int, float)) and not isinstance(default, bool):
            assert float(value) == default, param.name
        else:
            assert value == str(default), param.name
        checked += 1
    assert checked >= 15
