"""The server's settings, in one validated dataclass. ``bertzoo serve`` fills it from flags and their ``BERTZOO_*``
environment-variable mirrors and logs it (token redacted) at start."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from .backends import BACKENDS

# The backends, their devices and precisions: serving/backends' table, BACKENDS. DEVICES and PRECISIONS are every
# value any backend takes (serve's --device and --precision choices); which backend takes which is the table's.
# auto: torch computes in fp16 on a GPU and fp32 on the CPU (resolved_precision); openvino in bf16 where the CPU
# computes it natively (AVX-512 BF16 or AMX), else fp32; an ONNX Runtime artifact's precision is its variant, a
# TensorRT engine's the one it was built with.
DEVICES = tuple(dict.fromkeys(d for entry in BACKENDS.values() for d in entry.devices))
PRECISIONS = tuple(dict.fromkeys(p for entry in BACKENDS.values() for values in entry.precisions.values()
                                 for p in values))
OVERLONG_POLICIES = ("truncate", "reject")


@dataclass(frozen=True)
class BatchSettings:
    """How the dynamic batcher forms encoder batches (see serving/batcher.py)."""

    max_batch_size: int = 64  # sequences (encoder rows) per batch
    max_batch_tokens: int = 16384  # rows x padded length per batch: the real compute, padding included
    max_queue: int = 256  # requests waiting for the encoder; one more is answered RESOURCE_EXHAUSTED
    max_queue_delay_ms: float = 0.0  # how long an idle model waits for a fuller batch; 0: never
    # "longest": pad a batch to its longest sequence (rounded up to a multiple of 8), which is least compute on ONNX
    # Runtime CPU, where every shape is as fast as any other. "bucket": pad to the bucket length, for runtimes that
    # prefer a few fixed shapes (e.g. a TensorRT engine with one optimisation profile per bucket, or CUDA graphs).
    pad_to: str = "longest"

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_batch_tokens", "max_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pad_to not in ("longest", "bucket"):
            raise ValueError(f"pad_to must be 'longest' or 'bucket', got {self.pad_to!r}")
        if self.max_queue_delay_ms < 0:
            raise ValueError(f"max_queue_delay_ms must be >= 0, got {self.max_queue_delay_ms}")


def engine_threads(threads: int | None, instances: int) -> int | None:
    """Intra-op threads of each of ``instances`` engine instances on ``threads`` (None: all cores; for one instance,
    the engine's own default, every core)."""
    if instances == 1:
        return threads
    return max(1, (threads or os.cpu_count() or 1) // instances)


@dataclass(frozen=True)
class ServeConfig:
    model_dir: str  # an export artifact, or a checkpoint / run directory (torch: its entry serves checkpoints)
    backend: str = "onnxruntime"
    device: str = "cpu"  # where the backend runs: cpu, or cuda (the first visible NVIDIA GPU)
    precision: str = "auto"  # the torch and openvino backends' choice; see PRECISIONS
    cuda_graphs: bool = True  # torch on cuda: replay one captured CUDA graph per (batch, length) shape
    variant: str = "fp32"  # onnxruntime encoder variant: fp32, optimized or int8
    openvino_cache_dir: str | None = None  # OpenVINO's compiled-model cache; None: ~/.cache/bertzoo/openvino
    threads: int | None = None  # intra-op threads of the backend; None: all cores
    # Engine instances in the main lane, each on its own worker thread with threads // instances intra-op threads,
    # running batches side by side (Triton's instance groups). On few cores, two single-threaded instances beat one
    # two-threaded one on the server's small batches: no waiting for each other inside an operator (figures:
    # benchmarks/RESULTS.md, "Serving on CPU").
    instances: int = 1
    # With several instances whose threads add up to every usable core, each instance runs on cores of its own (the
    # event loop on any), so the scheduler does not move an engine mid-batch (serving/workers.py). Off: any core.
    pin_instances: bool = True
    # ORT worker threads spin between ops when on. Off by default: a server shares its cores with gRPC, the event loop
    # and the tokenizer, and spinning threads starve them (serving/backends/ort.py).
    ort_spinning: bool = False
    # Front-end processes (gRPC, tokenization, post-processing) in front of one engine process (serving/frontends.py);
    # 1: everything in one process. `bertzoo serve` picks it from the machine (serving/machine_defaults.py).
    frontends: int = 1
    # Engine processes (replicas), each with the whole model, its batchers and engine instances (on a GPU: its own CUDA
    # graphs and stream); every front end sends each request to the replica with the fewest requests outstanding.
    # Above 1, the front ends run in processes of their own even at frontends = 1. `auto`: serving/machine_defaults.py.
    engines: int = 1
    # Seconds a client connection lives before the server asks it (HTTP/2 GOAWAY) to reconnect, its calls in flight
    # given shutdown_grace (at least 5 s) to finish; gRPC core adds +-10% jitter. New connections spread again: over
    # the front ends of `--frontends` (a restarted one gets its share back) and over replicas behind a TCP balancer.
    # 0: never.
    max_connection_age: float = 15.0
    # The table `--backend auto` chose the engine from on this machine (serving/engine_choice.py), for ModelInfo.
    engine_choice: tuple[str, ...] = ()
    host: str = "0.0.0.0"
    port: int = 50051  # 0: pick a free port (tests)
    metrics_host: str = "127.0.0.1"  # the metrics endpoint is local unless asked otherwise
    metrics_port: int = 9400  # 0: no metrics endpoint
    http_port: int = 8000  # the HTTP/1.1 JSON routes (serving/http_server.py) on the same host; 0: none
    max_items: int = 64  # items per request
    # Requests of one stream in the server at a time: enough for a client to keep the batcher fed from one stream;
    # bounded, so a stream cannot fill the whole queue before any other client's request.
    stream_window: int = 32
    max_text_chars: int = 20000  # characters per text (QA contexts included); longer is always rejected
    # Bytes per request message; None: room for max_items items of two texts of max_text_chars 4-byte characters
    # (gRPC's own default, 4 MiB, refused 64 long texts before bertzoo saw them, and uncounted).
    max_message_bytes: int | None = None
    overlong: str = "truncate"  # a text over its token limit: "truncate" (as in training) or "reject"
    # A request's cost is its encoder tokens (every sequence, every QA window). Over max_request_tokens it is refused
    # (INVALID_ARGUMENT); over long_request_tokens it runs in the long-request lane (serving/batcher.py), in batches
    # that interleave with everyone else's. 32768 tokens: 64 SQuAD-sized QA items, or a 20,000-character context.
    max_request_tokens: int = 32768
    long_request_tokens: int = 4096
    batch: BatchSettings = field(default_factory=BatchSettings)
    tls_cert: str | None = None  # PEM certificate chain; with tls_key, the server speaks TLS only
    tls_key: str | None = None
    verify_key: str | None = None  # Ed25519 public key (PEM): serve only an artifact whose manifest it signed
    tls_client_ca: str | None = None  # PEM CA bundle: clients must present a certificate it signed (mTLS)
    auth_token: str | None = field(default=None, repr=False)  # clients must send "authorization: Bearer <token>"
    shutdown_grace: float = 30.0  # seconds in-flight requests get to finish after SIGTERM
    tokenize_threads: int = 1
    warmup: bool = True  # run every length bucket once before reporting SERVING
    # and the largest batches the batch settings allow: the engines' memory at its ceiling before SERVING
    warmup_largest: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {tuple(BACKENDS)}, got {self.backend!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        entry = BACKENDS[self.backend]
        if refusal := entry.device_refusal(self.device) or entry.precision_refusal(self.device, self.precision):
            raise ValueError(refusal)
        if self.overlong not in OVERLONG_POLICIES:
            raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {self.overlong!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and its key (tls_cert and tls_key)")
        if self.verify_key is not None and entry.serves != "artifact":
            raise ValueError(f"verify_key checks an export artifact's signed manifest; the {self.backend} backend "
                             f"serves a {entry.serves}")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca (client certificates) needs TLS: give tls_cert and tls_key too")
        for path in (self.tls_cert, self.tls_key, self.tls_client_ca):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"TLS file not found: {path}")
        if self.auth_token is not None and not self.auth_token.strip():
            raise ValueError("auth_token is empty; leave it unset to turn authentication off")
        if self.frontends < 1:
            raise ValueError(f"frontends must be >= 1, got {self.frontends}")
        if self.engines < 1:
            raise ValueError(f"engines must be >= 1, got {self.engines}")
        if self.max_message_bytes is not None and self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        for name in ("max_items", "stream_window", "max_text_chars", "tokenize_threads", "max_request_tokens",
                     "long_request_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("port", "metrics_port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name} must be a TCP port (0-65535), got {getattr(self, name)}")
        if self.http_port and self.http_port in (self.port, self.metrics_port):
            raise ValueError(f"http_port {self.http_port} is also the gRPC or metrics port: give each its own")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.instances > 1 and not (entry.cpu_instances and self.device == "cpu"):
            several = ", ".join(name for name, e in BACKENDS.items() if e.cpu_instances)
            raise ValueError(f"instances > 1 is for the CPU engines ({several}); a GPU engine batches on one device")
        if self.max_connection_age < 0:
            raise ValueError(f"max_connection_age must be >= 0 seconds, got {self.max_connection_age}")
        if self.shutdown_grace < 0:
            raise ValueError(f"shutdown_grace must be >= 0, got {self.shutdown_grace}")

    @property
    def engine_threads(self) -> int | None:
        """Intra-op threads of each engine instance: ``threads`` (default all cores) shared out among the instances."""
        return engine_threads(self.threads, self.instances)

    @property
    def message_limit(self) -> int:
        """The request size the server accepts, in bytes (protobuf framing adds a few bytes per text: 64 KiB slack)."""
        if self.max_message_bytes is not None:
            return self.max_message_bytes
        return 2 * self.max_items * self.max_text_chars * 4 + (1 << 16)

    @property
    def resolved_precision(self) -> str:
        """The precision the torch backend computes in (auto: fp16 on a GPU, fp32 on the CPU)."""
        if self.precision != "auto":
            return self.precision
        return "fp16" if self.device == "cuda" else "fp32"

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def for_log(self) -> dict:
        """The effective settings as a flat dict, the token replaced by whether one is set."""
        values = dataclasses.asdict(self)
        values.update(values.pop("batch"))
        values["auth_token"] = "<set>" if self.auth_token else None
        del values["engine_choice"]  # logged as its own table, one line a candidate
        if not (self.backend == "torch" and self.device == "cuda"):
            del values["cuda_graphs"]  # a setting of that engine alone
        if self.backend != "openvino":
            del values["openvino_cache_dir"]
        return values
