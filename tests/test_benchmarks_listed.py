"""benchmarks/README.md's table is the maintained set: every script in benchmarks/ is in it with one command, the
command names a script that exists, each imports as part of the package `benchmarks`, and the set stays small."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parent.parent / "benchmarks"
MOST_SCRIPTS = 15


def listed() -> list[str]:
    """The module of each row's command, in the table's order."""
    return re.findall(r"^\|[^|]*\| `python -m benchmarks\.(\w+)", (FOLDER / "README.md").read_text(), re.M)


def scripts() -> set[str]:
    return {p.stem for p in FOLDER.glob("*.py") if p.stem != "__init__"}


def test_every_script_is_listed_once_and_every_row_names_a_script():
    rows = listed()
    assert len(rows) == len(set(rows)), rows
    assert set(rows) == scripts(), {"unlisted": scripts() - set(rows), "missing": set(rows) - scripts()}
    assert len(rows) <= MOST_SCRIPTS


@pytest.mark.parametrize("name", sorted(scripts()))
def test_each_script_imports_from_the_package(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"
