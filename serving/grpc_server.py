"""The gRPC transport and the server's life: listen (TLS or plaintext, optional bearer-token auth), serve
bertzoo.v1.Bertzoo with the standard health and reflection services, load and warm up the model, then drain on
SIGTERM.

Life of a server:

1. ``start``: bind the port and the metrics endpoint; health reports NOT_SERVING, task RPCs answer UNAVAILABLE.
2. ``load``: load the model (an artifact's file hashes are checked), run it once per length bucket, start the
   batcher; only then does health report SERVING.
3. ``stop`` (SIGTERM or SIGINT under :func:`serve`): health goes NOT_SERVING, new calls are refused, calls already
   accepted finish (up to ``shutdown_grace`` seconds), then the batcher, the worker threads and the metrics endpoint
   stop.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .config import ServeConfig
from .engine import EMBED
from .event_loop import run_on_best_loop
from .health_service import DrainingHealthServicer
from .http_server import HttpRoutes, HttpServer
from .interceptors import BearerTokenInterceptor, MalformedRequestInterceptor
from .lanes import Lanes, ModelLoader, open_local_lanes
from .metrics import Metrics
from .model import load_served_model, runtime_versions
from .ports import address, check_free
from .proto import SERVICE_NAME, pb2_grpc
from .servicer import BertzooServicer
from .tasks_service import TaskService

log = logging.getLogger("bertzoo.serving")

# How long a drained stream's client is given to read its status before the connections close (see
# BertzooServer._streams_told_to_stop): it reads at once unless its machine is starved of CPU.
STREAM_STATUS_READ_S = 0.25

# Opens the lanes a server's task service runs on (serving/lanes.py).
LaneOpener = Callable[[], Awaitable[Lanes]]
# Load balancers and orchestrators probe health without credentials.
OPEN_METHODS = (f"/{health.SERVICE_NAME}/Check", f"/{health.SERVICE_NAME}/Watch")
_TASK_METHODS = {"Sentiment": "sentiment", "Paraphrase": "paraphrase", "Similarity": "similarity", "QA": "qa",
                 "Embed": "embed"}
# The metrics' task label of each method name (a stream's requests count as its task's).
METHOD_TASKS = {**_TASK_METHODS, **{f"{m}Stream": t for m, t in _TASK_METHODS.items()}, "ModelInfo": "model_info",
                "Check": "health"}
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class BertzooServer:
    def __init__(self, config: ServeConfig, loader: ModelLoader = load_served_model,
                 metrics: Metrics | None = None, open_lanes: LaneOpener | None = None,
                 share_port: bool = False) -> None:
        """``loader`` builds the served model from the config (tests wrap the backend through it), in this process
        unless ``open_lanes`` opens the lanes elsewhere (a front end's link to the engine process). ``share_port``:
        bind with SO_REUSEPORT, beside the other front ends of the same server (serving/frontends.py)."""
        self.config = config
        self.metrics = metrics if metrics is not None else Metrics()
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._open_lanes = open_lanes or (lambda: open_local_lanes(config, loader, self.metrics))
        self._share_port = share_port
        self._server: grpc.aio.Server | None = None
        self._servicer: BertzooServicer | None = None
        self._health: DrainingHealthServicer | None = None
        self._lanes: Lanes | None = None
        self._service: TaskService | None = None
        self._http: HttpServer | None = None
        self.serving = False  # health SERVING: loaded and warmed up, not draining

    def _count_refused(self, method: str, code: grpc.StatusCode, reason: str) -> None:
        """Metrics for a call an interceptor refused before it reached the servicer."""
        self.metrics.record_refused(METHOD_TASKS.get(method.rsplit("/", 1)[-1], "other"), code.name, reason)

    async def start(self) -> None:
        """Listen, with health NOT_SERVING until :meth:`load` is done."""
        config = self.config
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if config.auth_token:
            interceptors.append(BearerTokenInterceptor(config.auth_token, OPEN_METHODS, self._count_refused))
        # Last in the chain: it keeps each method's guarded handler, so whatever runs per call (the token check)
        # must come before it.
        interceptors.append(MalformedRequestInterceptor(self._count_refused, config.message_limit))
        # SO_REUSEPORT off, except among one server's own front ends (whose parent holds the port): a second server
        # on a busy port must fail, not silently share it. gRPC's own receive limit sits above ours, so a request
        # over ours reaches the interceptor, which answers and counts it; gRPC itself refuses (uncounted) only what
        # is more than 4 times over, without buffering it.
        # Clients' keepalive pings (every 30 s by default, serving/client_channel.py) are welcome, even between calls.
        # A connection older than max_connection_age is asked to reconnect (GOAWAY), so that connections spread again
        # after a front end restarts or a replica joins; its calls in flight get the shutdown grace (at least 5 s).
        aging = [("grpc.max_connection_age_ms", int(config.max_connection_age * 1000)),
                 ("grpc.max_connection_age_grace_ms", int(max(config.shutdown_grace, 5.0) * 1000))
                 ] if config.max_connection_age else []
        server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.so_reuseport", int(self._share_port)), ("grpc.max_receive_message_length", 4 * config.message_limit),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.min_recv_ping_interval_without_data_ms", 10000),
            *aging])
        servicer = self._servicer = BertzooServicer(lambda: self._service, config, self.metrics,
                                                    runtime_versions(config.backend))
        pb2_grpc.add_BertzooServicer_to_server(servicer, server)
        self._health = DrainingHealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        listen_at = address(config.host, config.port)
        if not self._share_port:  # our own one-line error, before gRPC's C core logs its own
            check_free(config.host, config.port, "--port")
        try:
            if config.tls:
                assert config.tls_cert is not None and config.tls_key is not None
                client_ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
                credentials = grpc.ssl_server_credentials(
                    [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())],
                    root_certificates=client_ca, require_client_auth=client_ca is not None)
                self.port = server.add_secure_port(listen_at, credentials)
            else:
                self.port = server.add_insecure_port(listen_at)
        except RuntimeError as e:  # grpc's way of saying the address is taken or invalid
            raise OSError(f"could not listen on {listen_at}: {e} (--host, --port)") from e
        if not self.port:
            raise OSError(f"could not listen on {listen_at} (--host, --port)")
        for service in ("", SERVICE_NAME):
            await self._health.set(service, NOT_SERVING)
        await server.start()
        self._server = server
        if config.metrics_port:
            self.metrics_port = self.metrics.serve(config.metrics_host, config.metrics_port)
        if config.http_port:
            routes = HttpRoutes(config, servicer, self.metrics, lambda: self._service, lambda: self.serving)
            self._http = HttpServer(routes, config)
            await self._http.start(config.host, config.http_port, reuse_port=self._share_port)
            if not self._share_port:
                log.info("listening on %s for HTTP/1.1 (JSON: /v1/embeddings, /sentiment, ..., /health, /info)",
                         address(config.host, config.http_port))
        # Said to be gRPC: curl on this port gets "Received HTTP/0.9" from gRPC's core, which owns the socket.
        log.info("listening on %s for gRPC over HTTP/2 (%s%s; `bertzoo client` or grpcurl, not curl); health "
                 "NOT_SERVING until the model is ready", address(config.host, self.port),
                 "TLS" if config.tls else "plaintext", ", bearer-token auth" if config.auth_token else "")

    async def load(self) -> None:
        """Open the engine's lanes (in this process: load and warm up the model on its worker threads, while the
        event loop keeps answering health; with front ends: wait for the engine process), then report SERVING."""
        assert self._health is not None, "start() first"
        lanes = self._lanes = await self._open_lanes()
        self._service = TaskService(lanes, self.config, self.metrics)
        spec = lanes.spec
        self.metrics.build_info.labels(spec.backend, spec.device, spec.precision, spec.variant, _version()).set(1)
        self.metrics.start_tasks((*spec.tasks, EMBED),  # Embed needs no head
                                 ("grpc", "http") if self.config.http_port else ("grpc",))
        for service in ("", SERVICE_NAME):
            await self._health.set(service, SERVING)
        self.metrics.ready.set(1)
        self.serving = True
        log.info("ready: health SERVING (%s on %s, %s)", spec.backend, spec.device, spec.precision)

    async def not_serving(self) -> None:
        """Health NOT_SERVING from now on (the engine process is gone; the server is about to stop)."""
        self.metrics.ready.set(0)
        self.serving = False
        if self._health is not None:
            await self._health.enter_graceful_shutdown()

    async def _streams_told_to_stop(self, grace: float) -> None:
        """Wait (up to ``grace``) until the drained streams have ended, then a moment more before the server closes
        its connections. A client still sending on a stream when its status arrives stops once it reads that status;
        a connection closed while the client's requests are still arriving is reset (the server's side has unread
        data), and a reset can destroy the unread status on the client's side: it would see "Stream removed" instead
        of the drain's UNAVAILABLE."""
        assert self._servicer is not None
        ends = time.monotonic() + grace
        while self._servicer.open_streams and time.monotonic() < ends:
            await asyncio.sleep(0.01)
        await asyncio.sleep(min(STREAM_STATUS_READ_S, max(0.0, ends - time.monotonic())))

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, let accepted ones finish (up to ``grace`` seconds; None: the configured
        shutdown_grace), then stop everything."""
        grace = self.config.shutdown_grace if grace is None else grace
        self.metrics.ready.set(0)
        self.serving = False
        # HTTP drains beside gRPC: it stops accepting connections and lets its requests in flight finish.
        http_stopped = asyncio.create_task(self._http.stop()) if self._http is not None else None
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            if self._servicer is not None:
                self._servicer.grace_ends = time.monotonic() + grace
                if streams := self._servicer.drain_streams():
                    log.info("shutdown: %d open streams answer what they have taken, then end UNAVAILABLE", streams)
                    await self._streams_told_to_stop(grace)
            await self._server.stop(grace)  # returns once every accepted call has finished, or grace ran out
            for _ in range(100):  # the cut calls' handlers record themselves as their cancellation reaches them
                if self._servicer is None or not self._servicer.in_flight:
                    break
                await asyncio.sleep(0.01)
            if self._servicer is not None and self._servicer.cut_at_shutdown:
                log.warning("shutdown: %d calls still running when the %.1f s grace ran out were cut (UNAVAILABLE, "
                            "reason shutdown)", self._servicer.cut_at_shutdown, grace)
        if http_stopped is not None:
            await http_stopped
        if self._lanes is not None:
            await self._lanes.close()
        if self._service is not None:
            self._service.close()
        self.metrics.close()
        log.info("stopped")


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("bertzoo")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def run_serve(config: ServeConfig) -> None:
    """:func:`serve` on uvloop where it is installed (see :func:`run_on_best_loop`)."""
    run_on_best_loop(lambda: serve(config))


async def serve(config: ServeConfig, loader: ModelLoader = load_served_model, server: BertzooServer | None = None,
                stop_signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Run a server (default: one that loads the model in this process) until one of ``stop_signals``, then drain
    it (``bertzoo serve``). The signal handlers are removed again when it returns."""
    loop = asyncio.get_running_loop()
    event_loop = type(loop).__module__.split(".")[0]
    if server is None:
        log.info("effective config: %s; event loop: %s", json.dumps(config.for_log(), sort_keys=True), event_loop)
    else:  # a front end, whose parent logged the config
        log.info("front end on port %d; event loop: %s", config.port, event_loop)
    stop_requested = asyncio.Event()
    for sig in stop_signals:
        loop.add_signal_handler(sig, stop_requested.set)
    server = server if server is not None else BertzooServer(config, loader)
    loading: asyncio.Task | None = None
    try:
        await server.start()
        loading = asyncio.create_task(server.load())
        stopping = asyncio.create_task(stop_requested.wait())
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if loading.done():
            loading.result()  # a failed load ends the server with its error
            # Everything loaded lives as long as the process: out of the collector's sight, a full collection walks
            # only what requests create, so under a flood a full collection no longer stalls every call for long.
            # Only here, in the server's own process: not in ServerThread's host.
            gc.freeze()
        await stopping
        log.info("stop signal: refusing new calls, finishing accepted ones (up to %.0f s)", config.shutdown_grace)
    finally:
        for sig in stop_signals:
            loop.remove_signal_handler(sig)
        if loading is not None and not loading.done():
            loading.cancel()
        await server.stop()


