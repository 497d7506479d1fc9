"""The server's Prometheus metrics, in a registry of their own (so several servers can live in one process, as in the
tests), served in the Prometheus text format on ``--metrics-port``. serving/grafana/bertzoo-dashboard.json charts
them.

Times are in seconds. Per-request histograms are labelled by ``task`` (sentiment, paraphrase, similarity, qa, embed,
model_info); the failure counter adds the gRPC status ``code`` and a fixed ``reason`` (queue_full, deadline,
cancelled, backend, invalid_argument, unauthenticated, ...), never anything taken from a request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from .ports import address

log = logging.getLogger("bertzoo.serving")
# No `*_created` timestamp series next to every counter and histogram: Prometheus does not use them, and they double
# the series a dashboard query has to skip.
disable_created_metrics()

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """``/metrics`` of ``registry`` over HTTP from a daemon thread; a busy port is one line naming the option."""
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise OSError(f"could not serve metrics on {address(host, port)}: {e.strerror or e} (choose another port "
                      "with --metrics-port, or 0 for none)") from None
    log.info("metrics on http://%s/metrics", address(host, server.server_address[1]))
    return server


PROTOCOLS = ("grpc", "http")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        def seconds(name: str, what: str, labels: tuple[str, ...] = ("task",)) -> Histogram:
            return Histogram(f"bertzoo_{name}_seconds", what, labels, buckets=LATENCY_BUCKETS, registry=r)

        # protocol: "grpc", or "http" for the HTTP routes (serving/http_server.py): one series for both, told apart
        self.request_seconds = seconds("request", "Server time per request, arrival to answer, by task and protocol.",
                                       ("task", "protocol"))
        self.queue_seconds = seconds("queue", "Wait in the batcher queue until the request's first model pass.")
        self.tokenize_seconds = seconds("tokenize", "Validation and tokenization per request.")
        self.inference_seconds = seconds("inference", "First model pass start to last model pass end, per request.")
        # lane: "main", or "long" for requests over --long-request-tokens (serving/batcher.py)
        self.batch_seconds = Histogram("bertzoo_batch_seconds", "Encoder and heads time per batch, by lane.",
                                       ["lane"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("bertzoo_batch_size", "Sequences (encoder rows) per batch, by lane.",
                                    ["lane"], buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("bertzoo_batch_tokens", "Padded tokens (rows x bucket length) per batch, by "
                                      "lane.", ["lane"], buckets=BATCH_TOKEN_BUCKETS, registry=r)
        self.queue_depth = Gauge("bertzoo_queue_depth", "Requests waiting in a batcher queue, by lane.", ["lane"],
                                 registry=r, multiprocess_mode="livesum")
        self.queue_sequences = Gauge("bertzoo_queue_sequences", "Sequences waiting in a batcher queue, by lane.",
                                     ["lane"], registry=r, multiprocess_mode="livesum")
        self.queue_limit = Gauge("bertzoo_queue_limit", "Requests a lane's queue holds (--max-queue): saturation is "
                                 "bertzoo_queue_depth / bertzoo_queue_limit.", ["lane"], registry=r,
                                 multiprocess_mode="livemax")
        self.ready = Gauge("bertzoo_ready", "1 while health reports SERVING (model loaded and warmed up, not "
                           "draining), else 0.", registry=r, multiprocess_mode="livemax")
        self.inflight = Gauge("bertzoo_inflight_requests", "Requests being handled (of unary RPCs and on streams).",
                              registry=r, multiprocess_mode="livesum")
        self.open_streams = Gauge("bertzoo_open_streams", "Open *Stream calls, by task; their requests count under "
                                  "the task like unary ones.", ["task"], registry=r,
                                  multiprocess_mode="livesum")
        self.requests = Counter("bertzoo_requests", "Requests answered, by task, status code (gRPC's, for HTTP too) "
                                "and protocol.", ["task", "code", "protocol"], registry=r)
        self.failures = Counter("bertzoo_request_failures", "Failed requests, by task, status code, reason and "
                                "protocol.", ["task", "code", "reason", "protocol"], registry=r)
        # bertzoo_build_info{backend, device, precision, variant, version} 1, set once the model is loaded: dashboards
        # and alerts can tell a GPU replica from a CPU one, or an int8 one from fp32.
        # A gauge rather than an Info, which prometheus_client's multiprocess mode cannot carry; the exposition is the
        # same series.
        self.build_info = Gauge("bertzoo_build_info", "What this server runs: backend, device, precision, variant, "
                                "version.", ["backend", "device", "precision", "variant", "version"], registry=r,
                                multiprocess_mode="livemax")
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ... of this server (Linux).
        ProcessCollector(registry=r)
        self._http: WSGIServer | None = None

    def start_tasks(self, tasks: Iterable[str], protocols: Iterable[str] = PROTOCOLS) -> None:
        """Export each served task's series at zero before its first request. A series that first appears already
        counting hides its first requests from rate(): a replica's first burst, or all of its traffic when the scrapes
        between its first and last request are lost (a slow scrape times out), would show no latency at all."""
        for task in tasks:
            for histogram in (self.queue_seconds, self.tokenize_seconds, self.inference_seconds):
                histogram.labels(task)
            for protocol in protocols:
                self.request_seconds.labels(task, protocol)
                self.requests.labels(task, "OK", protocol)
            self.open_streams.labels(task)

    def record_refused(self, task: str, code: str, reason: str, protocol: str = "grpc") -> None:
        """A request refused before it reached the servicer (an interceptor, an unreadable HTTP body): no latency."""
        self.requests.labels(task, code, protocol).inc()
        self.failures.labels(task, code, reason, protocol).inc()

    def record_request(self, task: str, code: str, reason: str, seconds: float, protocol: str = "grpc") -> None:
        self.requests.labels(task, code, protocol).inc()
        self.request_seconds.labels(task, protocol).observe(seconds)
        if code != "OK":
            self.failures.labels(task, code, reason, protocol).inc()

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` over HTTP from a daemon thread; returns the bound port."""
        self._http = serve_metrics(self.registry, host, port)
        return self._http.server_address[1]

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class ProcessTreeCollector:
    """The ``process_*`` series of a server made of several processes (front ends and an engine), summed over them
    as if they were one process: CPU seconds, memory and open files add up, ``process_max_fds`` is the largest
    limit and ``process_start_time_seconds`` the earliest start. ``pids()`` names the live processes."""

    _COMBINE = {"process_start_time_seconds": min, "process_max_fds": max}

    def __init__(self, pids: Callable[[], Iterable[int]]) -> None:
        self._pids = pids

    def collect(self) -> Iterable[Metric]:
        totals: dict[str, tuple[Metric, float]] = {}
        for pid in self._pids():
            for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():
                for sample in family.samples:
                    combine = self._COMBINE.get(sample.name, sum)
                    seen = totals.get(sample.name)
                    value = sample.value if seen is None else combine((seen[1], sample.value))
                    totals[sample.name] = (family, value)
        for name, (family, value) in totals.items():
            merged = Metric(family.name, family.documentation, family.type)
            merged.add_sample(name, {}, value)
            yield merged


def merged_registry(directory: str, pids: Callable[[], Iterable[int]]) -> CollectorRegistry:
    """One view of every process's metrics, as one process's registry shows them: prometheus_client's multiprocess
    collector over ``directory`` (each process's series, gauges combined by their ``multiprocess_mode``) and the
    processes' ``process_*`` series (:class:`ProcessTreeCollector`)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    registry.register(ProcessTreeCollector(pids))
    return registry
