"""What the server serves: a backend (``serving.backends.BACKENDS``), its tokenizer, and the facts about the model the
rest of the server needs (tasks, labels, limits, pooling, length buckets), from an export artifact (torch-free on ONNX
Runtime and OpenVINO) or a training checkpoint (the PyTorch reference backend)."""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertzoo.pipeline import PAIR_TASKS, Backend
from bertzoo.tasks import Limits, task_spec
from bertzoo.tokenization import Tokenizer

from .backends import BACKENDS
from .config import BatchSettings, ServeConfig
from .engine import EMBED, PAD_MULTIPLE

log = logging.getLogger("bertzoo.serving")

# `bertzoo export`'s default buckets, for checkpoints, which carry none (an artifact lists its own).
DEFAULT_LENGTH_BUCKETS = (16, 32, 64, 128, 256, 384)
PARAPHRASE_LABELS = ("not_duplicate", "duplicate")


@dataclass(frozen=True)
class ModelSpec:
    tasks: tuple[str, ...]  # the heads the model has
    labels: dict[str, tuple[str, ...]]  # per classification task, in output order
    limits: Limits
    pooling: str  # "mean" (padding excluded) or "cls": how Embed pools token states
    qa_null_threshold: float
    length_buckets: tuple[int, ...]  # ascending; the last covers the longest sequence the limits allow
    hidden_size: int
    backend: str
    variant: str
    device: str = "cpu"
    precision: str = "fp32"  # what the encoder computes in: fp32, fp16, bf16 or int8
    artifact_versions: dict[str, str] = field(default_factory=dict)

    def bucket_for(self, length: int) -> int:
        """The padded length of a batch whose longest sequence has ``length`` tokens."""
        for bucket in self.length_buckets:
            if length <= bucket:
                return bucket
        return length  # only reachable with a bucket list shorter than the limits; pad to the sequence itself


@dataclass
class ServedModel:
    spec: ModelSpec
    tokenizer: Tokenizer
    backend: Backend
    # Makes a second instance of the engine for the long-request lane (serving/batcher.py), called on that lane's
    # low-priority thread; None where a second instance does not pay (a GPU: its kernels are short, and one device
    # runs one stream of work) and long requests share the main lane.
    spare_backend: Callable[[], Backend] | None = None


def _buckets(candidates: tuple[int, ...], limits: Limits) -> tuple[int, ...]:
    longest = max(limits.max_seq_length, limits.qa_max_length)
    return tuple(sorted({b for b in candidates if b < longest} | {longest}))


def _from_artifact(config: ServeConfig) -> ServedModel:
    from bertzoo.artifact import load_manifest

    from .backends import create_backend

    directory = Path(config.model_dir)
    # Checks every file's sha256 and the manifest's own sections (and its signature) before anything runs.
    manifest = load_manifest(directory, verify_key=config.verify_key)
    limits = Limits(**manifest["limits"])
    model = manifest["model"]
    labels = {"sentiment": tuple(manifest["labels"]["sentiment"]),
              "paraphrase": tuple(manifest["labels"].get("paraphrase", PARAPHRASE_LABELS))}
    tokenizer = Tokenizer.from_file(directory / manifest["tokenizer"])
    entry = BACKENDS[config.backend]
    options = {"variant": config.variant, "precision": config.precision, "threads": config.engine_threads,
               "device": config.device, "manifest": manifest, "spinning": config.ort_spinning,
               "cache_dir": config.openvino_cache_dir}
    backend = create_backend(config.backend, directory, **options)
    variant, precision = backend.variant, backend.precision  # what the encoder is and computes in
    if describe := getattr(backend, "describe", None):
        log.info("%s", describe())
    if entry.startup_gate:
        from .startup_gate import check_backend

        check_backend(backend, config.backend, precision, directory, manifest, tokenizer, limits, config.engine_threads)
    spare = None
    if entry.cpu_instances and config.device == "cpu":
        def spare() -> Backend:  # the files were hash-checked above; spinning off: this lane only takes idle time.
            # A backend with a model cache (OpenVINO) compiles from the cache the main one just filled.
            return create_backend(config.backend, directory, **{**options, "spinning": False})
    spec = ModelSpec(
        tasks=tuple(model["tasks"]), labels=labels, limits=limits, pooling=model["pooling"],
        qa_null_threshold=float(model.get("qa_null_threshold", 0.0)),
        length_buckets=_buckets(tuple(manifest.get("length_buckets", DEFAULT_LENGTH_BUCKETS)), limits),
        hidden_size=int(model["encoder"]["hidden_size"]), backend=config.backend, variant=variant,
        device=config.device, precision=precision,
        artifact_versions={k: str(v) for k, v in manifest.get("versions", {}).items()},
    )
    return ServedModel(spec, tokenizer, backend, spare)


