"""A Triton Inference Server model repository for users who outgrow one bertzoo server.

Layout (https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/model_repository.html):

    triton/
      bertzoo_encoder/config.pbtxt, 1/model.onnx   (or 1/model.plan with the tensorrt backend)
      bertzoo_encoder_int8/config.pbtxt, 1/model.onnx   (with --int8: the same inputs and outputs)
      bertzoo_head_<task>/config.pbtxt, 1/model.onnx
      bertzoo/config.pbtxt, 1/model.py, 1/bertzoo.json, 1/tokenizer.json   text in, answers out (Python backend)

The encoder models are the artifact's padded graphs (``encoder.padded.onnx``, ``encoder.padded.int8.onnx``), not
the packed ``encoder.onnx`` bertzoo's own server runs: Triton batches requests along a leading batch axis.

An encoder served on the CPU is loaded at ONNX Runtime's basic optimization level (``optimization { graph { level:
-1 } }``): every level above it makes fusions whose CPU kernels are slower than the ops they replace on the padded
graphs (figures: benchmarks/RESULTS.md, "Export parity and speed").
``encoder.padded.int8.onnx`` is written with ONNX Runtime's other load-time fusions already applied
(``ort_tools.bake_cpu_graph``), so it loses nothing.

Each model gets dynamic batching (no added queue delay by default, like our own batcher) and an instance group. Every
graph's first axis is its batch axis, which Triton's dims leave out; the other axes are -1 where the graph's are
symbolic (sequence length: a client sends each batch padded to its own longest sequence, or to a length bucket). A
per-item scalar (the paraphrase and similarity heads' output) is declared ``dims: [ 1 ]`` with ``reshape: { shape:
[ ] }``, since Triton refuses empty dims.

The ``bertzoo`` model (export/triton_python_model.py) is what most clients call: text in, each task's answer out, one
row per item, batched across requests by Triton's dynamic batcher. Its ENGINE parameter picks where the encoder and
heads run: the repository's own models through BLS (default; the hidden states pass between them inside Triton), or
bertzoo's ONNX Runtime engine inside the Python model's process, for a Triton without the onnxruntime backend.
A client that tokenizes itself (``bertzoo.tasks`` is torch-free and pip-installable) can call the encoder and head
models directly. An SSAF encoder runs on Triton's onnxruntime backend through the
SparsegenLin function body the graph carries; for our much faster native kernel, build it on the Triton host
(``python -m bertzoo.export.ort_kernel`` prints the library's path) and add
``model_operations { op_library_filename: "<that path>" }`` to ``bertzoo_encoder/config.pbtxt`` (Triton's "Custom
Operations" guide, ONNX section; Triton's ONNX Runtime must be 1.23 or newer, the kernel's C API version).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import onnx

_ONNX_TO_TRITON = {
    onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16", onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.INT32: "TYPE_INT32", onnx.TensorProto.BOOL: "TYPE_BOOL",
}


def _tensor_entries(values, skip_batch: bool) -> list[str]:
    entries = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if skip_batch:  # with max_batch_size > 0, Triton's dims leave out the batch axis
            if not dims or dims[0] != -1:
                raise ValueError(f"{v.name}: the first axis must be a symbolic batch axis for Triton's dynamic "
                                 f"batching, got shape {dims}")
            dims = dims[1:]
        shape = f"dims: {dims}" if dims else "dims: [1], reshape: { shape: [] }"
        entries.append(f'  {{ name: "{v.name}", data_type: {_ONNX_TO_TRITON[t.elem_type]}, {shape} }}')
    return entries


def model_config(name: str, graph: onnx.ModelProto, backend: str, max_batch_size: int, instances: int, kind: str,
                 max_queue_delay_us: int, basic_optimizations: bool = False) -> str:
    """config.pbtxt text for one graph; ``basic_optimizations``: ONNX Runtime loads it at its basic level
    (``level: -1``) rather than with every optimization."""
    inputs = ",\n".join(_tensor_entries(graph.graph.input, skip_batch=True))
    outputs = ",\n".join(_tensor_entries(graph.graph.output, skip_batch=True))
    return (
        f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: {max_batch_size}\n'
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
        f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}\n"
        f"instance_group [ {{ count: {instances}, kind: {kind} }} ]\n"
        + ("optimization { graph { level: -1 } }\n" if basic_optimizations else "")
    )


def _place(src: Path, dst: Path) -> None:
    # A hard link costs no disk for the 90 MB encoder; copy where the filesystem cannot link.
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


PYTHON_MODEL_CONFIG = """name: "bertzoo"
backend: "python"
max_batch_size: {max_batch_size}
input [
  { name: "TASK", data_type: TYPE_STRING, dims: [1] },
  { name: "TEXT_A", data_type: TYPE_STRING, dims: [1] },
  { name: "TEXT_B", data_type: TYPE_STRING, dims: [1], optional: true }
]
output [
  { name: "ANSWER", data_type: TYPE_STRING, dims: [1] }
]
dynamic_batching { max_queue_delay_microseconds: 0 }
instance_group [ { count: {instances}, kind: KIND_CPU } ]
parameters: { key: "ENGINE", value: { string_value: "bls" } }
parameters: { key: "ENCODER", value: { string_value: "bertzoo_encoder" } }
parameters: { key: "VARIANT", value: { string_value: "fp32" } }
parameters: { key: "THREADS", value: { string_value: "1" } }
"""


# The ``bertzoo`` model's rows per execute call where the encoder runs on the CPU: in a real Triton on 2 cores (int8,
# 64 clients), 16 and 8 served more than 64 did, as batches of 16 beat 64 in-process.
CPU_TEXT_BATCH = 16


def write_text_model(root: Path, artifact_dir: Path, settings: dict, instances: int = 2, max_batch_size: int = 64
                     ) -> None:
    """The ``bertzoo`` Python-backend model: model.py, its settings (a slice of the manifest) and the tokenizer. Its
    rows are items (one per sentence, pair or question), so ``max_batch_size`` is the most items one execute call
    takes from Triton's dynamic batcher."""
    version = root / "bertzoo" / "1"
    version.mkdir(parents=True)
    shutil.copyfile(Path(__file__).with_name("triton_python_model.py"), version / "model.py")
    shutil.copyfile(artifact_dir / "tokenizer.json", version / "tokenizer.json")
    (version / "bertzoo.json").write_text(json.dumps(settings, indent=2) + "\n")
    config = PYTHON_MODEL_CONFIG.replace("{instances}", str(instances)).replace("{max_batch_size}", str(max_batch_size))
    (root / "bertzoo" / "config.pbtxt").write_text(config)


