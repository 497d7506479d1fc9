"""The machine's compute ceiling for the encoder, measured in the benchmark's own run: the peak rate of one large
matrix product on these cores (fp32, and int8 as the encoder's dynamic quantization computes it), and the encoder's
work in FLOPs, so an engine's or a server's rate can be stated as a fraction of what the cores can do."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def gemm_peak_gflops(threads: int, precision: str = "fp32", m: int = 4096, k: int = 384, n: int = 1536) -> float:
    """GFLOP/s of one [m, k] x [k, n] MatMul on ONNX Runtime (the shape of the encoder's feed-forward layer), best of
    ten. ``precision="int8"``: the same product quantized as ``bertzoo export --int8`` quantizes the encoder (ONNX
    Runtime's dynamic quantization: the activations quantized per call, then an integer product), so the figure
    counts the same work an int8 encoder does, in multiply-adds x 2."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, n), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gemm.onnx"
        path.write_bytes(model.SerializeToString())
        if precision == "int8":
            import logging

            from onnxruntime.quantization import QuantType, quantize_dynamic

            logging.disable(logging.WARNING)  # its advice to pre-process a model of one MatMul
            try:
                quantize_dynamic(path, Path(tmp) / "gemm.int8.onnx", weight_type=QuantType.QInt8)
            finally:
                logging.disable(logging.NOTSET)
            path = Path(tmp) / "gemm.int8.onnx"
        elif precision != "fp32":
            raise ValueError(f"precision must be fp32 or int8, got {precision!r}")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
    session.run(None, {"x": x})
    best = min(timed(lambda: session.run(None, {"x": x})) for _ in range(10))
    return 2 * m * k * n / best / 1e9


def encoder_flops(shapes: list[tuple[int, int]], layers: int, hidden: int, ffn: int) -> float:
    """Matrix-product FLOPs of the encoder on batches of (rows, width): per token and layer 2 x (4 h^2 + 2 h f) for the
    projections and the feed-forward, plus 2 x 2 x width x h for attention's two products. Give (1, length) per
    sentence for the useful work, the padded batch shapes for what an engine computed."""
    return sum(rows * width * layers * 2 * (4 * hidden * hidden + 2 * hidden * ffn + 2 * width * hidden)
               for rows, width in shapes)
