"""Atomic writes: a finished block replaces the target whole, a failed one leaves it untouched and no debris."""

from __future__ import annotations

import os
import stat

import pytest

from bertzoo.atomic import atomic_directory, atomic_open, atomic_write_text


def test_a_directory_replaces_the_old_one_whole(tmp_path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "stale.txt").write_text("old")
    with atomic_directory(final) as work:
        assert work.parent == tmp_path and not final.joinpath("new.txt").exists()
        (work / "new.txt").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary or set-aside directory left


def test_a_failed_block_leaves_the_target_untouched(tmp_path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "kept.txt").write_text("old")
    with pytest.raises(RuntimeError, match="half-way"), atomic_directory(final) as work:
        (work / "partial.txt").write_text("half")
        raise RuntimeError("failed half-way")
    assert (final / "kept.txt").read_text() == "old" and not (final / "partial.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_shareable_output_gets_umask_permissions(tmp_path) -> None:
    umask = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "shared", shareable=True) as work:
            (work / "f").write_text("x")
            (work / "sub").mkdir(mode=0o700)
            (work / "sub" / "g").write_text("y")
            (work / "sub" / "g").chmod(0o600)
        atomic_write_text(tmp_path / "pointer", "checkpoint-000001")
        with atomic_directory(tmp_path / "private") as work:
            (work / "f").write_text("x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "shared" / "f").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "shared" / "sub").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "shared" / "sub" / "g").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "pointer").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o700  # mkdtemp's owner-only default


def test_text_is_replaced_in_one_step(tmp_path) -> None:
    path = tmp_path / "LATEST"
    path.write_text("checkpoint-000001")
    atomic_write_text(path, "checkpoint-000002")
    assert path.read_text() == "checkpoint-000002" and [p.name for p in tmp_path.iterdir()] == ["LATEST"]


def test_a_file_written_as_it_comes_appears_whole_or_not_at_all(tmp_path) -> None:
    target = tmp_path / "answers.jsonl"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="stream broke"), atomic_open(target) as f:
        f.write("line 1\n")
        raise RuntimeError("stream broke")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["answers.jsonl"]
    with atomic_open(target) as f:
        f.write("line 1\n")
        assert target.read_text() == "old\n"  # not yet
        f.write("line 2\n")
    assert target.read_text() == "line 1\nline 2\n" and [p.name for p in tmp_path.iterdir()] == ["answers.jsonl"]
