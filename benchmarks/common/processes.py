"""Server processes for the benchmarks: start one and wait until it answers, read what it costs from /proc, stop it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], ready: Callable[[], bool], timeout: float = 300.0,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """Run ``command`` and return once ``ready()`` is true (it is polled; an exception counts as not yet)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=None if env is None else {**os.environ, **env})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(command[:4])} exited: {process.stderr.read()[-2000:]}")
        try:
            if ready():
                return process
        except Exception:  # noqa: BLE001 (not up yet, whatever the client says)
            pass
        time.sleep(0.5)
    process.kill()
    raise TimeoutError(f"{' '.join(command[:4])} did not answer within {timeout:.0f} s")


def answers_sentiment(port: int) -> bool:
    """Whether a server on loopback ``port`` answers a Sentiment request (bertzoo's): a server that does is ready."""
    import grpc

    from bertzoo.serving.client import BertzooClient

    with BertzooClient(f"127.0.0.1:{port}") as client:
        try:
            client.sentiment(["ready?"], timeout=2)
            return True
        except grpc.RpcError:
            return False


def start_bertzoo(artifact: str, port: int, *flags: str, metrics_port: int | None = None,
                  launcher: list[str] | None = None) -> subprocess.Popen:
    """``bertzoo serve ARTIFACT`` on loopback ``port`` (metrics on ``metrics_port``, default a free port), ready once
    Sentiment answers. ``launcher``: the command that stands for ``bertzoo`` (default: this Python's)."""
    command = [*(launcher or [sys.executable, "-m", "bertzoo"]), "serve", artifact, "--host", "127.0.0.1",
               "--port", str(port), "--metrics-port", str(metrics_port or free_port()), "--http-port", "0", *flags]
    return start(command, lambda: answers_sentiment(port))


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def effective_config(process: subprocess.Popen) -> dict | None:
    """The settings a stopped ``bertzoo serve`` ran with, every ``auto`` resolved (its ``effective config:`` log line,
    read from the stderr that :func:`start` keeps); None where it logged none."""
    if process.stderr is None:
        return None
    for line in process.stderr.read().splitlines():
        if "effective config: " in line:
            return json.loads(line.split("effective config: ", 1)[1].split("; event loop:")[0])
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads, and of its live child processes, which are the
    server's too (Triton runs each Python-backend model instance as one). A child that exits meanwhile is left out."""
    total = stat_cpu_seconds(Path(f"/proc/{pid}/stat"))
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = task / "children"  # needs CONFIG_PROC_CHILDREN; without it, the process alone
        for child in (children.read_text().split() if children.exists() else []):
            try:
                total += cpu_seconds(int(child))
            except FileNotFoundError:
                pass
    return total


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds from a /proc stat file (a process's, or one thread's: /proc/PID/task/TID/stat)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of process ``pid``: its id -> (its name, user + system CPU seconds). The main thread's id is
    ``pid``; threads that Python starts carry the process's name, native ones (gRPC's, an engine's) often their own."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            threads[int(task.name)] = ((task / "comm").read_text().strip(), stat_cpu_seconds(task / "stat"))
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return threads


def memory_mb(pid: int) -> dict[str, float]:
    """Resident memory now (VmRSS) and at its peak (VmHWM), MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return {key: int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024 for key in ("VmRSS", "VmHWM")}


def connections(pid: int, port: int) -> int:
    """Established TCP connections that process ``pid`` holds on local ``port`` (its sockets, read from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port, state, inode = int(fields[1].rsplit(":", 1)[1], 16), fields[3], fields[9]
            count += local_port == port and state == "01" and inode in inodes  # 01: ESTABLISHED
    return count


def scrape_metrics(port: int) -> dict[str, float]:
    """A server's Prometheus metrics as {"name{labels}": value} (sums and counts of the histograms included)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


def series_sum(values: dict[str, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s series (from :func:`scrape_metrics`) whose labels include ``labels``: e.g. a task's
    request latency over both protocols, or the batches of both lanes."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    total = 0.0
    for key, value in values.items():
        series, _, rest = key.partition("{")
        if series == name and wanted <= set(rest.rstrip("}").split(",")):
            total += value
    return total


@contextlib.contextmanager
def steady_calls(target: str, clients: int) -> Iterator[None]:
    """``clients`` clients, each on a connection of its own (as many client processes would have: channels of one
    process share one connection by default), calling Sentiment back to back until the block ends; a failed call
    (its front end killed under it) is followed by the next."""
    import grpc

    from bertzoo.serving.client import BertzooClient, channel_options

    own = [*channel_options(), ("grpc.use_local_subchannel_pool", 1)]
    opened = [BertzooClient(target, options=own) for _ in range(clients)]
    stop = threading.Event()

    def call(client: BertzooClient) -> None:
        while not stop.is_set():
            try:
                client.sentiment(["a steady stream of calls"])
            except grpc.RpcError:
                time.sleep(0.05)

    threads = [threading.Thread(target=call, args=(c,), daemon=True) for c in opened]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        for client in opened:
            client.close()


class HealthWatchers:
    """``n`` Health.Watch streams on channels of their own, each recording the statuses it was sent and how its
    stream ended ("OK" or the status code's name)."""

    def __init__(self, target: str, n: int = 3) -> None:
        import grpc

        self.channels = [grpc.insecure_channel(target) for _ in range(n)]
        self.seen: list[list] = [[] for _ in range(n)]
        self.threads = [threading.Thread(target=self._watch, args=(k,), daemon=True) for k in range(n)]
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 10
        while not all(self.seen) and time.monotonic() < deadline:  # each has been told SERVING
            time.sleep(0.05)

    def _watch(self, k: int) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self.channels[k])
        try:
            for response in stub.Watch(health_pb2.HealthCheckRequest()):
                self.seen[k].append(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
            self.seen[k].append("OK")
        except grpc.RpcError as e:
            self.seen[k].append(e.code().name)

    def close(self) -> list[list]:
        for thread in self.threads:
            thread.join(10)
        for channel in self.channels:
            channel.close()
        return self.seen
