"""TensorRT: an fp16 engine for ``encoder.onnx`` whose ``bertzoo.SparsegenLin`` nodes run the Triton kernel.

Written against the TensorRT >= 10.7 Python API. Everything imports ``tensorrt`` lazily, so this module (and the CLI's
error path) works on machines without it; :func:`require_tensorrt` says what is missing.

How a SparsegenLin node becomes our plugin (onnx-tensorrt's ModelImporter / onnxOpImporters):
- the plugin is a quickly deployable plugin (``tensorrt.plugin``) with id ``bertzoo::SparsegenLin``: namespace
  ``bertzoo``, name = the node's op_type, version "1" (the parser's default ``plugin_version``);
- the parser looks a node up as (op_type, attribute ``plugin_version`` or "1", attribute ``plugin_namespace`` or "").
  Only its last resort (FallbackPluginImporter) retries with the node's *domain* as namespace. The check that lets a
  plugin win over a model-local ONNX function (added in 10.7; newer parser sources make it only when the node has a
  ``plugin_namespace`` attribute or the parser flag ENABLE_PLUGIN_OVERRIDE is set) uses the attribute, never the domain.
So :func:`build_engine` parses a copy of the graph where each SparsegenLin node carries ``plugin_namespace="bertzoo"``
and the local function (the TopK reference body) is dropped: whatever the parser version, the node is either our
plugin or a parse error, never a silent fallback to the slow function body. The copy also renames the attribute
``lambda`` to ``lam``: plugin attributes are matched by name to the plugin's Python parameters, and ``lambda`` is a
Python keyword. The artifact's ``encoder.onnx`` itself is unchanged.

The plugin uses ``@trtp.impl`` (a Python callback at run time), so an engine runs in a Python process that called
:func:`register_sparsegen_plugin` before deserializing it, not in trtexec or Triton Inference Server without Python.
"""

import logging
import os
import threading
import time
from pathlib import Path

from bertzoo.serving.backends.base import ENCODER_INPUTS as INPUTS

from .sparsegen_onnx import DOMAIN, OP_TYPE

log = logging.getLogger("bertzoo.export")

PLUGIN_ID = f"{DOMAIN}::{OP_TYPE}"
LAMBDA_ATTR = "lam"  # the plugin's name for the ONNX attribute "lambda" (a Python keyword)

_INSTALL_HINT = (
    "On a machine with an NVIDIA GPU and driver, install a CUDA build of torch, then `pip install tensorrt triton` "
    "(PyPI's tensorrt package fetches NVIDIA's tensorrt-cu* wheels and libraries at install time, so the install "
    "needs access to NVIDIA's downloads)."
)
_lock = threading.Lock()
_registered = False
_trt_logger = None


class TensorRTUnavailable(RuntimeError):
    """TensorRT cannot run here: the tensorrt package, a CUDA GPU or the plugin's triton is missing."""


def require_tensorrt():
    """The ``tensorrt`` module, or :class:`TensorRTUnavailable` naming what is missing and what to install."""
    missing = []
    trt = None
    try:
        import tensorrt as trt
    except ImportError as e:
        missing.append(f"the `tensorrt` Python package ({e})")
    try:
        import torch

        if not torch.cuda.is_available():
            missing.append(f"a CUDA GPU (torch {torch.__version__} reports torch.cuda.is_available() == False)")
    except ImportError:
        missing.append("a CUDA GPU (torch is not installed, so none can be used)")
    if missing:
        raise TensorRTUnavailable(f"TensorRT export/serving needs {' and '.join(missing)}. {_INSTALL_HINT}")
    return trt


def _logger(trt):
    # One logger per process: TensorRT keeps the first logger it is given and warns about later ones.
    global _trt_logger
    if _trt_logger is None:
        _trt_logger = trt.Logger(trt.Logger.WARNING)
    return _trt_logger


def register_sparsegen_plugin() -> None:
    """Register the ``bertzoo::SparsegenLin`` plugin (idempotent). Call before parsing and before deserializing."""
    global _registered
    with _lock:
        if _registered:
            return
        require_tensorrt()
        import tensorrt.plugin as trtp
        import torch

        # Registered plugins appear as trtp.op.<namespace>.<name>: true after an earlier copy of this module registered
        # it (e.g. after importlib.reload), where registering again would fail.
        if hasattr(getattr(trtp.op, DOMAIN, None), OP_TYPE):
            _registered = True
            return

        try:
            from .sparsegen_gpu_kernel import sparsegen_lin_triton
        except ImportError as e:
            raise TensorRTUnavailable(f"the SparsegenLin plugin needs `triton` ({e}). {_INSTALL_HINT}") from e

        # QDP reads these signatures: inputs are the TensorDesc parameters, the rest are attributes (float -> the
        # parser passes the ONNX FLOAT attribute of the same name). No autotune: TensorRT then keeps the network's
        # own types for the plugin's I/O (float32 scores, bool mask), even in an FP16 build.
        @trtp.register(PLUGIN_ID)
        def _sparsegen_desc(scores: trtp.TensorDesc, mask: trtp.TensorDesc, lam: float) -> trtp.TensorDesc:
            return scores.like()

        @trtp.impl(PLUGIN_ID)
        def _sparsegen_impl(scores, mask, lam, outputs, stream) -> None:
            # Zero-copy torch views of TensorRT's buffers; the kernel is launched on TensorRT's stream.
            with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
                x = torch.as_tensor(scores, device="cuda")
                m = torch.as_tensor(mask, device="cuda")
                y = torch.as_tensor(outputs[0], device="cuda")
                sparsegen_lin_triton(x, m, float(lam), out=y)

        _registered = True


