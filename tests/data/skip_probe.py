"""Run by tests/test_ci_skip_check.py in a pytest of its own (not collected by the suite: its name is no test_*.py):
one test that skips with the reason in $SKIP_PROBE_REASON."""

import os

import pytest


def test_skips():
    pytest.skip(os.environ["SKIP_PROBE_REASON"])
