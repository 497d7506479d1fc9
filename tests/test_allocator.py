"""Training's allocator choice: which library ``bertzoo train`` restarts with, and the restart itself."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from bertzoo import allocator
from bertzoo.cli import main


@pytest.fixture
def lib_dir(tmp_path):
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    return tmp_path


def test_auto_picks_an_installed_tcmalloc_and_system_or_a_preloaded_one_keeps_the_process(lib_dir, tmp_path):
    found = lib_dir / "libtcmalloc_minimal.so.4"
    assert allocator.library_to_preload("auto", {}, (str(lib_dir),)) == found
    assert allocator.library_to_preload("tcmalloc", {}, (str(lib_dir),)) == found
    assert allocator.library_to_preload("system", {}, (str(lib_dir),)) is None
    assert allocator.library_to_preload("auto", {"LD_PRELOAD": f"/x/libfoo.so {found}"}, (str(lib_dir),)) is None
    assert allocator.library_to_preload("auto", {}, (str(tmp_path / "empty"),)) is None  # nothing installed


def test_asking_for_tcmalloc_where_it_is_missing_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(allocator, "SEARCH_DIRS", (str(tmp_path),))
    result = CliRunner().invoke(main, ["train", "--allocator", "tcmalloc", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--allocator tcmalloc" in result.output and "apt install libtcmalloc-minimal4" in result.output
    with pytest.raises(ValueError, match="allocator must be one of"):
        allocator.library_to_preload("jemalloc", {})


def test_only_the_bertzoo_command_restarts_itself_not_a_host_calling_the_cli():
    assert allocator.started_as_bertzoo(["/venv/bin/bertzoo", "train"])
    assert allocator.started_as_bertzoo(["/venv/lib/python3.11/site-packages/bertzoo/__main__.py", "train"])
    assert not allocator.started_as_bertzoo(["/venv/bin/pytest", "-q"])
    assert not allocator.started_as_bertzoo([])


@pytest.mark.skipif(allocator.find_tcmalloc() is None, reason="tcmalloc is not installed on this machine")
def test_the_restarted_process_runs_with_tcmalloc_mapped():
    script = ("from bertzoo import allocator; allocator.restart_with(allocator.find_tcmalloc(), ['-c', "
              "'import os; from bertzoo import allocator; print(allocator.describe()); "
              "print(\"tcmalloc\" in open(\"/proc/self/maps\").read())'])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].startswith("tcmalloc (") and out[1] == "True"
    assert allocator.describe({}) == "the C library's malloc"
