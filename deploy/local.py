"""The compose bundle's topology on this machine, without containers: N `bertzoo serve` replicas on loopback, nginx
running deploy/compose/nginx.conf (its upstream servers and listen address pointed at them), and Prometheus with
deploy/prometheus/rules.yml scraping every replica each second. The integration test, the balancer benchmark and
anyone without a container runtime use it (nginx and prometheus from the system: `apt-get install nginx prometheus`).

    python deploy/local.py ARTIFACT [--replicas 2]    # runs until Ctrl-C, printing the addresses
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
NGINX_CONF = DEPLOY / "compose" / "nginx.conf"
RULES = DEPLOY / "prometheus" / "rules.yml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_nginx_conf(upstreams: list[str], listen: str, workdir: Path, http_upstreams: list[str] | None = None,
                      http_listen: str | None = None, source: Path = NGINX_CONF) -> str:
    """The shipped nginx.conf with its upstream servers and listen addresses (gRPC's, and HTTP's where given; else
    HTTP's server is left out) and scratch paths replaced; nothing else."""
    text = source.read_text()

    def servers(addresses: list[str]) -> str:
        return "".join(f"        server {address} max_fails=1 fail_timeout=5s;\n" for address in addresses)

    text, n = re.subn(r"^ *server bertzoo:50051[^\n]*\n", servers(upstreams), text, flags=re.M)
    text, m = re.subn(r"listen 50051 http2;", f"listen {listen} http2;", text)
    if http_listen is None:  # only the gRPC server: HTTP's upstream and server block out
        text, k = re.subn(r"\n    upstream bertzoo_http \{.*?\n    \}\n", "\n", text, flags=re.S)
        text, j = re.subn(r"\n    server \{\n        listen 8000;.*?\n    \}\n", "\n", text, flags=re.S)
    else:
        text, k = re.subn(r"^ *server bertzoo:8000[^\n]*\n", servers(http_upstreams or []), text, flags=re.M)
        text, j = re.subn(r"listen 8000;", f"listen {http_listen};", text)
    if (n, m, k, j) != (1, 1, 1, 1):
        raise ValueError(f"{source}: expected one 'server bertzoo:50051', one 'listen 50051 http2', one "
                         "'server bertzoo:8000' and one 'listen 8000'")
    return text.replace("/tmp/", f"{workdir}/")


def prometheus_config(metrics_targets: list[str], rules: Path = RULES, scrape_interval: str = "1s") -> str:
    """The compose bundle's Prometheus config with static targets in place of DNS discovery (JSON is YAML)."""
    return json.dumps({
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "bertzoo", "static_configs": [{"targets": metrics_targets}]}],
    }, indent=1)


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout:.0f} s")
        time.sleep(0.2)


