"""benchmarks/common/processes.py: a server's CPU (cpu_seconds) counts the processes it runs, as Triton runs its model
instances and `bertzoo serve --frontends N` its front ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import processes


def test_the_servers_cpu_includes_its_child_processes():
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
