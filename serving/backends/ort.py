"""The ONNX Runtime backend: the artifact's encoder (a variant: fp32, optimized, int8) and head graphs, each an ORT
session, on the CPU or (``device="cuda"``, with the onnxruntime-gpu package) the CUDA execution provider, where the
encoder's states stay on the GPU between encoder and heads. Torch-free; onnxruntime is imported when one is made
(:func:`create`, its entry in ``serving.backends.BACKENDS``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bertzoo.artifact import ONNX_IR_VERSION, ArtifactError, load_manifest
from bertzoo.cpu import flushing_denormals

from .base import BackendUnavailable, encoder_feed, pool_embeddings, rows_mask

VARIANTS = ("fp32", "optimized", "int8")
INSTALL_HINT = "pip install 'bertzoo[serve]', or 'bertzoo[serve-gpu]' for --device cuda"


def session_options(threads: int | None = None, spinning: bool = False, flush_denormals: bool | None = None):
    """ORT settings: all graph optimizations; ``threads`` intra-op threads (default: all cores) and one inter-op
    thread (our graphs are sequential). Spinning keeps worker threads hot between the ops of one batch: lower latency
    for a process that has the cores to itself (a benchmark), but a server shares them with gRPC and the tokenizer,
    whose work spinning threads hold up, so it is off unless asked for. ``flush_denormals``: the pool threads flush
    denormal floats to zero (bertzoo.cpu.flush_denormals); default: as the calling thread does (a server's engine
    threads do, serving/workers.py). ONNX Runtime also sets the mode of the thread that makes a session with it on,
    so it is never on for a thread that did not ask."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or os.cpu_count() or 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if flush_denormals is None:
        flush_denormals = flushing_denormals()
    options.add_session_config_entry("session.set_denormal_as_zero", "1" if flush_denormals else "0")
    # No memory patterns: ORT keeps one planned block per input shape it has seen, and a server sees a new shape per
    # batch width, so resident memory only grew (same speed without, measured on the encoder).
    options.enable_mem_pattern = False
    return options


# Fusions ONNX Runtime makes when it loads a graph on a [batch, seq, hidden] grid (the padded encoders; the packed
# one never matches them) whose CPU kernels cost more than the ops they replace (SkipLayerNormalization against its
# LayerNormalization and residual Add, BiasGelu against its Gelu), so the padded encoders run faster without both
# (figures: benchmarks/RESULTS.md, "Export parity and speed"). CPU sessions are made without them; on a GPU they stay.
SLOW_CPU_FUSIONS = ("SkipLayerNormFusion", "BiasGeluFusion")


def disabled_fusions(device: str) -> list[str]:
    """The ``disabled_optimizers`` of a session on ``device``."""
    return list(SLOW_CPU_FUSIONS) if device == "cpu" else []


# ONNX Runtime's CPU arena keeps the largest block a batch ever needed. A batch bigger than this (rows x width^2:
# attention's share of the memory) gives its blocks back when it ends, so one worst-case input cannot leave the
# server holding gigabytes. 64 x 96^2 covers full batches of sentences up to 96 tokens and 4 QA windows of 384; giving
# blocks back after every batch would slow the small ones down.
ARENA_KEEP_CELLS = 64 * 96 * 96


