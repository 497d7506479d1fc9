"""Golden outputs every engine must meet: one fixed set of inputs covering the four tasks and Embed, the answers of a
tiny fixed-seed checkpoint stored in tests/data/golden_outputs.json (so a change that moves every engine alike, the
PyTorch reference included, is seen; regenerated only by ``python tests/data/make_golden.py``), and every engine this
machine has checked against them within its precision's bounds, through the server's own batch path
(``engine.run_batch``: one encoder pass for all tasks). Engines this machine lacks skip with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertzoo import tasks as T
from bertzoo.cpu import native_bf16
from bertzoo.export.exporter import ExportOptions, export_checkpoint
from bertzoo.serving.engine import EMBED, Work, prepare_inputs, run_batch
from bertzoo.tokenization import Tokenizer

SENTENCES = ["a gorgeous, witty film", "dull and lifeless from start to finish", "It is a movie.",
             "the best performances of the year, bar none"]
PAIRS = [("How do I learn Python quickly?", "What is the fastest way to learn Python?"),
         ("A man is playing a guitar.", "The stock market fell sharply today."),
         ("Two dogs run on the beach.", "Dogs are running along the shore.")]
QA = [("When was the tower finished?", "The Eiffel Tower in Paris was finished in 1889 for the World's Fair."),
      ("Who wrote the novel?", "The novel was written by Jane Austen and published in 1813.")]

# Per engine: how far its outputs may be from the fp32 PyTorch reference (head logits and scores, QA logits,
# unit-length embeddings). fp32 engines differ by float summation order only; int8 and fp16 move the states.
ATOL = {"fp32": 1e-4, "optimized": 1e-3, "int8": 0.25, "fp16": 0.05, "bf16": 0.05}


def works_for(tokenizer: Tokenizer) -> list[Work]:
    limits = T.Limits()
    sentences = T.encode_sentences(tokenizer, SENTENCES, limits)
    a, b = T.encode_pairs_separately(tokenizer, [p[0] for p in PAIRS], [p[1] for p in PAIRS], limits)
    works = [Work("sentiment", (e,)) for e in sentences]
    works += [Work(task, (x, y)) for task in ("paraphrase", "similarity") for x, y in zip(a, b, strict=True)]
    works += [Work("qa", tuple(T.encode_qa(tokenizer, q, c, limits))) for q, c in QA]
    return works + [Work(EMBED, (e,)) for e in sentences]


GOLDEN_FILE = Path(__file__).parent / "data" / "golden_outputs.json"
# How far this machine's PyTorch reference may be from the stored one: other CPUs sum floats in another order, in the
# 4 training steps too; a change to the model, the heads, tokenization or the batch path moves it by far more.
STORED_ATOL = 2e-4


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


@pytest.fixture(scope="module")
def golden(tiny_artifact, tmp_path_factory):
    """(run dir, artifact with every CPU variant, tokenizer, works, padded inputs, the stored golden outputs)."""
    run, _ = tiny_artifact
    artifact = tmp_path_factory.mktemp("golden") / "artifact"
    export_checkpoint(run, artifact, ExportOptions(optimize=True, int8=True, parity_limit=8))
    tokenizer = Tokenizer.from_file(artifact / "tokenizer.json")
    works = works_for(tokenizer)
    inputs = prepare_inputs(works, None, tokenizer.pad_id)
    stored = json.loads(GOLDEN_FILE.read_text())
    assert [entry["task"] for entry in stored["outputs"]] == [w.task for w in works], "regenerate: make_golden.py"
    return run, artifact, tokenizer, works, inputs, from_json(stored["outputs"])


def assert_close(works: list[Work], outputs: list, reference: list, atol: float, what: str) -> None:
    assert len(outputs) == len(reference)
    for work, got, want in zip(works, outputs, reference, strict=True):
        if work.task == "qa":  # (start logits, end logits), one array per window
            for got_side, want_side in zip(got, want, strict=True):
                for g, w in zip(got_side, want_side, strict=True):
                    np.testing.assert_allclose(g, w, atol=atol, rtol=0, err_msg=f"{what} qa")
        else:
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol, rtol=0,
                                       err_msg=f"{what} {work.task}")


def test_the_pytorch_reference_still_gives_the_stored_outputs(golden):
    run, _, _, works, inputs, stored = golden
    assert_close(works, reference_outputs(run, works, inputs), stored, STORED_ATOL, "the PyTorch reference")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _ort_has(provider: str) -> bool:
    import onnxruntime as ort

    return provider in ort.get_available_providers()


def build(engine: str, run, artifact):
    """The engine named ``engine``, or pytest.skip with the reason this machine cannot run it."""
    from bertzoo.serving.backends import OnnxRuntimeBackend, TensorRTWithOrtHeads

    kind, device, precision = engine.split("/")
    if device == "cuda" and not _has_cuda():
        pytest.skip("no CUDA GPU here")
    if kind == "torch":
        import torch

        from bertzoo.serving.backends import TorchBackend
        from bertzoo.trainer.checkpoint import load_model

        model, _, _ = load_model(run)
        return TorchBackend(model.to(device).eval(), torch.device(device), precision=precision)
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


ENGINES = ["torch/cpu/fp32", "onnxruntime/cpu/fp32", "onnxruntime/cpu/optimized", "onnxruntime/cpu/int8",
           "onnxruntime-resident/cpu/fp32", "openvino/cpu/fp32", "openvino/cpu/bf16",
           "torch/cuda/fp16", "onnxruntime/cuda/fp32", "tensorrt/cuda/fp16"]


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_meets_the_golden_outputs(golden, engine):
    run, artifact, _, works, inputs, reference = golden
    atol = ATOL[engine.split("/")[2]] + STORED_ATOL
    outputs = run_batch(build(engine, run, artifact), works, inputs, "mean")
    assert_close(works, outputs, reference, atol, engine)
    if engine.split("/")[2] in ("fp32", "optimized"):  # and the answers users see are the same
        sentiment = [i for i, w in enumerate(works) if w.task == "sentiment"]
        assert [int(np.argmax(outputs[i])) for i in sentiment] == [int(np.argmax(reference[i])) for i in sentiment]
