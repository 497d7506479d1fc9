"""What the golden-output test pins, in one place for the test (tests/test_engine_golden.py) and the script that
regenerates its outputs and measures the engines' spread (tests/data/make_golden.py): a checkpoint whose weights are
the same bits on every machine, fixed inputs for the four tasks and Embed, the engines by name, and their outputs
seen as named arrays (deviations) and as the answers users see (decisions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bertzoo import tasks as T
from bertzoo.cpu import native_bf16
from bertzoo.serving.engine import EMBED, Work, run_batch
from bertzoo.tokenization import Tokenizer

GOLDEN_FILE = Path(__file__).parent / "data" / "golden_outputs.json"
GOLDEN_SEED = 27  # of seeds 1-40, one whose every decision is >= 0.26 from flipping, sentiment classes varied

SENTENCES = ["a gorgeous, witty film", "dull and lifeless from start to finish", "It is a movie.",
             "the best performances of the year, bar none"]
PAIRS = [("How do I learn Python quickly?", "What is the fastest way to learn Python?"),
         ("A man is playing a guitar.", "The stock market fell sharply today."),
         ("Two dogs run on the beach.", "Dogs are running along the shore.")]
QA = [("When was the tower finished?", "The Eiffel Tower in Paris was finished in 1889 for the World's Fair."),
      ("Who wrote the novel?", "The novel was written by Jane Austen and published in 1813.")]

ENGINES = ["torch/cpu/fp32", "torch-resident/cpu/fp32", "onnxruntime/cpu/fp32", "onnxruntime/cpu/optimized",
           "onnxruntime/cpu/int8", "onnxruntime-resident/cpu/fp32", "openvino/cpu/fp32", "openvino/cpu/bf16",
           "torch/cuda/fp16", "onnxruntime/cuda/fp32", "tensorrt/cuda/fp16"]

# The outputs by kind: what a tolerance is set for (tests/test_engine_golden.py's TOLERANCES).
OUTPUT_KINDS = ("sentiment", "paraphrase", "similarity", "qa_start", "qa_end", "embed")


def write_golden_checkpoint(out_dir: Path) -> None:
    """The checkpoint the golden outputs are of: the tiny encoder of the serving tests with every parameter drawn by
    numpy's PCG64 from GOLDEN_SEED, never trained. A trained fixture carries the float summation order of the CPU
    that trained it into its weights (4 AdamW steps moved every QA logit by 5e-4 between an AMD and an Intel CPU);
    integer draws scaled by float multiplies and adds, each rounded once, give the same bits on every machine.
    Linear and embedding weights are uniform within 1/sqrt(fan-in) (3/sqrt(fan-in) for the task heads, so that the
    answers users see are apart by more than any engine's error), norms' gains 1 +- 0.2, biases +- 0.1."""
    import torch

    from bertzoo.trainer.checkpoint import save_checkpoint
    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.train import build_model
    from conftest import TINY_ENCODER

    config = TrainConfig(out_dir=str(out_dir), random_init=True, encoder_overrides=dict(TINY_ENCODER),
                         qa_max_length=128, qa_doc_stride=32, progress=False)
    model, tokenizer = build_model(config)
    rng = np.random.Generator(np.random.PCG64(GOLDEN_SEED))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2:
                bound, centre = (3.0 if name.startswith("heads.") else 1.0) / np.sqrt(parameter.shape[-1]), 0.0
            else:
                bound, centre = (0.2, 1.0) if "LayerNorm.weight" in name else (0.1, 0.0)
            unit = rng.random(tuple(parameter.shape), dtype=np.float32) * np.float32(2) - np.float32(1)
            parameter.copy_(torch.from_numpy(unit * np.float32(bound) + np.float32(centre)))
    out_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(out_dir, 0, model, config.to_dict(), tokenizer.to_str(), None, None, {"step": 0}, is_best=True)


def works_for(tokenizer: Tokenizer) -> list[Work]:
    limits = T.Limits()
    sentences = T.encode_sentences(tokenizer, SENTENCES, limits)
    a, b = T.encode_pairs_separately(tokenizer, [p[0] for p in PAIRS], [p[1] for p in PAIRS], limits)
    works = [Work("sentiment", (e,)) for e in sentences]
    works += [Work(task, (x, y)) for task in ("paraphrase", "similarity") for x, y in zip(a, b, strict=True)]
    works += [Work("qa", tuple(T.encode_qa(tokenizer, q, c, limits))) for q, c in QA]
    return works + [Work(EMBED, (e,)) for e in sentences]


def reference_outputs(run: Path, works: list[Work], inputs: dict) -> list:
    """The fp32 PyTorch model's outputs for ``works``, through the server's batch path."""
    from bertzoo.serving.backends import TorchBackend
    from bertzoo.trainer.checkpoint import load_model

    model, _, _ = load_model(run)
    return run_batch(TorchBackend(model.float().eval()), works, inputs, "mean")


def to_json(works: list[Work], outputs: list) -> list:
    """Outputs as JSON values, one per work: a QA work's (start logits, end logits) per window, else a list or number."""
    def plain(x):
        return np.asarray(x, dtype=np.float64).round(7).tolist()

    return [{"task": w.task, "start": [plain(a) for a in out[0]], "end": [plain(a) for a in out[1]]}
            if w.task == "qa" else {"task": w.task, "value": plain(out)} for w, out in zip(works, outputs, strict=True)]


def from_json(stored: list) -> list:
    return [([np.asarray(a) for a in entry["start"]], [np.asarray(a) for a in entry["end"]]) if entry["task"] == "qa"
            else np.asarray(entry["value"]) for entry in stored]


def by_kind(works: list[Work], outputs: list) -> dict[str, list[np.ndarray]]:
    """Each output kind's arrays, in work order (a QA window's start and end logits are one array each)."""
    kinds: dict[str, list[np.ndarray]] = {kind: [] for kind in OUTPUT_KINDS}
    for work, out in zip(works, outputs, strict=True):
        if work.task == "qa":
            kinds["qa_start"] += [np.asarray(a, dtype=np.float64) for a in out[0]]
            kinds["qa_end"] += [np.asarray(a, dtype=np.float64) for a in out[1]]
        else:
            kinds[work.task].append(np.atleast_1d(np.asarray(out, dtype=np.float64)))
    return kinds


def deviations(works: list[Work], outputs: list, reference: list) -> dict[str, dict[str, float]]:
    """Per output kind: the largest absolute difference from ``reference`` and the largest relative one (to the
    reference's largest magnitude of that array, so values near zero do not blow it up)."""
    got, want = by_kind(works, outputs), by_kind(works, reference)
    spread = {}
    for kind in OUTPUT_KINDS:
        pairs = list(zip(got[kind], want[kind], strict=True))
        assert all(g.shape == w.shape for g, w in pairs), f"{kind}: shapes differ"
        spread[kind] = {"abs": max(float(np.max(np.abs(g - w))) for g, w in pairs),
                        "rel": max(float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-12)) for g, w in pairs)}
    return spread


