"""One command-line convention: every option has an environment variable, `--version`, and `python -m bertzoo`
runs every sub-command, from any folder (the repository root included)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from click.testing import CliRunner

from bertzoo.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("bertzoo, version ")


def test_every_option_reads_its_environment_variable():
    # A bad value from the environment is reported under the option's name, before any work starts.
    result = CliRunner().invoke(main, ["train"], env={"BERTZOO_TRAIN_MAX_STEPS": "many"})
    assert result.exit_code == 2 and "'--max-steps': 'many' is not a valid integer" in result.output


def test_python_dash_m_runs_every_sub_command():
    # From the repository root, where `python -m` puts the cwd first on sys.path: no folder there is named bertzoo.
    result = subprocess.run([sys.executable, "-m", "bertzoo", "zoo", "list"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "baseline" in result.stdout and "ssaf" in result.stdout


def test_the_repository_root_imports_the_installed_package():
    # The core's source folder is core/, so nothing in the checkout's root shadows the installed bertzoo (whose
    # bertzoo.serving carries the gRPC stubs generated at install time).
    code = "import bertzoo.serving.proto, bertzoo.trainer.model, bertzoo.export.gates"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("answer", "message"), [("SentimentResult", "SentimentResult"),
                                                 ("ParaphraseResult", "ParaphraseResult"),
                                                 ("SimilarityResult", "SimilarityResult"), ("SpanPrediction", "QAResult")])
def test_predict_and_the_rpcs_share_one_answer_schema(answer, message):
    # `bertzoo predict --json` prints these dataclasses and the server builds its result messages from them.
    from bertzoo import qa, tasks
    from bertzoo.serving.proto import pb2

    names = [f.name for f in fields(getattr(tasks, answer, None) or getattr(qa, answer))]
    assert names == [f.name for f in getattr(pb2, message).DESCRIPTOR.fields]
