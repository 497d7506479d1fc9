"""The OpenVINO backend (CPU): the artifact's fp32 ONNX encoder compiled by OpenVINO at an inference precision of
fp32 or bf16, with OpenVINO's model cache so a restart does not compile again; the heads on ONNX Runtime (small, and
float32 on every backend). openvino is imported when one is made (:func:`create`, its entry in
``serving.backends.BACKENDS``; ``pip install 'bertzoo[openvino]'``). Since it compiles the artifact itself, the server
gates it against the artifact's fp32 ONNX Runtime encoder before it reports ready (``serving/startup_gate.py``)."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from bertzoo.artifact import load_manifest
from bertzoo.cpu import native_bf16

from .base import BackendUnavailable, encoder_feed
from .ort import OnnxRuntimeBackend

log = logging.getLogger("bertzoo.serving")

PRECISIONS = ("auto", "fp32", "bf16")
# OpenVINO's names for them (ov::hint::inference_precision)
OV_PRECISION = {"fp32": "f32", "bf16": "bf16"}
INSTALL_HINT = "pip install 'bertzoo[openvino]'"
# OpenVINO's compile_model sets the process's locale to "C" while it runs and then puts back the one it found. Two
# compiles at once (the server builds its engine instances side by side) put back each other's "C": Python's text files
# then default to ASCII for the rest of the process (5 of 6 tries of 3 concurrent compiles did). One at a time.
_COMPILE_LOCK = threading.Lock()


def resolve_precision(precision: str) -> str:
    """``auto``: bf16 where the CPU computes it natively, fp32 elsewhere."""
    if precision not in PRECISIONS:
        raise ValueError(f"the openvino backend's precision is one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return "bf16" if native_bf16() else "fp32"  # emulated bf16 is slower than fp32
    return precision


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertzoo" / "openvino"


# Input shapes whose prepared kernels and buffers OpenVINO's CPU plugin keeps (least recently used out). Its default,
# 5,000, let an engine grow by megabytes for every new (rows, width) a server meets, and a server meets thousands (up
# to 64 rows x 48 widths); with 64 the engine stays flat, at the same speed on the shapes that recur (figures:
# benchmarks/RESULTS.md, "Reliability").
RUNTIME_CACHE_SHAPES = 64
# oneDNN's JIT kernels (primitives) the CPU plugin keeps, process-wide, least recently used out: with its default of
# 1,024 an engine kept growing under hostile traffic after its largest batch, with 256 it held nearly flat at the same
# speed on recurring shapes (benchmarks/RESULTS.md, "Reliability"). A user's own ONEDNN_PRIMITIVE_CACHE_CAPACITY wins;
# oneDNN reads it once, when the plugin first builds a kernel.
PRIMITIVE_CACHE_CAPACITY = 256


def compile_config(precision: str, threads: int | None) -> dict:
    """OpenVINO's CPU settings for one engine on ``threads`` threads (None: every core). An engine on fewer threads
    than the machine has cores is one of several (``serve --instances``) and runs unpinned: OpenVINO pins each
    compiled model's threads to the same first cores, so two one-thread engines shared one core and together ran
    at the speed of one."""
    cores = os.cpu_count() or 1
    threads = threads or cores
    return {"INFERENCE_PRECISION_HINT": OV_PRECISION[precision], "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads, "ENABLE_CPU_PINNING": threads >= cores,
            "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_SHAPES}


class OpenVinoBackend:
    """``encode`` on OpenVINO, ``head`` on ONNX Runtime. Not thread-safe (one infer request): the server gives each
    lane's worker its own engine."""

    def __init__(self, directory: str | Path, precision: str = "auto", threads: int | None = None,
                 manifest: dict | None = None, cache_dir: str | Path | None = None) -> None:
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(PRIMITIVE_CACHE_CAPACITY))
        try:
            import openvino as ov
        except ImportError as e:
            raise BackendUnavailable(f"the openvino backend needs OpenVINO ({e}): {INSTALL_HINT}") from e
        directory = Path(directory)
        self.manifest = manifest if manifest is not None else load_manifest(directory)
        self.asked_precision = precision
        self.precision = resolve_precision(precision)
        self.variant = f"openvino_{self.precision}"
        core = ov.Core()
        self.cache_dir = _usable_cache_dir(cache_dir)
        if self.cache_dir is not None:
            core.set_property({"CACHE_DIR": str(self.cache_dir)})
        encoder = directory / self.manifest["graphs"]["encoder"]["files"]["fp32"]
        config = compile_config(self.precision, threads)
        try:
            ssaf = self.manifest["model"]["encoder"].get("attention") == "sparsegen_lin"
            with _COMPILE_LOCK:
                compiled = core.compile_model(_readable(core, encoder, ssaf), "CPU", config)
        except RuntimeError as e:  # e.g. an operator OpenVINO's ONNX reader does not know
            raise BackendUnavailable(f"OpenVINO {ov.__version__} cannot compile {encoder}: {str(e).splitlines()[0]}; "
                                     "serve it with --backend onnxruntime") from e
        self._request = compiled.create_infer_request()
        self._inputs = [name for p in compiled.inputs for name in p.get_names()]
        self._heads = OnnxRuntimeBackend(directory, threads=threads, manifest=self.manifest, encoder=False)
        self.tasks = self._heads.tasks
        self.version = ov.__version__

    def describe(self) -> str:
        """One line for the server's log: version, inference precision and why, model cache."""
        why = "asked for" if self.asked_precision != "auto" else "auto: " + (
            "the CPU computes bf16 natively" if self.precision == "bf16" else "no native bf16 on this CPU")
        return (f"openvino {self.version}: inference precision {self.precision} ({why}), model cache "
                f"{self.cache_dir or 'off'}")

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        self._request.infer(encoder_feed(batch, self._inputs))
        # A copy: the request's output buffer is reused by its next call.
        return np.array(self._request.get_output_tensor(0).data, dtype=np.float32)

    def head(self, task: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        return self._heads.head(task, inputs)


def _readable(core, path: Path, ssaf: bool):
    """The encoder as OpenVINO can read it. An SSAF encoder's SparsegenLin is a model-local function of our own
    domain, for which OpenVINO's ONNX reader has no rule (it does not expand functions): its body, made of standard
    operators, goes in its place (tests/test_export.py checks the result against PyTorch). Other encoders are read
    from the file as they are, without parsing it here first."""
    if not ssaf:
        return str(path)
    import onnx
    import onnx.inliner

    model = onnx.inliner.inline_local_functions(onnx.load(str(path)))
    return core.read_model(model.SerializeToString())


def _usable_cache_dir(cache_dir: str | Path | None) -> Path | None:
    """The model cache directory, created if needed; None (compile at every start) where it cannot be written, e.g.
    a read-only container filesystem without a cache volume."""
    path = Path(cache_dir) if cache_dir else default_cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        # A probe file of this call's own: engine instances are built side by side, and one shared name was
        # removed by one instance under another's feet ("not writable", and that instance compiled uncached).
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        log.warning("OpenVINO model cache off: %s is not writable (%s); set --openvino-cache-dir", path, e)
        return None
    return path


def create(source: str | Path, *, precision: str = "auto", threads: int | None = None, manifest: dict | None = None,
           cache_dir: str | Path | None = None, **_) -> OpenVinoBackend:
    """The backend's factory in the registry."""
    return OpenVinoBackend(source, precision, threads=threads, manifest=manifest, cache_dir=cache_dir)