class LocalStack:
    """Replicas, nginx and (where installed) Prometheus, started by :meth:`start` and stopped by :meth:`stop`."""

    def __init__(self, artifact: str | Path, workdir: str | Path, replicas: int = 2, serve_args: tuple[str, ...] = (),
                 prometheus: bool = True) -> None:
        self.artifact, self.workdir, self.replicas = str(artifact), Path(workdir), replicas
        self.serve_args, self.want_prometheus = serve_args, prometheus
        self.ports = [free_port() for _ in range(replicas)]
        self.metrics_ports = [free_port() for _ in range(replicas)]
        self.http_ports = [free_port() for _ in range(replicas)]
        self.nginx_port, self.nginx_http_port, self.prometheus_port = free_port(), free_port(), free_port()
        self.servers: list[subprocess.Popen] = []
        self.nginx: subprocess.Popen | None = None
        self.prometheus: subprocess.Popen | None = None
        self._logs: list = []

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.nginx_port}"

    @property
    def http_target(self) -> str:
        """nginx's HTTP/1.1 address, in front of every replica's HTTP routes."""
        return f"127.0.0.1:{self.nginx_http_port}"

    def replica_target(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    def _log(self, name: str):
        log = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115  (the process writes it; closed in stop())
        self._logs.append(log)
        return log

    def start(self) -> LocalStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for i, (port, metrics_port) in enumerate(zip(self.ports, self.metrics_ports, strict=True)):
            command = [sys.executable, "-m", "bertzoo", "serve", self.artifact, "--host", "127.0.0.1", "--port",
                       str(port), "--metrics-port", str(metrics_port), "--http-port", str(self.http_ports[i]),
                       *self.serve_args]
            self.servers.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self._log(f"replica{i}")))
        for i in range(self.replicas):
            wait_until(lambda i=i: self._serving(i), 180, f"replica {i} not SERVING")
        conf = self.workdir / "nginx.conf"
        conf.write_text(render_nginx_conf([self.replica_target(i) for i in range(self.replicas)],
                                          f"127.0.0.1:{self.nginx_port}", self.workdir,
                                          [f"127.0.0.1:{port}" for port in self.http_ports],
                                          f"127.0.0.1:{self.nginx_http_port}"))
        self.nginx = subprocess.Popen(["nginx", "-p", str(self.workdir), "-c", str(conf), "-g", "daemon off;"],
                                      stdout=subprocess.DEVNULL, stderr=self._log("nginx"))
        wait_until(lambda: _listening(self.nginx_port) and _listening(self.nginx_http_port), 30, "nginx not listening")
        if self.want_prometheus:
            config = self.workdir / "prometheus.yml"
            config.write_text(prometheus_config([f"127.0.0.1:{p}" for p in self.metrics_ports]))
            self.prometheus = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.prometheus_port}"],
                stdout=subprocess.DEVNULL, stderr=self._log("prometheus"))
            wait_until(self._prometheus_scrapes_all, 60, "Prometheus did not scrape every replica")
        return self

    def _serving(self, i: int) -> bool:
        from bertzoo.serving.client import BertzooClient

        if self.servers[i].poll() is not None:
            raise RuntimeError(f"replica {i} exited; see {self.workdir}/replica{i}.log")
        try:
            with BertzooClient(self.replica_target(i)) as client:
                return client.health(timeout=1) == "SERVING"
        except Exception:  # not listening yet
            return False

    def _prometheus_scrapes_all(self) -> bool:
        try:
            return sum(r["value"][1] == "1" for r in self.query('up{job="bertzoo"}')) == self.replicas
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        """An instant query through Prometheus' HTTP API; its result vector."""
        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.load(reply)
        if body["status"] != "success":
            raise RuntimeError(f"Prometheus query {expr!r} failed: {body}")
        return body["data"]["result"]

    def stop_replica(self, i: int) -> None:
        """SIGTERM: the replica drains (health NOT_SERVING, accepted calls finish) and exits."""
        self.servers[i].send_signal(signal.SIGTERM)

    def stop(self) -> None:
        for process in [*self.servers, self.nginx, self.prometheus]:
            if process is not None and process.poll() is None:
                process.terminate()
        for process in [*self.servers, self.nginx, self.prometheus]:
            if process is not None:
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
        for log in self._logs:
            log.close()

    def __enter__(self) -> LocalStack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def missing_tools(prometheus: bool = True) -> list[str]:
    """The system programs this needs and lacks."""
    return [tool for tool in ("nginx", *(("prometheus",) if prometheus else ())) if shutil.which(tool) is None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    if missing := missing_tools():
        sys.exit(f"needs {' and '.join(missing)} on PATH: apt-get install nginx prometheus")
    with tempfile.TemporaryDirectory(prefix="bertzoo-local-") as workdir, \
            LocalStack(args.artifact, workdir, args.replicas) as stack:
        print(f"gRPC through nginx: {stack.target}; replicas: "
              f"{', '.join(stack.replica_target(i) for i in range(stack.replicas))}; "
              f"Prometheus: http://127.0.0.1:{stack.prometheus_port}; logs in {workdir}. Ctrl-C stops.", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