def decisions(works: list[Work], outputs: list) -> dict[str, list[int]]:
    """The answers users see: the sentiment class, the paraphrase verdict (logit > 0), and each QA window's start
    and end token. Similarity and Embed are scores, held by their tolerances alone."""
    kinds = by_kind(works, outputs)
    return {"sentiment": [int(np.argmax(a)) for a in kinds["sentiment"]],
            "paraphrase": [int(a[0] > 0) for a in kinds["paraphrase"]],
            "qa_start": [int(np.argmax(a)) for a in kinds["qa_start"]],
            "qa_end": [int(np.argmax(a)) for a in kinds["qa_end"]]}


def margins(works: list[Work], outputs: list) -> dict[str, float]:
    """How far each decision is from flipping, at its closest: top-1 minus top-2 logit, or the paraphrase logit's
    distance from 0."""
    def gap(a: np.ndarray) -> float:
        top = np.sort(a)[-2:]
        return float(top[1] - top[0])

    kinds = by_kind(works, outputs)
    return {"sentiment": min(gap(a) for a in kinds["sentiment"]),
            "paraphrase": min(abs(float(a[0])) for a in kinds["paraphrase"]),
            "qa_start": min(gap(a) for a in kinds["qa_start"]), "qa_end": min(gap(a) for a in kinds["qa_end"])}


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _ort_has(provider: str) -> bool:
    import onnxruntime as ort

    return provider in ort.get_available_providers()


def build(engine: str, run: Path, artifact: Path):
    """The engine named ``engine`` ("kind/device/precision"), or pytest.skip with the reason this machine cannot run
    it."""
    from bertzoo.export.exporter import ExportOptions, export_checkpoint
    from bertzoo.serving.backends import OnnxRuntimeBackend, TensorRTWithOrtHeads

    kind, device, precision = engine.split("/")
    if device == "cuda" and not _has_cuda():
        pytest.skip("no CUDA GPU here")
    if kind in ("torch", "torch-resident"):  # resident: the states stay on the device for the heads (CUDA's default)
        import torch

        from bertzoo.serving.backends import TorchBackend
        from bertzoo.trainer.checkpoint import load_model

        model, _, _ = load_model(run)
        return TorchBackend(model.to(device).eval(), torch.device(device), precision=precision,
                            resident_states=kind == "torch-resident" or None)
    if kind == "onnxruntime-resident":
        return OnnxRuntimeBackend(artifact, precision, threads=1, device=device, resident_states=True)
    if kind == "onnxruntime":
        if device == "cuda" and not _ort_has("CUDAExecutionProvider"):
            pytest.skip("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
        return OnnxRuntimeBackend(artifact, precision, threads=1, device=device)
    if kind == "openvino":
        pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'bertzoo[openvino]')")
        from bertzoo.serving.backends import OpenVinoBackend

        if precision == "bf16" and not native_bf16():
            pytest.skip("this CPU has no native bf16 (AVX-512 BF16 or AMX)")
        return OpenVinoBackend(artifact, precision, threads=1)
    if kind == "tensorrt":
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            pytest.skip("the tensorrt package is not installed")
        from bertzoo.artifact import load_manifest

        engine_artifact = artifact.with_name("artifact-trt")  # an engine is built on the GPU that runs it
        if not engine_artifact.exists():
            export_checkpoint(run, engine_artifact, ExportOptions(trt=True, parity_limit=8))
        return TensorRTWithOrtHeads.from_artifact(engine_artifact, load_manifest(engine_artifact))
    raise ValueError(engine)
