"""Inference backends behind the one small interface of ``bertzoo.pipeline.Backend`` (encode + head, numpy in and out).

- :class:`OnnxRuntimeBackend`: the exported graphs on ONNX Runtime (CPU; CUDA / TensorRT execution providers where
  installed). Torch-free.
- The PyTorch reference backend is ``bertzoo.trainer.evaluate.TorchBackend`` (imports torch).
- TensorRT engines: ``bertzoo.export.tensorrt.TensorRTBackend`` (needs tensorrt and a GPU).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bertzoo.artifact import ArtifactError, load_manifest

VARIANTS = ("fp32", "optimized", "int8")


def session_options(threads: int | None = None, spinning: bool = False):
    """ORT settings: all graph optimizations; ``threads`` intra-op threads (default: all cores) and one inter-op
    thread (our graphs are sequential). Spinning keeps worker threads hot between the ops of one batch: lower latency
    for a process that has the cores to itself (a benchmark), but a server shares them with gRPC and the tokenizer,
    where spinning cost 28% of throughput (RESULTS.md), so it is off unless asked for."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or os.cpu_count() or 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return options


def available_providers(preferred: tuple[str, ...] = ("CUDAExecutionProvider", "CPUExecutionProvider")) -> list[str]:
    import onnxruntime as ort

    have = set(ort.get_available_providers())
    return [p for p in preferred if p in have] or ["CPUExecutionProvider"]


class OnnxRuntimeBackend:
    """The artifact's encoder (in the chosen variant) and head graphs, each an ORT session."""

    def __init__(self, directory: str | Path, variant: str = "fp32", threads: int | None = None,
                 providers: list[str] | None = None, manifest: dict | None = None, spinning: bool = False) -> None:
        import onnx
        import onnxruntime as ort

        from bertzoo.export import ort_kernel

        directory = Path(directory)
        self.manifest = manifest if manifest is not None else load_manifest(directory)
        graphs = self.manifest["graphs"]
        encoders = graphs["encoder"]["files"]
        if variant not in encoders:
            raise ArtifactError(f"{directory}: no {variant!r} encoder in this artifact (it has {sorted(encoders)}); "
                                "export with --optimize / --int8 to add one")
        self.variant = variant
        options = session_options(threads, spinning)
        providers = providers or available_providers()

        files = {"encoder": encoders[variant]}
        files.update({task: spec["files"]["fp32"] for task, spec in graphs.items() if task != "encoder"})
        # An SSAF graph's SparsegenLin runs on our native kernel where it can, else on the formulation that is fast
        # on ORT (same result; export/ort_kernel, export/sparsegen_onnx.py). The files on disk stay as exported.
        models, self.native_sparsegen = ort_kernel.prepare(
            {name: onnx.load(str(directory / file)) for name, file in files.items()}, options, providers)
        sessions = {name: ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=providers)
                    for name, model in models.items()}
        self._encoder = sessions.pop("encoder")
        self._heads = sessions
        self.tasks = tuple(self._heads)

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        feed = {k: np.ascontiguousarray(batch[k], dtype=np.int64)
                for k in ("input_ids", "attention_mask", "token_type_ids")}
        return self._encoder.run(None, feed)[0]

    def head(self, task: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        if task not in self._heads:
            raise ValueError(f"this model has no {task!r} head; it has {list(self._heads)}")
        feed = {k: np.ascontiguousarray(v, dtype=np.float32 if k.startswith("states") else np.int64)
                for k, v in inputs.items()}
        return tuple(self._heads[task].run(None, feed))