def arena_shrink_options():
    """RunOptions that shrink the CPU arena at the end of the run."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


ORT_GPU_HINT = ("install the GPU build of ONNX Runtime in place of the CPU one: `pip uninstall -y onnxruntime && pip "
                "install 'bertzoo[serve-gpu]'` (for a CUDA 12 driver add 'onnxruntime-gpu<1.27'; see the README)")


def ort_providers(device: str) -> list:
    """The execution providers for ``device``, always named explicitly: a CUDA-enabled onnxruntime is never used on
    the GPU unless asked, and asking for the GPU without one fails here, naming the package to install."""
    import onnxruntime as ort

    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    have = ort.get_available_providers()
    if "CUDAExecutionProvider" not in have:
        raise BackendUnavailable(f"--device cuda: onnxruntime {ort.__version__} has no CUDA execution provider (it has "
                                 f"{', '.join(have)}); {ORT_GPU_HINT}")
    if hasattr(ort, "preload_dlls"):  # CUDA and cuDNN from the nvidia-* wheels (e.g. torch's), where installed
        ort.preload_dlls()
    # fp32 means fp32: with TF32 matmuls (the provider's default on Ampere and later) the encoder's states moved by up
    # past the export's fp32 bound of 1e-3 on an H100 (benchmarks/RESULTS.md, "Serving on GPU").
    # The CPU provider stays in the list: ONNX Runtime places shape arithmetic there on purpose.
    return [("CUDAExecutionProvider", {"device_id": "0", "use_tf32": "0"}), "CPUExecutionProvider"]


def provider_names(providers: list) -> list[str]:
    return [p[0] if isinstance(p, tuple) else p for p in providers]


def row_selection_model():
    """A small graph that picks rows of the encoder's states where they are (the GPU): states [B, L, H] and rows [N]
    with their mask [N, W] -> states[rows, :W] * mask, zero past each sequence's end (``engine.HostStates.select``)."""
    from onnx import TensorProto, helper

    constants = [helper.make_tensor(name, TensorProto.INT64, [1], [value])
                 for name, value in (("zero", 0), ("one", 1), ("two", 2), ("last", -1))]
    nodes = [
        helper.make_node("Gather", ["states", "rows"], ["gathered"], axis=0),
        helper.make_node("Shape", ["mask"], ["mask_shape"]),
        helper.make_node("Slice", ["mask_shape", "one", "two"], ["width"]),
        helper.make_node("Slice", ["gathered", "zero", "width", "one"], ["cut"]),
        helper.make_node("Cast", ["mask"], ["mask_float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_float", "last"], ["mask_3d"]),
        helper.make_node("Mul", ["cut", "mask_3d"], ["selected"]),
    ]
    graph = helper.make_graph(
        nodes, "select_rows",
        [helper.make_tensor_value_info("states", TensorProto.FLOAT, ["batch", "length", "hidden"]),
         helper.make_tensor_value_info("rows", TensorProto.INT64, ["n"]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["n", "width"])],
        [helper.make_tensor_value_info("selected", TensorProto.FLOAT, ["n", "width", "hidden"])], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=ONNX_IR_VERSION)


class DeviceStates:
    """The encoder's states of one batch left on the session's device (an OrtValue): ``select`` picks a task's rows
    there for its head, ``host`` copies rows back only where the host needs them (embeddings)."""

    def __init__(self, backend: OnnxRuntimeBackend, states, mask: np.ndarray) -> None:
        self._backend, self._states, self.mask = backend, states, mask

    def select(self, rows):
        mask = rows_mask(self.mask, rows)
        return self._backend.select_rows(self._states, rows, mask), mask

    def host(self, rows) -> tuple[np.ndarray, np.ndarray]:
        selected, mask = self.select(rows)
        return selected.numpy(), mask

    def embeddings(self, rows, pooling: str) -> np.ndarray:
        return pool_embeddings(*self.host(rows), pooling)


