"""`serve --backend auto` on the CPU chooses by measurement (serving/engine_choice.py): every eligible engine timed on
the artifact's own model, the fastest served, the choice cached per machine and artifact; a stale cache measured
again; a candidate short of fp32-level agreement never chosen; a failed measurement falls back to the flag rules."""

from __future__ import annotations

import json
import logging

import pytest

from bertzoo.export.exporter import ExportOptions, export_checkpoint
from bertzoo.serving import engine_choice
from bertzoo.serving.engine_choice import Candidate, choose
from conftest import serve_config


@pytest.fixture(scope="module")
def artifact(tiny_artifact, tmp_path_factory):
    """The tiny model exported with every CPU encoder (fp32, optimized, int8)."""
    run, _ = tiny_artifact
    directory = tmp_path_factory.mktemp("choice") / "artifact"
    export_checkpoint(run, directory, ExportOptions(optimize=True, int8=True, parity_limit=8))
    return directory


def rates(table: dict[tuple[str, str], float], calls: list):
    """A timer that answers from ``table`` ((backend, precision or variant) -> sentences/s) and records each call."""
    def timer(candidate: Candidate, _batches) -> float:
        calls.append(candidate)
        return table.get((candidate.backend, candidate.precision), table.get((candidate.backend, candidate.variant),
                                                                             1.0))
    return timer


def test_the_engines_are_measured_the_fastest_chosen_and_the_choice_cached(artifact, tmp_path, monkeypatch):
    monkeypatch.setattr(engine_choice, "SECONDS_PER_CANDIDATE", 0.2)
    first = choose(artifact, threads=2, cache_dir=tmp_path)
    assert first.source.startswith("measured in")
    measured = [row for row in first.rows if row.sentences_per_s is not None]
    assert measured and first.chosen == max(measured, key=lambda r: r.sentences_per_s).candidate
    assert {row.candidate.variant for row in first.rows if row.candidate.backend == "onnxruntime"} == {
        "fp32", "optimized", "int8"}  # every encoder the artifact holds has a row, measured or with its reason
    assert any(line.endswith("<- chosen") for line in first.table())

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured although the cache holds the choice")

    monkeypatch.setattr(engine_choice, "measure_all", no_measuring)
    again = choose(artifact, threads=2, cache_dir=tmp_path)
    assert again.source.startswith("cached in") and again.chosen == first.chosen and again.table() == first.table()


@pytest.mark.parametrize("stale", ["cpu", "versions", "artifact", "cores"])
def test_a_stale_cache_is_measured_again(artifact, tmp_path, stale):
    calls: list = []
    choose(artifact, threads=2, cache_dir=tmp_path, timer=rates({}, calls), gate=lambda precision: "")
    assert calls
    (cached,) = tmp_path.glob("*.json")
    record = json.loads(cached.read_text())
    record["key"][stale] = "another" if stale != "versions" else {"onnxruntime": "0.1"}
    cached.write_text(json.dumps(record))
    calls.clear()
    choice = choose(artifact, threads=2, cache_dir=tmp_path, timer=rates({}, calls), gate=lambda precision: "")
    assert calls and choice.source.startswith("measured")
    calls.clear()
    choose(artifact, threads=2, cache_dir=tmp_path, retune=True, timer=rates({}, calls), gate=lambda precision: "")
    assert calls  # --retune measures even when the cache holds


def test_a_candidate_short_of_fp32_level_agreement_is_never_chosen(artifact, tmp_path, monkeypatch):
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'bertzoo[openvino]')")
    monkeypatch.setattr(engine_choice, "native_bf16", lambda: True)
    calls: list = []
    fastest_first = {("openvino", "bf16"): 900.0, ("onnxruntime", "int8"): 800.0, ("onnxruntime", "optimized"): 300.0}
    missed = "sentiment: same class for 98.44% of 128 items (95% upper bound 99.36%) < 99.5%"
    choice = choose(artifact, threads=2, cache_dir=tmp_path, timer=rates(fastest_first, calls),
                    gate=lambda precision: missed if precision == "bf16" else "")
    timed = {(c.backend, c.precision) for c in calls}
    assert ("openvino", "bf16") not in timed and choice.chosen.precision != "bf16"
    bf16 = next(row for row in choice.rows if row.candidate.precision == "bf16")
    assert bf16.sentences_per_s is None and missed in bf16.note
    # the tiny model's int8 misses fp32's task bounds in its export parity report: listed, never timed nor chosen
    int8 = next(row for row in choice.rows if row.candidate.variant == "int8")
    if "misses fp32's task bounds" in int8.note:
        assert ("onnxruntime", "int8") not in timed and choice.chosen.variant != "int8"
    assert choice.chosen == max((r for r in choice.rows if r.sentences_per_s), key=lambda r: r.sentences_per_s).candidate


def test_a_failed_measurement_falls_back_to_the_flag_rules_in_one_line(artifact, tmp_path, caplog):
    def broken(candidate, _batches):
        raise RuntimeError("the engine crashed")

    with caplog.at_level(logging.WARNING, logger="bertzoo.serving"):
        choice = choose(artifact, threads=2, cache_dir=tmp_path, timer=broken, gate=lambda precision: "")
    rule = engine_choice.rule_choice(artifact, 2, None)
    assert choice.chosen == rule.chosen and choice.source == "the flag rules"
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("measuring the engines failed (no engine could be measured") and "the flag rules" in line
    assert not list(tmp_path.glob("*.json"))  # nothing cached: the next start measures again


def test_a_forced_instance_count_is_the_only_layout_measured(artifact, tmp_path):
    calls: list = []
    choice = choose(artifact, threads=2, instances=1, cache_dir=tmp_path, timer=rates({}, calls), gate=lambda precision: "")
    assert {c.instances for c in calls} == {1} and choice.chosen.instances == 1


def test_serve_auto_serves_the_choice_and_model_info_shows_its_table(artifact, tmp_path, monkeypatch):
    from bertzoo.cli_serve import _resolve_auto
    from bertzoo.serving.client import BertzooClient
    from bertzoo.serving.grpc_server import ServerThread

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(engine_choice, "SECONDS_PER_CANDIDATE", 0.2)
    options = {"model_dir": str(artifact), "backend": "auto", "variant": "auto", "device": "cpu", "threads": 2,
               "instances": "auto", "frontends": "auto", "engines": "auto", "precision": "auto"}
    _resolve_auto(options)
    assert (tmp_path / "bertzoo" / "engine-choice").is_dir()
    chosen = [line for line in options["engine_choice"] if line.endswith("<- chosen")]
    assert len(chosen) == 1 and chosen[0].startswith(f"{options['backend']} ")
    settings = {k: v for k, v in options.items() if k not in ("model_dir", "threads")}
    with ServerThread(serve_config(artifact, **settings)) as running, \
            BertzooClient(f"127.0.0.1:{running.port}") as client:
        info = client.model_info()
    assert list(info.engine_choice) == list(options["engine_choice"]) and info.backend == options["backend"]


def test_an_engine_whose_gate_cannot_run_is_a_row_not_a_failed_start(artifact, tmp_path):
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'bertzoo[openvino]')")

    def cannot_compile(precision: str) -> str:
        raise RuntimeError(f"OpenVINO cannot compile the encoder in {precision}")

    calls: list = []
    choice = choose(artifact, threads=2, cache_dir=tmp_path, timer=rates({}, calls), gate=cannot_compile)
    assert choice.source.startswith("measured") and choice.chosen.backend == "onnxruntime"
    openvino_rows = [row for row in choice.rows if row.candidate.backend == "openvino"]
    assert openvino_rows and all(row.sentences_per_s is None and row.note.startswith(("failed: OpenVINO cannot",
                                                                                       "this CPU has no native"))
                                 for row in openvino_rows)
    assert all(c.backend == "onnxruntime" for c in calls)
