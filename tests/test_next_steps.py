"""What `bertzoo train` prints at its end runs as printed in the shell README command 1 leaves (.venv installed,
not activated), and the export and serve it suggests agree on the variant."""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner

from bertzoo.cli import main
from bertzoo.cli_next import SUGGESTED_VARIANT, bertzoo_command
from conftest import TINY_ENCODER

SCRIPTS = Path(sysconfig.get_path("scripts"))
# A 1-step sentiment run of the tiny encoder on 8 bundled samples.
TINY = ["--no-progress", "--no-eval", "--random-init", *[f"--encoder={k}={v}" for k, v in TINY_ENCODER.items()],
        "--limit-per-task", "8", "--batch-size", "4", "--tasks", "sentiment", "--max-steps", "1"]


def test_next_steps_run_as_printed_with_the_venv_not_activated(tmp_path, monkeypatch):
    """README command 1 installs into .venv without activating it: `bertzoo` is not on PATH there."""
    if not (SCRIPTS / "bertzoo").is_file():
        pytest.skip("bertzoo is not installed as a script")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != SCRIPTS.resolve())
    root = SCRIPTS.parent.parent  # the folder that holds the venv: where README's commands run
    monkeypatch.setenv("PATH", path)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.chdir(root)
    trained = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "run"), *TINY])
    assert trained.exit_code == 0, trained.output
    hints = trained.output.split("\nnext:\n", 1)[1].strip().splitlines()
    commands = [shlex.split(line) for line in hints]
    expected = bertzoo_command(root, path)
    assert expected != "bertzoo" and all(words[0] == expected for words in commands), hints
    predict, export, serve = commands
    assert export[1] == "export" and f"--{SUGGESTED_VARIANT}" in export
    # serve names the variant the export made, and serves the artifact the export wrote
    assert serve[1] == "serve" and serve[2] == export[export.index("--out") + 1]
    assert serve[serve.index("--variant") + 1] == SUGGESTED_VARIANT
    assert predict[1] == "predict"
    ran = subprocess.run(hints[0], shell=True, cwd=root, env={**os.environ, "PATH": path}, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "(p=" in ran.stdout


def test_bertzoo_command_is_bare_on_path_and_absolute_from_elsewhere(tmp_path):
    if not (SCRIPTS / "bertzoo").is_file():
        pytest.skip("bertzoo is not installed as a script")
    assert bertzoo_command(tmp_path, str(SCRIPTS)) == "bertzoo"  # activated, or its bin folder on PATH
    assert bertzoo_command(tmp_path, "") == shlex.quote(str(SCRIPTS / "bertzoo"))  # not below the cwd
    below = os.path.relpath(SCRIPTS / "bertzoo", SCRIPTS.parent.parent)
    assert bertzoo_command(SCRIPTS.parent.parent, "") == shlex.quote(below)