class ServerThread:
    """A :class:`BertzooServer` on its own event loop in a background thread (tests, notebooks, embedding)::

        with ServerThread(ServeConfig(artifact, port=0, metrics_port=0)) as running:
            client = BertzooClient(f"127.0.0.1:{running.port}")
    """

    def __init__(self, config: ServeConfig, loader: ModelLoader = load_served_model) -> None:
        self.server = BertzooServer(config, loader)
        self._thread = threading.Thread(target=self._main, name="bertzoo-server", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._grace: float | None = None

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    @property
    def metrics(self) -> Metrics:
        return self.server.metrics

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        try:
            await self.server.start()
            await self.server.load()
        except BaseException as e:
            self._error = e
            self._ready.set()
            await self.server.stop(0)
            return
        self._ready.set()
        await self._stop_requested.wait()
        await self.server.stop(self._grace)

    def start(self, timeout: float = 120.0) -> ServerThread:
        """Start and wait until the model is ready (health SERVING); raises the load error if there was one."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the server was not ready after {timeout} s")
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def stop(self, grace: float | None = None) -> None:
        """Drain and stop (see :meth:`BertzooServer.stop`); blocks until done."""
        if self._loop is not None and self._stop_requested is not None and self._thread.is_alive():
            self._grace = grace
            self._loop.call_soon_threadsafe(self._stop_requested.set)
        if self._thread.ident is not None:  # started
            self._thread.join()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
