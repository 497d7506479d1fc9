"""benchmarks/serve_triton.py's ratios within a round, and a server's CPU (processes.cpu_seconds) counting the
processes it runs, as Triton runs its model instances."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def serve_triton():
    return load_benchmark("serve_triton")


def test_ratios_pair_each_round_with_itself(serve_triton):
    rounds = [{"int8": {"ceiling": 800, "bertzoo": {"items_per_s": 560}, "triton": {"items_per_s": 480}}},
              {"int8": {"ceiling": 600, "bertzoo": {"items_per_s": 480}, "triton": {"items_per_s": 480}}}]
    values = serve_triton.ratios(rounds, ["int8"])
    assert values["int8 bertzoo of ceiling"] == pytest.approx([0.7, 0.8])
    assert values["int8 triton of ceiling"] == pytest.approx([0.6, 0.8])
    assert values["int8 triton / bertzoo"] == pytest.approx([480 / 560, 1.0])


def test_the_servers_cpu_includes_its_child_processes():
    processes = load_benchmark("processes")
    # Triton runs each Python-backend model instance as a child process; its work is the server's.
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               "'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.65: pass\\n"
                               "print(1, flush=True)\\ntime.sleep(30)'])"], stdout=subprocess.PIPE, text=True)
    try:
        # the grandchild has burnt 0.65 s of CPU; /proc counts it in clock ticks (0.01 s), so at least 0.6 shows
        assert parent.stdout.readline().strip() == "1"
        assert processes.cpu_seconds(parent.pid) >= 0.6
        assert processes.stat_cpu_seconds(Path(f"/proc/{parent.pid}/stat")) < 0.5  # the parent alone only waited
    finally:
        for child in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split():
            os.kill(int(child), 9)
        parent.kill()
        parent.wait()