class OnnxRuntimeBackend:
    """The artifact's encoder (in the chosen variant) and head graphs, each an ORT session.

    ``resident_states`` (default: on cuda) keeps the encoder's states on the device between the encoder and the heads
    (ORT I/O binding), where the host copy would cost two transfers of batch x length x hidden floats; on the CPU the
    plain numpy path is faster."""

    def __init__(self, directory: str | Path, variant: str = "fp32", threads: int | None = None,
                 device: str = "cpu", manifest: dict | None = None, spinning: bool = False,
                 sparsegen: str = "auto", encoder: bool = True, resident_states: bool | None = None) -> None:
        import onnx
        import onnxruntime as ort

        from bertzoo.export import ort_kernel

        directory = Path(directory)
        self.manifest = manifest if manifest is not None else load_manifest(directory)
        graphs = self.manifest["graphs"]
        encoders = graphs["encoder"]["files"]
        if encoder and variant not in encoders:
            raise ArtifactError(f"{directory}: no {variant!r} encoder in this artifact (it has {sorted(encoders)}); "
                                "export with --optimize / --int8 to add one")
        self.variant = variant
        self.precision = "int8" if variant == "int8" else "fp32"  # what the encoder computes in
        options = session_options(threads, spinning)
        providers = ort_providers(device)
        self.device = device

        files = {"encoder": encoders[variant]} if encoder else {}
        files.update({task: spec["files"]["fp32"] for task, spec in graphs.items() if task != "encoder"})
        # An SSAF graph's SparsegenLin runs on our native kernel where it can, else on a formulation that is fast
        # on ORT (same result; export/ort_kernel, export/sparsegen_onnx.py). The files on disk stay as exported.
        models, self.native_sparsegen = ort_kernel.prepare(
            {name: onnx.load(str(directory / file)) for name, file in files.items()}, options,
            provider_names(providers), sparsegen)
        sessions = {name: ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=providers,
                                               disabled_optimizers=disabled_fusions(device))
                    for name, model in models.items()}
        self._encoder = sessions.pop("encoder", None)
        self._encoder_inputs = [i.name for i in self._encoder.get_inputs()] if self._encoder else []
        self._heads = sessions
        self.tasks = tuple(self._heads)
        self._ort = ort
        self._shrink = arena_shrink_options() if device == "cpu" else None
        self.resident_states = (device == "cuda" if resident_states is None else resident_states) and encoder
        if self.resident_states:
            self._ort_device = "cuda" if device == "cuda" else "cpu"
            self._rows = ort.InferenceSession(row_selection_model().SerializeToString(), sess_options=options,
                                              providers=providers)

    def encode_resident(self, batch: dict[str, np.ndarray]) -> DeviceStates:
        """:meth:`encode`, with the states left on the device."""
        binding = self._encoder.io_binding()
        for name, array in encoder_feed(batch, self._encoder_inputs).items():
            binding.bind_cpu_input(name, array)
        binding.bind_output(self._encoder.get_outputs()[0].name, self._ort_device)
        self._encoder.run_with_iobinding(binding)
        return DeviceStates(self, binding.get_outputs()[0], batch["attention_mask"])

    def select_rows(self, states, rows, mask: np.ndarray):
        binding = self._rows.io_binding()
        binding.bind_ortvalue_input("states", states)
        binding.bind_cpu_input("rows", np.asarray(rows, dtype=np.int64))
        binding.bind_cpu_input("mask", mask)
        binding.bind_output("selected", self._ort_device)
        self._rows.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        feed = encoder_feed(batch, self._encoder_inputs)
        rows, width = feed["attention_mask"].shape
        big = self._shrink is not None and rows * width * width > ARENA_KEEP_CELLS
        return self._encoder.run(None, feed, self._shrink if big else None)[0]

    def head(self, task: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        if task not in self._heads:
            raise ValueError(f"this model has no {task!r} head; it has {list(self._heads)}")
        session = self._heads[task]
        if not any(isinstance(v, self._ort.OrtValue) for v in inputs.values()):
            feed = {k: np.ascontiguousarray(v, dtype=np.float32 if k.startswith("states") else np.int64)
                    for k, v in inputs.items()}
            return tuple(session.run(None, feed))
        binding = session.io_binding()  # states already on the device (encode_resident)
        for name, value in inputs.items():
            if isinstance(value, self._ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value, dtype=np.int64))
        for output in session.get_outputs():
            binding.bind_output(output.name)  # the heads' outputs are small: to the host
        session.run_with_iobinding(binding)
        return tuple(binding.copy_outputs_to_cpu())


def create(source: str | Path, *, variant: str = "fp32", threads: int | None = None, device: str | None = None,
           manifest: dict | None = None, spinning: bool = False, resident_states: bool | None = None,
           sparsegen: str = "auto", **_) -> OnnxRuntimeBackend:
    """The backend's factory in the registry (``serving.backends.create_backend`` passes every option)."""
    return OnnxRuntimeBackend(source, variant, threads=threads, device=device or "cpu", manifest=manifest,
                              spinning=spinning, resident_states=resident_states, sparsegen=sparsegen)


def check(device: str) -> None:
    """What must hold on ``device`` besides the import: on cuda, the CUDA execution provider."""
    ort_providers(device)