def _plugin_graph(onnx_path: Path) -> tuple[bytes, int]:
    """The serialized graph with its SparsegenLin nodes prepared for the plugin (see the module docstring)."""
    import onnx

    model = onnx.load(str(onnx_path))
    count = 0
    for node in model.graph.node:
        if node.domain != DOMAIN or node.op_type != OP_TYPE:
            continue
        count += 1
        for attr in node.attribute:
            if attr.name == "lambda":
                attr.name = LAMBDA_ATTR
        if not any(a.name == "plugin_namespace" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("plugin_namespace", DOMAIN))
    kept = [f for f in model.functions if not (f.domain == DOMAIN and f.name == OP_TYPE)]
    del model.functions[:]
    model.functions.extend(kept)
    return model.SerializeToString(), count


def _write_atomic(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # a reader never sees half an engine


def _profiles(batch_sizes: tuple[int, ...], seq_buckets: tuple[int, ...]) -> list[dict[str, tuple[int, int, int]]]:
    """One profile per sequence bucket, covering lengths (previous bucket, bucket] and batches 1..max(batch_sizes).

    opt = the bucket's own length and the largest batch: the server pads to a bucket and fills batches under load,
    so those are the shapes TensorRT should tune for."""
    if not batch_sizes or not seq_buckets or min(batch_sizes) < 1 or min(seq_buckets) < 1:
        raise ValueError(f"need positive batch sizes and buckets, got {batch_sizes} and {seq_buckets}")
    max_batch = max(batch_sizes)
    profiles, low = [], 1
    for bucket in sorted(set(seq_buckets)):
        profiles.append({"batch": (1, max_batch, max_batch), "seq": (low, bucket, bucket)})
        low = bucket + 1
    return profiles


def build_engine(onnx_path: str | os.PathLike, engine_path: str | os.PathLike, *, batch_sizes: tuple[int, ...],
                 seq_buckets: tuple[int, ...], fp16: bool = True, timing_cache_path: str | os.PathLike | None = None,
                 workspace_gib: float = 4) -> dict:
    """Build a serialized engine for ``encoder.onnx`` and write it atomically; returns a small report."""
    trt = require_tensorrt()
    register_sparsegen_plugin()
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    start = time.perf_counter()
    builder = trt.Builder(_logger(trt))
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, _logger(trt))
    graph, n_nodes = _plugin_graph(onnx_path)
    if not parser.parse(graph, str(onnx_path)):
        errors = "\n".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}:\n{errors}")
    n_plugins = sum(1 for i in range(network.num_layers) if network.get_layer(i).type == trt.LayerType.PLUGIN_V3)
    if n_plugins < n_nodes:
        raise RuntimeError(f"{onnx_path}: {n_nodes} SparsegenLin nodes but only {n_plugins} plugin layers")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    precision = "fp32"
    if fp16:
        flag = getattr(trt.BuilderFlag, "FP16", None)
        if flag is None:  # TensorRT 11 removed weak typing: fp16 then needs an fp16 ONNX (ModelOpt AutoCast)
            log.warning("TensorRT %s has no BuilderFlag.FP16; building fp32", trt.__version__)
        else:
            config.set_flag(flag)
            precision = "fp16"
    profiles = _profiles(tuple(batch_sizes), tuple(seq_buckets))
    for spec in profiles:
        profile = builder.create_optimization_profile()
        (b_min, b_opt, b_max), (t_min, t_opt, t_max) = spec["batch"], spec["seq"]
        for name in INPUTS:
            profile.set_shape(name, (b_min, t_min), (b_opt, t_opt), (b_max, t_max))
        config.add_optimization_profile(profile)

    cache_path = Path(timing_cache_path) if timing_cache_path is not None else None
    # The timing cache keeps kernel timings across builds (per GPU and TensorRT version): rebuilds take seconds.
    cached = cache_path.read_bytes() if cache_path is not None and cache_path.is_file() else b""
    config.set_timing_cache(config.create_timing_cache(cached), ignore_mismatch=False)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT failed to build an engine from {onnx_path} (see the TensorRT log above)")
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(engine_path, memoryview(serialized))
    if cache_path is not None:
        _write_atomic(cache_path, memoryview(config.get_timing_cache().serialize()))
    report = {
        "engine": engine_path.name, "tensorrt_version": trt.__version__, "precision": precision,
        "profiles": [{k: list(v) for k, v in p.items()} for p in profiles], "sparsegen_plugins": n_plugins,
        "timing_cache": cache_path.name if cache_path is not None else None,
        "build_seconds": round(time.perf_counter() - start, 2),
    }
    log.info("TensorRT %s engine %s built in %.1fs", precision, engine_path, report["build_seconds"])
    return report


__all__ = ["PLUGIN_ID", "TensorRTUnavailable", "build_engine", "register_sparsegen_plugin",
           "require_tensorrt"]
