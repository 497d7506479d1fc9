"""The check that makes CI fail on a skip nobody expected (tests/conftest.py, tests/expected_skips.txt), run on a
one-test file in a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).parent / "data" / "skip_probe.py"


def run_probe(reason: str, ci: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["SKIP_PROBE_REASON"] = reason
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PROBE)], env=env,
                          cwd=PROBE.parents[2], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("reason", "ci", "fails"), [
    ("onnxruntime has no CUDAExecutionProvider on this machine", True, False),  # on the list
    ("nginx is not installed", True, True),  # a tool that failed to install
    ("nginx is not installed", False, False),  # outside CI a developer may lack it
])
def test_ci_fails_on_a_skip_not_on_the_list(reason, ci, fails):
    result = run_probe(reason, ci)
    assert "1 skipped" in result.stdout
    assert result.returncode == (1 if fails else 0), result.stdout
    assert ("unexpected skip reasons" in result.stdout and reason in result.stdout) == fails
