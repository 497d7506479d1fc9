"""``bertzoo export``: checkpoint -> artifact directory (ONNX graphs, optional optimized / int8 / TensorRT variants,
Triton repository, tokenizer, manifest with hashes and the parity report).

Everything is written into a temporary sibling directory and renamed into place at the end, so an export that fails
(a parity gate, a crash) never leaves a half-written artifact where the server would look.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from bertzoo.artifact import sha256_file, write_json_atomic, write_manifest
from bertzoo.atomic import atomic_directory
from bertzoo.tasks import task_spec
from bertzoo.tokenization import Tokenizer
from bertzoo.trainer.checkpoint import TOKENIZER, WEIGHTS, load_model
from bertzoo.trainer.config import TrainConfig

from . import gates, onnx_graphs, ort_tools

log = logging.getLogger("bertzoo.export")

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 384)
DEFAULT_BATCH_SIZES = (1, 8, 32, 64)

# What to do when a variant misses its parity gate. int8 moves some models' states further than its bounds allow (an
# SSAF model trained on the bundled samples, much further than a softmax one: benchmarks/RESULTS.md, "Export parity
# and speed"); an fp32 graph that misses is the export's fault.
PARITY_ADVICE = {
    "int8": "int8 moves this model's outputs past its bounds: export without --int8",
    "optimized": "ONNX Runtime's fusions move this model's outputs past its bounds: export without --optimize",
    "fp32": "the exported graph does not reproduce the model, which is a bug in bertzoo: please report it, with the "
            "full report",
}


@dataclass
class ExportOptions:
    optimize: bool = False
    int8: bool = False
    trt: bool = False
    triton: bool = False
    hf: bool = False  # a Hugging Face model directory, hf/ (export/hf.py)
    sign_key: str | None = None  # Ed25519 private key (PEM): sign the manifest (manifest.sig)
    per_channel: bool = True
    data_dir: str | None = None  # dev data for the task-level parity gates (default: the bundled samples)
    parity_limit: int = 200  # dev examples per task for the parity gates
    seq_buckets: tuple[int, ...] = DEFAULT_BUCKETS
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    force: bool = False  # replace an existing artifact directory
    progress: bool = False  # progress bars for the parity gates (on a terminal)


class ExportError(RuntimeError):
    pass


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript
    import torch

    import bertzoo

    return {"bertzoo": bertzoo.__version__, "torch": torch.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "onnxscript": onnxscript.__version__,
            "python": platform.python_version()}


def _parity_splits(train_config: TrainConfig, options: ExportOptions) -> dict[str, list]:
    from bertzoo.trainer.training_data import load_splits

    config = dataclasses.replace(train_config, data_dir=options.data_dir)
    return load_splits(config, "dev", options.parity_limit)


def export_checkpoint(checkpoint: str | Path, out: str | Path, options: ExportOptions) -> dict:
    """Export and verify; returns the manifest. Raises ExportError / ParityError without touching ``out``."""
    out = Path(out)
    if out.exists() and not options.force:
        raise ExportError(f"{out} exists; pass --force to replace it")
    if options.trt:
        from .tensorrt import require_tensorrt

        require_tensorrt()  # fail in a second with what to install, not after minutes of export
    model, saved, source = load_model(checkpoint)
    model = model.float().eval()
    if options.hf:
        from .hf import check_exportable

        check_exportable(model)
    train_config = TrainConfig.from_dict(saved["train"])
    tokenizer = Tokenizer.from_file(source / TOKENIZER)
    limits = train_config.limits
    buckets = tuple(b for b in options.seq_buckets if b < limits.qa_max_length) + (limits.qa_max_length,)
    with atomic_directory(out, shareable=True) as work:
        manifest = _export_into(work, out, model, train_config, tokenizer, source, buckets, options)
    # A report of an earlier failed attempt no longer describes OUT.
    out.with_name(f"{out.name}.parity-failed.json").unlink(missing_ok=True)
    log.info("artifact written to %s", out)
    return manifest


def _export_into(work: Path, out: Path, model, train_config: TrainConfig, tokenizer: Tokenizer, source: Path,
                 buckets: tuple[int, ...], options: ExportOptions) -> dict:
    from bertzoo.serving.backends import OnnxRuntimeBackend, TensorRTBackend, TensorRTWithOrtHeads, create_backend

    enc = model.config.encoder
    specs = onnx_graphs.export_graphs(model, work)
    shutil.copyfile(source / TOKENIZER, work / TOKENIZER)
    graphs = {"encoder": {"files": {"fp32": specs["encoder"].file}, "inputs": list(specs["encoder"].inputs),
                          "outputs": list(specs["encoder"].outputs)}}
    for task in model.heads:
        graphs[task] = {"files": {"fp32": specs[task].file}, "inputs": list(specs[task].inputs),
                        "outputs": list(specs[task].outputs)}
    reports: dict[str, dict] = {}
    if options.optimize:
        reports["optimize"] = ort_tools.optimize(work / "encoder.onnx", work / "encoder.opt.onnx",
                                                 enc.num_attention_heads, enc.hidden_size)
        graphs["encoder"]["files"]["optimized"] = "encoder.opt.onnx"
    if options.int8:
        # Quantize the fused graph when there is one: quantization after fusion is what ORT recommends.
        src = "encoder.opt.onnx" if options.optimize else "encoder.onnx"
        reports["int8"] = ort_tools.quantize_int8(work / src, work / "encoder.int8.onnx", options.per_channel)
        graphs["encoder"]["files"]["int8"] = "encoder.int8.onnx"
    if options.trt or options.triton:
        # TensorRT's profiles and Triton's batcher work on a leading batch axis: they get the encoder on the padded
        # grid. Listed as variants of their own, so the parity gates below measure them like the rest.
        padded = onnx_graphs.export_padded_encoder(model, work).file
        graphs["encoder"]["files"]["padded_fp32"] = padded
        if options.int8 and options.triton:
            reports["padded_int8"] = ort_tools.quantize_int8(work / padded, work / "encoder.padded.int8.onnx",
                                                             options.per_channel)
            if enc.attention != "sparsegen_lin":  # baking would inline the SparsegenLin op, which Triton may load
                # Triton loads it at ONNX Runtime's basic level (triton_repo), which alone would not fuse the int8
                # MatMuls: they are fused here, once.
                reports["padded_int8"]["baked"] = ort_tools.bake_cpu_graph(work / "encoder.padded.int8.onnx",
                                                                           work / "encoder.padded.int8.onnx")
            graphs["encoder"]["files"]["padded_int8"] = "encoder.padded.int8.onnx"

    splits = _parity_splits(train_config, options)
    draft = {"graphs": graphs}
    parity_reports = {}
    for variant in graphs["encoder"]["files"]:
        backend = create_backend("onnxruntime", work, variant=variant, manifest=draft)
        try:
            precision = variant.removeprefix("padded_")  # the padded graphs face their own precision's bounds
            parity_reports[variant] = gates.check(model, backend, precision, splits, tokenizer,
                                                    train_config.limits, options.progress)
        except gates.ParityError as e:
            failed = out.with_name(f"{out.name}.parity-failed.json")
            write_json_atomic(failed, {**parity_reports, variant: e.report})
            raise ExportError(f"{e}; {PARITY_ADVICE[variant.removeprefix('padded_')]}; "
                              f"nothing was written to {out} (full report: {failed})") from e
        log.info("parity %s: passed (encoder max abs diff %.2e)", variant,
                 parity_reports[variant]["tensor_max_abs"]["encoder"])

    if options.trt:
        from . import tensorrt

        trt_dir = work / "tensorrt"
        trt_dir.mkdir()
        reports["tensorrt"] = tensorrt.build_engine(
            work / graphs["encoder"]["files"]["padded_fp32"], trt_dir / "encoder.fp16.plan",
            batch_sizes=options.batch_sizes, seq_buckets=buckets,
            fp16=True, timing_cache_path=trt_dir / "timing.cache")
        graphs["encoder"]["files"]["tensorrt_fp16"] = "tensorrt/encoder.fp16.plan"
        # The engine faces the same gates, at fp16 bounds: encoder on TensorRT, heads on ONNX Runtime as served.
        engine_backend = TensorRTWithOrtHeads(TensorRTBackend(trt_dir / "encoder.fp16.plan"),
                                              OnnxRuntimeBackend(work, "fp32", manifest=draft, encoder=False))
        parity_reports["tensorrt_fp16"] = gates.check(model, engine_backend, "fp16", splits, tokenizer,
                                                       train_config.limits, options.progress)
    sentiment = task_spec("sentiment", train_config.sentiment_dataset)
    labels = {"sentiment": list(sentiment.labels), "paraphrase": ["not_duplicate", "duplicate"]}
    if options.triton:
        from . import triton_repo

        # An SSAF engine needs our Python plugin at run time, which Triton's tensorrt backend cannot load: such an
        # encoder stays on Triton's onnxruntime backend, which runs the SparsegenLin function body.
        ssaf = enc.attention == "sparsegen_lin"
        engine = work / graphs["encoder"]["files"]["tensorrt_fp16"] if options.trt and not ssaf else None
        files = {k: v["files"]["fp32"] for k, v in graphs.items()}
        files["encoder"] = graphs["encoder"]["files"]["padded_fp32"]
        if "padded_int8" in graphs["encoder"]["files"]:
            files["encoder_int8"] = graphs["encoder"]["files"]["padded_int8"]
        reports["triton"] = triton_repo.write_repository(work, files, engine=engine)
        triton_repo.write_text_model(work / "triton", work, {
            "model": {"tasks": list(model.heads), "pooling": model.config.pooling,
                      "qa_null_threshold": model.config.qa_null_threshold},
            "limits": dataclasses.asdict(train_config.limits), "labels": labels,
            "graphs": {name: {"inputs": list(onnx_graphs.ENCODER_PADDED.inputs) if name == "encoder" else g["inputs"],
                              "outputs": g["outputs"]} for name, g in graphs.items()}},
            max_batch_size=triton_repo.CPU_TEXT_BATCH if engine is None else 64)
        reports["triton"]["bertzoo"] = "python"
    if options.hf:
        from . import hf

        # The backbone's pooler only where the encoder started from the backbone's weights.
        pooler = None if train_config.random_init else hf.backbone_pooler(train_config.backbone, enc.hidden_size)
        reports["hf"] = {"files": hf.write_hf(model, tokenizer, source / TOKENIZER, work / "hf",
                                              train_config.max_seq_length, labels, pooler)}
    manifest = {
        "model": {"tasks": list(model.heads), "encoder": enc.to_dict(), "pooling": model.config.pooling,
                  "similarity_head": model.config.similarity_head, "qa_null_threshold": model.config.qa_null_threshold},
        "labels": labels,
        "limits": dataclasses.asdict(train_config.limits),
        "tokenizer": TOKENIZER,
        "length_buckets": list(buckets),
        "batch_sizes": list(options.batch_sizes),
        "graphs": graphs,
        "hidden_size": enc.hidden_size,
        "source_checkpoint": {"path": str(source), "weights_sha256": sha256_file(source / WEIGHTS)},
        "versions": _versions(),
        "reports": reports,
        "parity": parity_reports,
    }
    return write_manifest(work, manifest, sign_key=options.sign_key)
