"""benchmarks/common/profiling.py: py-spy's collapsed stacks summarized per thread role, and a real sampling of a busy
process (py-spy comes with the test extras)."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.common.profiling import finish_profile, py_spy, start_profile, summarize

COLLAPSED = """\
thread (100);run (asyncio/runners.py:118);_flush (serving/engine_process.py:160);send (zmq/sugar/socket.py:701) 6
thread (100);run (asyncio/runners.py:118);_take (serving/engine_process.py:97) 2
thread (100);run (asyncio/runners.py:120) 2
thread (101);_worker (concurrent/futures/thread.py:83);run_batch (serving/engine.py:121) 9
thread (102);_worker (concurrent/futures/thread.py:83);run_batch (serving/engine.py:130) 1
"""


def test_samples_split_by_thread_role_with_self_and_inclusive_shares():
    summary = summarize(COLLAPSED, main_thread=100)
    main, other = summary["main"], summary["other"]
    assert main["samples"] == 10 and other["samples"] == 10
    assert main["self"][0] == ["send (sugar/socket.py)", 0.6]
    assert dict(map(tuple, main["inclusive"]))["run (asyncio/runners.py)"] == 1.0  # every main sample is under run
    assert dict(map(tuple, main["inclusive"]))["_flush (serving/engine_process.py)"] == 0.6
    # one function whatever line of it was sampled, over both worker threads
    assert other["self"] == [["run_batch (serving/engine.py)", 1.0]]


def test_a_busy_process_is_sampled_in_its_busy_function_holding_the_gil(tmp_path):
    assert py_spy() is not None, "py-spy is in the test extras"
    busy = subprocess.Popen([sys.executable, "-c", "import time\ndef spin(t):\n    while time.time() < t: pass\n"
                             "spin(time.time() + 8)"])
    try:
        profiles = [start_profile(busy.pid, 1, tmp_path / f"busy{gil}.txt", gil=gil) for gil in (False, True)]
        summaries = [finish_profile(profile, busy.pid) for profile in profiles]
    finally:
        busy.kill()
        busy.wait()
    for summary in summaries:  # an error would be e.g. no permission to read another process (ptrace restricted)
        assert "error" not in summary, summary
        assert summary["main"]["samples"] > 50
        assert summary["main"]["self"][0][0] == "spin (<string>)"
    assert summaries[1]["main"]["gil_held_share"] > 0.5  # pure Python: it holds the GIL all the time it runs
