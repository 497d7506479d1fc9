"""A real `bertzoo serve` in a subprocess, as users run it, for the tests of its processes: the server, its children
by name, its metrics and its output."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from bertzoo.serving.client import BertzooClient
from conftest import free_port


class ServerProcess:
    """``bertzoo serve ARTIFACT --frontends N FLAGS...`` in a subprocess, on free ports, its output collected."""

    def __init__(self, artifact: Path, *flags: str, frontends: int = 2) -> None:
        self.port, self.metrics_port, self.http_port = free_port(), free_port(), free_port()
        command = [sys.executable, "-m", "bertzoo.cli", "serve", str(artifact), "--host", "127.0.0.1", "--port",
                   str(self.port), "--metrics-port", str(self.metrics_port), "--http-port", str(self.http_port),
                   "--threads", "1", "--no-ort-spinning",
                   "--backend", "onnxruntime", "--frontends", str(frontends), *flags]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.output = ""

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ready(self, **client_options) -> None:
        with BertzooClient(self.target, **client_options) as client:
            client.wait_ready(timeout=60)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            return response.read().decode()

    def children(self, name: str = "bertzoo-") -> list[int]:
        """The pids of the server's child processes whose name starts with ``name`` (bertzoo-engine, bertzoo-fe-N;
        not multiprocessing's resource tracker)."""
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        pids = [int(pid) for pid in path.read_text().split()] if path.exists() else []
        return [pid for pid in pids if process_name(pid).startswith(name)]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.stdout is None or self.process.stdout.closed:  # stopped before
            return self.process.returncode
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.output = self.process.communicate()[0]
        return code

    def run_dir(self) -> Path:
        return Path(re.search(r"run directory (\S+)", self.output).group(1))

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one series in Prometheus text (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            got = series[len(name):].strip("{}")
            if series.split("{")[0] == name and ",".join(sorted(got.split(","))) == wanted:
                return float(value)
    return 0.0


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
