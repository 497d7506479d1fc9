"""Faster ONNX Runtime graphs from the exported encoder, with ONNX Runtime's own tools:

- ``optimize``: the transformer fusions of ``onnxruntime.transformers.optimizer`` (LayerNorm, Gelu, Attention,
  embedding and bias fusions, where our graph's patterns match them). The report lists what fused.
- ``quantize_int8``: dynamic int8 quantization of the MatMul weights (``quantize_dynamic``); per-channel scales by
  default, since they keep accuracy better for small 384-wide models at no speed cost on CPU.
- ``bake_cpu_graph``: ONNX Runtime's own load-time optimizations, applied once at export and saved, for a graph that
  another program's ONNX Runtime loads at its basic level (Triton's onnxruntime backend, ``level: -1``): the int8
  MatMul fusions are kept, the fusions whose CPU kernels are slower (``SLOW_CPU_FUSIONS``) are not made.

Both write to a temporary file and rename, so a crash never leaves half a graph behind. Accuracy is not assumed:
``export/gates.py`` measures every variant before it goes into the manifest.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import onnx

log = logging.getLogger("bertzoo.export")


def optimize(src: Path, dst: Path, num_heads: int, hidden_size: int) -> dict:
    """Transformer fusions for CPU; returns {"fused": {op: count}, "nodes_before": n, "nodes_after": n}."""
    from onnxruntime.transformers import optimizer

    before = len(onnx.load(str(src), load_external_data=False).graph.node)
    # opt_level 0: only the Python fusion passes, so the result is portable ONNX (plus com.microsoft fused ops) rather
    # than a graph pre-optimized for one machine's CPU; ORT still applies its own optimizations when it loads it.
    model = optimizer.optimize_model(str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                                     opt_level=0, use_gpu=False)
    fused = {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
    tmp = dst.with_name(f".{dst.name}.tmp")
    model.save_model_to_file(str(tmp))
    os.replace(tmp, dst)
    after = len(onnx.load(str(dst), load_external_data=False).graph.node)
    log.info("optimized %s: %d -> %d nodes, fused %s", src.name, before, after, fused or "nothing")
    return {"fused": fused, "nodes_before": before, "nodes_after": after}


def quantize_int8(src: Path, dst: Path, per_channel: bool = True) -> dict:
    """Dynamic int8 weights for MatMul (activations quantized on the fly); returns the settings used."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = dst.with_name(f".{dst.name}.tmp")
    quantize_dynamic(str(src), str(tmp), weight_type=QuantType.QInt8, per_channel=per_channel,
                     op_types_to_quantize=["MatMul"])
    os.replace(tmp, dst)
    log.info("quantized %s -> %s (int8 weights, per_channel=%s)", src.name, dst.name, per_channel)
    return {"weight_type": "QInt8", "per_channel": per_channel, "op_types": ["MatMul"], "source": src.name}


def bake_cpu_graph(src: Path, dst: Path, disabled: Sequence[str] | None = None) -> dict:
    """``src`` as ONNX Runtime's CPU execution provider optimizes it at the extended level, less the optimizers named
    in ``disabled`` (default ``SLOW_CPU_FUSIONS``), saved to ``dst``; returns {"ops": {op: count} of the ONNX Runtime
    ops it holds, "disabled": [...], "level"}.

    The extended level is portable across CPUs (the hardware-specific layouts are the level above it), and the saved
    graph keeps only the opset imports its nodes use, so an older ONNX Runtime does not refuse a domain it lacks."""
    import onnxruntime as ort

    from bertzoo.serving.backends.ort import SLOW_CPU_FUSIONS

    disabled = list(SLOW_CPU_FUSIONS if disabled is None else disabled)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    tmp = dst.with_name(f".{dst.name}.tmp")
    options.optimized_model_filepath = str(tmp)
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"],
                         disabled_optimizers=disabled)
    model = onnx.load(str(tmp))
    used = {node.domain for node in model.graph.node} | {""}
    kept = [o for o in model.opset_import if o.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    onnx.save(model, str(tmp))
    os.replace(tmp, dst)
    ops = dict(collections.Counter(node.op_type for node in model.graph.node if node.domain == "com.microsoft"))
    log.info("baked %s for CPU: %s", dst.name, ops or "no fused ops")
    return {"ops": ops, "disabled": disabled, "level": "extended"}
