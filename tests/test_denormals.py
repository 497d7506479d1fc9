"""The engines' threads flush denormal floats to zero (bertzoo.cpu.flush_denormals): per thread, on the server's
engine threads only, and with the same outputs."""

from __future__ import annotations

import threading

import numpy as np

from bertzoo.cpu import flush_denormals, mxcsr, set_flush_denormals
from bertzoo.serving.backends import create_backend
from bertzoo.serving.engine import Work, prepare_inputs, run_batch
from bertzoo.serving.workers import model_worker
from bertzoo.tokenization import Tokenizer

# x86-64 Linux (every machine the project's CI and servers run on) has the MXCSR; elsewhere nothing changes.
SUPPORTED = mxcsr() is not None


def in_fresh_thread(function):
    """``function()``'s result in a new thread that starts with flushing off (the test's own thread may flush: an
    earlier test ran ONNX Runtime on it, and a thread inherits its creator's mode)."""
    result = []

    def run() -> None:
        set_flush_denormals(False)
        result.append(function())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return result[0]


def flushes() -> bool:
    """Whether the calling thread's arithmetic turns a denormal result into zero."""
    return float(np.float32(np.finfo(np.float32).tiny) * np.float32(0.5)) == 0.0


def test_a_thread_flushes_once_it_asks():
    def ask() -> tuple[bool, bool, bool, bool]:
        before = flushes()
        asked = flush_denormals()
        return before, asked, flushes(), flush_denormals()

    before, asked, after, again = in_fresh_thread(ask)
    assert not before
    assert asked is SUPPORTED and after is SUPPORTED and again is SUPPORTED


def test_turned_off_the_next_ask_turns_it_on_again():
    def off_then_ask() -> tuple[bool, bool, bool]:
        flush_denormals()
        set_flush_denormals(False)
        off = flushes()
        return off, flush_denormals(), flushes()

    off, asked, after = in_fresh_thread(off_then_ask)
    assert not off and asked is SUPPORTED and after is SUPPORTED


def test_an_engine_thread_flushes_and_running_a_backend_elsewhere_leaves_its_thread_alone(tiny_artifact):
    _, artifact = tiny_artifact
    tokenizer = Tokenizer.from_file(artifact / "tokenizer.json")
    works = [Work("sentiment", (encoding,)) for encoding in tokenizer.encode_sentences(["a gripping film", "dull"], 128)]
    inputs = prepare_inputs(works, None, tokenizer.pad_id)

    def run_here() -> tuple[bool, list]:
        outputs = run_batch(create_backend("onnxruntime", artifact, threads=1), works, inputs, "mean")
        return flushes(), outputs

    flushing, outputs = in_fresh_thread(run_here)
    assert not flushing, "a backend (and ONNX Runtime's sessions) must not change the mode of a thread not its own"
    worker = model_worker("main")  # the server builds and runs its engines on these
    try:
        flushing, served = worker.submit(run_here).result()
    finally:
        worker.shutdown()
    assert flushing is SUPPORTED
    for got, want in zip(served, outputs, strict=True):  # no output moves
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