def in_process_engine_config(config: str, artifact: Path, variant: str = "fp32", instances: int = 2, threads: int = 1,
                              python_env: str | None = None) -> str:
    """The ``bertzoo`` model's config.pbtxt text ``config``, set to run the artifact's ``variant`` in the model's own
    process (ENGINE onnxruntime), ``instances`` instances of ``threads`` intra-op threads each; ``python_env``: the
    Python environment Triton's Python backend activates for it (EXECUTION_ENV_PATH, a directory with bin/activate)."""
    def with_parameter(text: str, key: str, value: str) -> str:
        line = f'parameters: {{ key: "{key}", value: {{ string_value: "{value}" }} }}'
        pattern = rf'parameters: \{{ key: "{key}", value: \{{ string_value: "[^"]*" \}} \}}'
        return re.sub(pattern, line, text) if re.search(pattern, text) else text.rstrip("\n") + "\n" + line + "\n"

    config = re.sub(r"count: \d+", f"count: {instances}", config)
    settings = {"ENGINE": "onnxruntime", "VARIANT": variant, "THREADS": str(threads), "ARTIFACT": str(artifact.resolve())}
    if python_env is not None:
        settings["EXECUTION_ENV_PATH"] = python_env
    for key, value in settings.items():
        config = with_parameter(config, key, value)
    return config


def write_repository(artifact_dir: Path, graphs: dict[str, str], engine: Path | None = None, max_batch_size: int = 64,
                     instances: int = 1, gpu: bool = False, max_queue_delay_us: int = 0) -> dict[str, str]:
    """Write ``artifact_dir/triton``; ``graphs`` maps "encoder" (and "encoder_<variant>", e.g. "encoder_int8") and the
    task names to ONNX files in ``artifact_dir``. With ``engine`` the encoder uses the tensorrt backend (the
    SparsegenLin plugin must then be loaded into Triton, see README). Returns {triton model name: backend}."""
    root = artifact_dir / "triton"
    shutil.rmtree(root, ignore_errors=True)
    kind = "KIND_GPU" if gpu or engine is not None else "KIND_CPU"
    written = {}
    for key, file in graphs.items():
        name = f"bertzoo_{key}" if key.startswith("encoder") else f"bertzoo_head_{key}"
        graph = onnx.load(str(artifact_dir / file), load_external_data=False)
        if key == "encoder" and engine is not None:
            backend = "tensorrt"
            _place(engine, root / name / "1" / "model.plan")
        else:
            backend = "onnxruntime"
            _place(artifact_dir / file, root / name / "1" / "model.onnx")
        # An encoder on ONNX Runtime's CPU provider loads at the basic level: the extended level's SkipLayerNorm and
        # BiasGelu fusions, which Triton's config cannot turn off alone, have slower CPU kernels than the ops they
        # fuse (serving.backends.ort.SLOW_CPU_FUSIONS); the int8 graph comes with its MatMul fusions baked in.
        basic = key.startswith("encoder") and backend == "onnxruntime" and kind == "KIND_CPU"
        (root / name / "config.pbtxt").write_text(
            model_config(name, graph, backend, max_batch_size, instances, kind, max_queue_delay_us, basic))
        written[name] = backend
    return written
