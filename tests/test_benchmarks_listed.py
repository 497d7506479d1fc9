"""benchmarks/README.md's table is the maintained set: every script in benchmarks/ is in it with one command, the
command names a script that exists, each imports as part of the package `benchmarks`, and the set stays small."""

from __future__ import annotations

import ast
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


def test_scripts_import_each_other_through_the_package():
    """A bare `import gpu_check` (how the scripts found their neighbours when run by path) fails under
    `python -m benchmarks.NAME`, and only when that branch runs: every import, lazy ones included, names the package."""
    neighbours = scripts() | {p.stem for p in (FOLDER / "common").glob("*.py")}
    bare = []
    for path in sorted([*FOLDER.glob("*.py"), *(FOLDER / "common").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bare += [f"{path.name}:{node.lineno} {name}" for name in names if name and name.split(".")[0] in neighbours]
    assert not bare, bare
