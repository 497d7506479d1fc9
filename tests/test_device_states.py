"""Encoder states left on the backend's device (ONNX Runtime I/O binding) between the encoder and the heads give the
same answers as the host path. On a GPU this saves two transfers per batch; here the same code runs with the states
bound to the CPU device, which checks the selection graph and the bindings (tests/test_gpu.py runs it on CUDA)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from bertzoo import tasks as T
from bertzoo.datafiles import load_split, samples_dir
from bertzoo.serving.backends import DeviceStates, OnnxRuntimeBackend
from bertzoo.serving.engine import EMBED, HostStates, Work, prepare_inputs, run_batch
from bertzoo.tokenization import Tokenizer


@pytest.fixture(scope="module")
def mixed_batch(tiny_artifact):
    """Works of every task in one encoder batch, sequences of different lengths."""
    _, artifact = tiny_artifact
    tokenizer = Tokenizer.from_file(artifact / "tokenizer.json")
    limits = T.Limits()
    sentences = [e.text for e in load_split(samples_dir(), "sentiment", "dev")[:4]]
    pairs = load_split(samples_dir(), "similarity", "dev")[:3]
    questions = load_split(samples_dir(), "qa", "dev")[:2]
    a, b = T.encode_pairs_separately(tokenizer, [p.text_a for p in pairs], [p.text_b for p in pairs], limits)
    works = [Work("sentiment", (e,)) for e in T.encode_sentences(tokenizer, sentences, limits)]
    works += [Work(task, (x, y)) for task in ("paraphrase", "similarity") for x, y in zip(a, b, strict=True)]
    works += [Work("qa", tuple(T.encode_qa(tokenizer, q.question, q.context, limits))) for q in questions]
    works += [Work(EMBED, (e,)) for e in T.encode_sentences(tokenizer, sentences[:2], limits)]
    return artifact, works, prepare_inputs(works, None, tokenizer.pad_id)


def test_selected_rows_equal_on_the_device_and_on_the_host(mixed_batch):
    artifact, _, inputs = mixed_batch
    backend = OnnxRuntimeBackend(artifact, threads=1, resident_states=True)
    on_device = backend.encode_resident(inputs)
    on_host = HostStates(backend.encode(inputs), inputs["attention_mask"])
    assert isinstance(on_device, DeviceStates)
    rows = [5, 0, 3]
    selected, mask = on_device.select(rows)
    assert isinstance(selected, ort.OrtValue)  # stays a device value until a head takes it
    want_states, want_mask = on_host.select(rows)
    np.testing.assert_array_equal(mask, want_mask)
    np.testing.assert_array_equal(selected.numpy(), want_states)
    lengths = inputs["attention_mask"][rows].sum(axis=1)
    assert want_states.shape[1] == lengths.max() and not want_states[1, lengths[1]:].any()  # zero past the end


def test_run_batch_answers_the_same_with_resident_states(mixed_batch):
    artifact, works, inputs = mixed_batch
    resident = run_batch(OnnxRuntimeBackend(artifact, threads=1, resident_states=True), works, inputs, "mean")
    host = run_batch(OnnxRuntimeBackend(artifact, threads=1), works, inputs, "mean")
    assert len(resident) == len(host) == len(works)
    for work, got, want in zip(works, resident, host, strict=True):
        if work.task == "qa":
            for got_side, want_side in zip(got, want, strict=True):
                for g, w in zip(got_side, want_side, strict=True):
                    np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
        else:
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-6)


def test_resident_states_are_the_default_on_cuda_only(tiny_artifact):
    _, artifact = tiny_artifact
    assert not OnnxRuntimeBackend(artifact, threads=1).resident_states