def _from_checkpoint(config: ServeConfig) -> ServedModel:
    import torch

    from bertzoo.trainer.checkpoint import TOKENIZER, load_model
    from bertzoo.trainer.config import TrainConfig

    from .backends import check_available, create_backend

    check_available(config.backend, config.device)
    if config.threads:
        torch.set_num_threads(config.threads)
    model, saved, directory = load_model(config.model_dir)
    device = torch.device("cuda" if config.device == "cuda" else "cpu")
    precision = config.resolved_precision
    backend = create_backend(config.backend, model.to(device).eval(), device=device, precision=precision,
                             cuda_graphs=config.device == "cuda" and config.cuda_graphs,
                             graph_rows=config.batch.max_batch_size)  # every batch in a graph
    train_config = TrainConfig.from_dict(saved["train"])
    limits = train_config.limits
    spec = ModelSpec(
        tasks=tuple(model.heads), limits=limits, pooling=model.config.pooling,
        labels={"sentiment": task_spec("sentiment", train_config.sentiment_dataset).labels,
                "paraphrase": PARAPHRASE_LABELS},
        qa_null_threshold=float(model.config.qa_null_threshold),
        length_buckets=_buckets(DEFAULT_LENGTH_BUCKETS, limits), hidden_size=model.config.encoder.hidden_size,
        backend=config.backend, variant="checkpoint", device=config.device, precision=precision,
    )
    return ServedModel(spec, Tokenizer.from_file(directory / TOKENIZER), backend)


def load_served_model(config: ServeConfig) -> ServedModel:
    """Load (and hash-check, for an artifact) the model ``config`` names. Slow: call it off the event loop."""
    checkpoint = BACKENDS[config.backend].serves == "checkpoint"
    served = _from_checkpoint(config) if checkpoint else _from_artifact(config)
    spec = served.spec
    log.info("loaded %s: backend %s (%s), device %s, precision %s; tasks %s, buckets %s", config.model_dir,
             spec.backend, spec.variant, spec.device, spec.precision, ",".join(spec.tasks), spec.length_buckets)
    return served


def warm_up(served: ServedModel, backend: Backend | None = None, settings: BatchSettings | None = None) -> None:
    """Run the encoder (of ``backend``, default the main one) once per length bucket, and every head, so no client
    pays for first-run allocations; with ``settings``, also the largest batches they allow (:func:`largest_batches`),
    so the engine holds the buffers of its worst batch from the start, as a container's memory limit should see it,
    rather than growing to them under traffic. An engine that runs one-task batches as a unit of encoder and head
    (``runs_tasks``: the torch engine's CUDA graphs) runs each task so too, at one row (a pair, for the pair tasks)
    per bucket: a lone request's first batch then finds its graph captured."""
    backend = backend if backend is not None else served.backend
    shapes = [(1, bucket) for bucket in served.spec.length_buckets]
    if settings is not None:
        shapes += largest_batches(settings, served.spec.length_buckets[-1])
    for rows, width in shapes:
        batch = _warm_up_batch(served.tokenizer, rows, width)
        states, mask = backend.encode(batch), batch["attention_mask"]
        for task in served.spec.tasks:
            if task in PAIR_TASKS:
                backend.head(task, {"states_a": states, "mask_a": mask, "states_b": states, "mask_b": mask})
            else:
                backend.head(task, {"states": states, "mask": mask})
    if getattr(backend, "runs_tasks", False):
        for width in served.spec.length_buckets:
            for task in (*served.spec.tasks, EMBED):
                batch = _warm_up_batch(served.tokenizer, 2 if task in PAIR_TASKS else 1, width)
                backend.run_task(task, batch, served.spec.pooling)


def _warm_up_batch(tok: Tokenizer, rows: int, width: int) -> dict[str, np.ndarray]:
    """``rows`` sequences of ``width`` tokens, every one attended: [CLS] [UNK] ... [SEP]."""
    ids = np.full((rows, width), tok.unk_id, dtype=np.int64)
    ids[:, 0], ids[:, -1] = tok.cls_id, tok.sep_id
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def largest_batches(settings: BatchSettings, longest: int) -> list[tuple[int, int]]:
    """The (rows, width) batches that need the most memory under ``settings``: the longest sequences, as many as the
    token budget takes (the largest attention scores, rows x width^2), and the most rows at the widest width that
    fills the budget (the most tokens)."""
    widest = (max(1, min(settings.max_batch_size, settings.max_batch_tokens // longest)), longest)
    width = min(longest, max(PAD_MULTIPLE, settings.max_batch_tokens // settings.max_batch_size // PAD_MULTIPLE
                             * PAD_MULTIPLE))
    fullest = (max(1, min(settings.max_batch_size, settings.max_batch_tokens // width)), width)
    return [widest] if fullest == widest else [widest, fullest]


def release_freed_memory() -> None:
    """Hand the heap's freed pages back to the operating system (glibc): loading an engine parses its ONNX files into
    objects freed once the sessions exist, memory that the process's resident size would otherwise keep."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def runtime_versions(backend: str) -> dict[str, str]:
    """The versions this server process runs with (reported by ModelInfo)."""
    packages = ["bertzoo", "grpcio", "protobuf", "numpy", "tokenizers"]
    packages += BACKENDS[backend].packages
    versions = {"python": platform.python_version()}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions
