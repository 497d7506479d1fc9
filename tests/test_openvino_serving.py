"""`bertzoo serve --backend openvino`: the same answers as ONNX Runtime, what it runs reported by ModelInfo and the
build-info metric, its compiled-model cache, and one clear line where OpenVINO is missing or the settings cannot
work."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import bertzoo.cpu
from bertzoo.serving.backends import BackendUnavailable, check_available, openvino
from bertzoo.serving.client import BertzooClient
from bertzoo.serving.config import ServeConfig
from bertzoo.serving.grpc_server import ServerThread
from conftest import serve_config

TEXTS = ["a gorgeous, witty film", "dull and lifeless from start to finish"]
QA = [("When was the tower finished?", "The Eiffel Tower in Paris was finished in 1889 for the World's Fair.")]


def test_without_openvino_the_backend_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # as if not installed
    with pytest.raises(BackendUnavailable, match=r"bertzoo\[openvino\]"):
        check_available("openvino", "cpu")


@pytest.mark.parametrize(("settings", "message"), [
    ({"device": "cuda"}, "runs on the CPU"),
    ({"precision": "fp16"}, "fp32 or bf16"),
])
def test_settings_openvino_cannot_honour_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        ServeConfig("x", backend="openvino", **settings)


def test_auto_precision_is_bf16_only_where_the_cpu_computes_it(monkeypatch):
    monkeypatch.setattr(bertzoo.cpu, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert openvino.resolve_precision("auto") == "bf16"
    monkeypatch.setattr(bertzoo.cpu, "cpu_flags", lambda: {"avx2", "fma"})
    assert openvino.resolve_precision("auto") == "fp32"
    assert openvino.resolve_precision("bf16") == "bf16"  # asked for: given, even if emulated


def test_openvino_serves_the_answers_onnxruntime_serves(tiny_artifact, tmp_path):
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'bertzoo[openvino]')")
    _, artifact = tiny_artifact
    cache = tmp_path / "ov-cache"
    answers = {}
    for backend in ("onnxruntime", "openvino"):
        config = serve_config(artifact, backend=backend, openvino_cache_dir=str(cache))
        with ServerThread(config) as running, BertzooClient(f"127.0.0.1:{running.port}") as client:
            info = client.model_info()
            answers[backend] = (client.sentiment(TEXTS).results, client.qa(QA).results,
                                np.array([e.values for e in client.embed(TEXTS).embeddings]))
            build = running.metrics.registry.get_sample_value(
                "bertzoo_build_info", {"backend": backend, "device": "cpu", "precision": info.precision,
                                       "variant": info.variant, "version": info.runtime_versions["bertzoo"]})
        assert info.backend == backend and build == 1
        if backend == "openvino":
            assert info.precision == openvino.resolve_precision("auto") and info.variant == f"openvino_{info.precision}"
            assert "openvino" in info.runtime_versions
    assert any(cache.iterdir())  # compiled once, cached for the next start
    (ort_sentiment, ort_qa, ort_embed), (ov_sentiment, ov_qa, ov_embed) = answers["onnxruntime"], answers["openvino"]
    assert [r.label for r in ov_sentiment] == [r.label for r in ort_sentiment]
    np.testing.assert_allclose([p for r in ov_sentiment for p in r.probabilities],
                               [p for r in ort_sentiment for p in r.probabilities], atol=1e-4)
    assert [(a.answer, a.no_answer) for a in ov_qa] == [(a.answer, a.no_answer) for a in ort_qa]
    np.testing.assert_allclose(ov_embed, ort_embed, atol=1e-4)


def test_an_engine_that_misses_the_parity_bounds_never_serves(tiny_artifact, monkeypatch):
    """The start-up gate measures OpenVINO against the artifact's fp32 ONNX Runtime engine: with an encoder bound no
    engine can meet, loading stops with the measure that missed it."""
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'bertzoo[openvino]')")
    from bertzoo import parity_measures
    from bertzoo.serving.model import load_served_model
    from bertzoo.serving.startup_gate import BackendParityError

    _, artifact = tiny_artifact
    strict = parity_measures.Bounds(tensor_max_abs=0.0, same_class=0.5, pearson_delta=1.0, f1_delta=100.0)
    monkeypatch.setitem(parity_measures.BOUNDS, "fp32", strict)
    with pytest.raises(BackendParityError, match=r"openvino fp32 does not reproduce .*encoder max abs diff"):
        load_served_model(serve_config(artifact, backend="openvino", precision="fp32"))


def test_an_engine_on_part_of_the_cores_is_not_pinned(monkeypatch, tiny_artifact, tmp_path):
    monkeypatch.setattr(openvino.os, "cpu_count", lambda: 4)
    assert openvino.compile_config("fp32", None)["ENABLE_CPU_PINNING"] is True  # the whole machine: pinned
    assert openvino.compile_config("fp32", 4)["ENABLE_CPU_PINNING"] is True
    # one of --instances 2: unpinned (pinned, both engines would run on the same first cores)
    assert openvino.compile_config("bf16", 2)["ENABLE_CPU_PINNING"] is False
    assert openvino.compile_config("bf16", 2)["INFERENCE_PRECISION_HINT"] == "bf16"
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'bertzoo[openvino]')")
    _, artifact = tiny_artifact
    backend = openvino.OpenVinoBackend(artifact, "fp32", threads=1, cache_dir=tmp_path)  # OpenVINO takes the setting
    assert backend.encode(_one_batch()).shape[0] == 1


def _one_batch() -> dict:
    import numpy as np

    ids = np.array([[101, 2023, 102]], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def test_the_engine_keeps_a_bounded_number_of_shapes(tiny_artifact):
    """OpenVINO's CPU plugin keeps what it prepared for each input shape; its default of 5,000 shapes let a server's
    engine grow by megabytes for every new (rows, width). The engine compiles with the cap, and the plugin takes it."""
    ov = pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'bertzoo[openvino]')")
    _, artifact = tiny_artifact
    config = openvino.compile_config("fp32", 1)
    assert config["CPU_RUNTIME_CACHE_CAPACITY"] == openvino.RUNTIME_CACHE_SHAPES <= 256
    ov.Core().compile_model(str(artifact / "encoder.onnx"), "CPU", config)  # a property it lacks would raise
    with pytest.raises(RuntimeError, match="CPU_RUNTIME_CACHE_CAPACITYX"):
        ov.Core().compile_model(str(artifact / "encoder.onnx"), "CPU", {"CPU_RUNTIME_CACHE_CAPACITYX": 1})


@pytest.mark.parametrize("users", [None, "512"])
def test_the_engine_bounds_onednn_kernels_unless_the_user_did(tiny_artifact, tmp_path, users):
    """oneDNN's cache of JIT kernels, read once from the environment when the plugin builds its first kernel, grew an
    engine under hostile traffic at its default size: the backend sets a smaller one before OpenVINO loads, and keeps a
    user's own. In a fresh process, as the engine process is one."""
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'bertzoo[openvino]')")
    _, artifact = tiny_artifact
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    if users:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = users
    script = ("import os; from bertzoo.serving.backends.openvino import OpenVinoBackend;"
              f"OpenVinoBackend({str(artifact)!r}, precision='fp32', threads=1, cache_dir={str(tmp_path)!r});"
              "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == (users or str(openvino.PRIMITIVE_CACHE_CAPACITY))


def test_engines_built_side_by_side_keep_the_process_locale_and_the_model_cache(tiny_artifact, tmp_path, caplog):
    """A server builds its engine instances at once on their worker threads. OpenVINO's compile sets the locale to "C"
    while it runs, and two at once put back each other's "C" (Python's text files would then be ASCII-only); a shared
    probe file made one instance find the cache "not writable"."""
    import locale
    import threading

    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'bertzoo[openvino]')")
    _, artifact = tiny_artifact
    before = locale.setlocale(locale.LC_ALL)
    for attempt in range(4):  # the race lost 5 of 6 such attempts without the fix
        cache = tmp_path / f"cache-{attempt}"
        builders = [threading.Thread(target=openvino.OpenVinoBackend, args=(artifact,),
                                     kwargs={"precision": "fp32", "threads": 1, "cache_dir": cache})
                    for _ in range(3)]
        for builder in builders:
            builder.start()
        for builder in builders:
            builder.join()
        assert locale.setlocale(locale.LC_ALL) == before, f"attempt {attempt}"
    assert "not writable" not in caplog.text
