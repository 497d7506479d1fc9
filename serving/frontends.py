"""``bertzoo serve --frontends N`` with N > 1 (or ``--engines M`` with M > 1): N front-end processes in front of one
engine process (or M replicas of it), and this parent process, which starts them, holds the ports (gRPC's and
HTTP's), serves ``/metrics`` and stops them in order.

::

    clients ──gRPC, HTTP──> front end 1 ─┐   (gRPC, HTTP, validation, limits, tokenization, post-processing, metrics)
            ──gRPC, HTTP──> front end 2 ─┼─ZeroMQ hops─> engine process 1..M (batchers, lanes, engine instances)
            ──gRPC, HTTP──> front end N ─┘                    │
    Prometheus ──> parent's /metrics <── every process's series (prometheus_client multiprocess mode)

With M replicas every front end links to each, and sends each request to the one with the fewest requests
outstanding from that front end (``engine_link.SpreadLane``).

Why processes: one Python event loop tops out far below a GPU's engine (benchmarks/RESULTS.md, "Serving on GPU"), and
gRPC's and our per-request Python cannot use a second core from one process. Why one engine process: a batch is
only as full as the queue it is cut from, and one device wants one owner. Why ZeroMQ: the hand-offs are a few KB
batched per event-loop turn; a socket pair per front end gives ordering, framing, reconnects and a disconnect event
for free, at a copy cost far below tokenization's, with nothing to clean up but a socket file in our run directory
(shared memory would add segment lifetimes to manage for no measurable gain at these sizes).

The front ends share the port with SO_REUSEPORT (the kernel spreads new connections over them), which only our own
processes use: this parent holds the port first (serving/ports.py), so a foreign server on it still fails the start.

Life: the engine loads while the front ends listen NOT_SERVING; each turns SERVING when the engine answers its hello,
which it does once every bucket is warmed. SIGTERM or SIGINT: the front ends stop taking calls and finish those
accepted (the one-process drain), then the engine stops, then this process exits 0. A front end that dies is
started again (its calls in flight fail UNAVAILABLE: their connections break; our client retries them); more than
``MAX_RESTARTS`` within a minute stops the server. An engine (any replica) that dies takes every front end
NOT_SERVING, and the server exits 1 so its orchestrator starts it again. A run directory (the engines' sockets, the
metrics files) lives in the system's temporary directory and is removed on every exit but SIGKILL of this process;
children of a killed parent stop too (engines at their control pipe's end, front ends by PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import time
from collections import deque
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from .child_process import child_process_setup
from .config import ServeConfig

log = logging.getLogger("bertzoo.serving")

MAX_RESTARTS = 5  # front-end restarts within RESTART_WINDOW seconds before the server gives up
RESTART_WINDOW = 60.0


def frontend_main(config: ServeConfig, addresses: list[str], log_levels: dict[str, int], index: int) -> None:
    """A front end's entry point (multiprocessing, spawn): a gRPC server on the shared port whose lanes are its links
    to the engine replicas. SIGINT is the parent's to handle (a terminal sends it to the whole group)."""
    import asyncio

    from .engine_link import EngineLink, open_replicas
    from .event_loop import run_on_best_loop
    from .grpc_server import BertzooServer, serve

    child_process_setup(log_levels, f"bertzoo-fe-{index + 1}", parent_death=signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> None:
        server: BertzooServer | None = None

        def engine_lost() -> None:
            if server is not None:
                asyncio.get_running_loop().create_task(server.not_serving())

        links = [EngineLink(address, config, on_engine_lost=engine_lost) for address in addresses]
        server = BertzooServer(config, open_lanes=lambda: open_replicas(links), share_port=True)
        await serve(config, server=server, stop_signals=(signal.SIGTERM,))

    run_on_best_loop(main)


class Supervisor:
    """The parent: starts the engines and the front ends, restarts front ends, stops everything in order."""

    def __init__(self, config: ServeConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = run_dir
        self.addresses = [f"ipc://{run_dir / f'engine-{k + 1}.sock'}" for k in range(config.engines)]
        self._context = multiprocessing.get_context("spawn")
        self._levels = {"": logging.getLogger().level, "bertzoo": logging.getLogger("bertzoo").getEffectiveLevel()}
        self._frontend_config: ServeConfig | None = None
        self.engines: list[BaseProcess] = []
        self.frontends: dict[int, BaseProcess] = {}
        self._controls: list = []
        self._restarts: deque[float] = deque()

    def pids(self) -> list[int]:
        processes = [*self.engines, *self.frontends.values()]
        return [p.pid for p in processes if p.pid is not None and p.is_alive()]

    def start(self, port: int, http_port: int = 0) -> None:
        from .engine_process import engine_main

        for k, address in enumerate(self.addresses):
            reader, control = self._context.Pipe(duplex=False)
            name = "bertzoo-engine" if len(self.addresses) == 1 else f"bertzoo-engine-{k + 1}"
            engine = self._context.Process(target=engine_main, name=name,
                                           args=(self.config, address, reader, self._levels, name))
            engine.start()
            reader.close()
            self.engines.append(engine)
            self._controls.append(control)
        # The front ends bind the ports this process holds; their metrics go through this process's endpoint.
        self._frontend_config = dataclasses.replace(self.config, port=port, http_port=http_port, metrics_port=0)
        for index in range(self.config.frontends):
            self._start_frontend(index)

    def _start_frontend(self, index: int) -> None:
        process = self._context.Process(target=frontend_main, name=f"bertzoo-frontend-{index + 1}",
                                        args=(self._frontend_config, self.addresses, self._levels, index))
        process.start()
        self.frontends[index] = process

    def watch(self, wake: socket.socket) -> int:
        """Until ``wake`` is readable (a stop signal) or an engine dies: restart front ends that die. Returns the
        exit code the server should end with."""
        from prometheus_client import multiprocess

        while True:
            engines = {engine.sentinel: engine for engine in self.engines}
            sentinels = {p.sentinel: i for i, p in self.frontends.items()}
            ready = wait([wake, *engines, *sentinels])
            if wake in ready:
                return 0
            for dead_engine in (engines[s] for s in ready if s in engines):
                dead_engine.join()  # its exit code
                log.error("the engine process%s exited (code %s): stopping the front ends; exit 1 so the server is "
                          "started again", "" if len(self.engines) == 1 else f" {dead_engine.name}",
                          dead_engine.exitcode)
                return 1
            for sentinel in ready:
                index = sentinels[sentinel]
                dead = self.frontends[index]
                dead.join()  # reaped: no zombie left behind
                multiprocess.mark_process_dead(dead.pid)
                now = time.monotonic()
                while self._restarts and now - self._restarts[0] > RESTART_WINDOW:
                    self._restarts.popleft()
                if len(self._restarts) >= MAX_RESTARTS:
                    log.error("front end %d exited (code %s), the %dth restart within %.0f s: giving up", index + 1,
                              dead.exitcode, MAX_RESTARTS + 1, RESTART_WINDOW)
                    return 1
                self._restarts.append(now)
                log.warning("front end %d exited (code %s): starting it again", index + 1, dead.exitcode)
                self._start_frontend(index)

    def stop(self) -> None:
        """Front ends first (each finishes its accepted calls within the shutdown grace), then the engine."""
        for process in self.frontends.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.shutdown_grace + 10.0
        for process in self.frontends.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("front end %s did not stop in time: killed", process.name)
                process.kill()
                process.join()
        for control in self._controls:
            control.close()  # the engines' word to stop
        deadline = time.monotonic() + 30.0
        for engine in self.engines:
            engine.join(max(0.0, deadline - time.monotonic()))
            if engine.is_alive():
                log.warning("%s did not stop in time: killed", engine.name)
                engine.kill()
                engine.join()


def run_with_frontends(config: ServeConfig) -> int:
    """Serve with ``config.frontends`` front-end processes until SIGTERM or SIGINT; returns the exit code."""
    from .metrics import merged_registry, serve_metrics
    from .ports import hold_port

    log.info("effective config: %s", json.dumps(config.for_log(), sort_keys=True))
    with tempfile.TemporaryDirectory(prefix="bertzoo-serve-") as run_dir:
        metrics_dir = Path(run_dir) / "metrics"
        metrics_dir.mkdir()
        # Read by prometheus_client in each child at import: their series go to files the parent's endpoint merges.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        holder, port = hold_port(config.host, config.port, "--port")
        http_holder, http_port = hold_port(config.host, config.http_port, "--http-port") if config.http_port else (None, 0)
        supervisor = Supervisor(config, Path(run_dir))
        wake_reader, wake_writer = socket.socketpair()
        previous = {sig: signal.signal(sig, lambda *_: wake_writer.send(b"x")) for sig in (signal.SIGTERM,
                                                                                             signal.SIGINT)}
        http = None
        code = 1
        try:
            if config.metrics_port:
                http = serve_metrics(merged_registry(str(metrics_dir), supervisor.pids), config.metrics_host,
                                     config.metrics_port)
            supervisor.start(port, http_port)
            log.info("%d front end%s on gRPC port %d (HTTP/2)%s, engine process%s %s, run directory %s",
                     config.frontends, "" if config.frontends == 1 else "s", port,
                     f" and HTTP port {http_port} (HTTP/1.1)" if http_port else "",
                     "" if config.engines == 1 else "es", ", ".join(str(e.pid) for e in supervisor.engines), run_dir)
            code = supervisor.watch(wake_reader)
            if code == 0:
                log.info("stop signal: front ends refuse new calls and finish accepted ones (up to %.0f s)",
                         config.shutdown_grace)
        finally:
            supervisor.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            wake_reader.close()
            wake_writer.close()
            if http is not None:
                http.shutdown()
                http.server_close()
            holder.close()
            if http_holder is not None:
                http_holder.close()
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        log.info("stopped")
        return code
