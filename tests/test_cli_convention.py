"""One command-line convention: every option has an environment variable, `--version`, and `python -m bertzoo`
runs every sub-command."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from bertzoo.cli import main


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("bertzoo, version ")


def test_every_option_reads_its_environment_variable():
    # A bad value from the environment is reported under the option's name, before any work starts.
    result = CliRunner().invoke(main, ["train"], env={"BERTZOO_TRAIN_MAX_STEPS": "many"})
    assert result.exit_code == 2 and "'--max-steps': 'many' is not a valid integer" in result.output


def test_python_dash_m_runs_every_sub_command(tmp_path):
    # From another folder: in the checkout, its bertzoo/ folder (the core alone) would shadow the installed package.
    result = subprocess.run([sys.executable, "-m", "bertzoo", "zoo", "list"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "baseline" in result.stdout and "ssaf" in result.stdout
