"""benchmarks/precision_agreement.py: every task measured for every candidate engine the artifact and machine allow,
with the parity gates' measures."""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks import precision_agreement as precision_agreement_script
from bertzoo.datafiles import samples_dir


def test_report_has_every_task_and_candidate(tiny_artifact, tmp_path, capsys):
    _, artifact = tiny_artifact
    bench = precision_agreement_script
    out = tmp_path / "agreement.json"
    report = bench.main([str(artifact), "--data", str(samples_dir()), "--limit", "6", "--threads", "1",
                         "--openvino-cache", str(tmp_path / "ov"), "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["reference"] == "onnxruntime/fp32" and report["commit"] and "cpu_flags" in report
    manifest = json.loads((artifact / "manifest.json").read_text())
    tasks = set(manifest["model"]["tasks"])
    assert tasks == {"sentiment", "paraphrase", "similarity", "qa"} == set(report["examples"])
    assert all(0 < n <= 6 for n in report["examples"].values())
    expected = {("onnxruntime", v) for v in manifest["graphs"]["encoder"]["files"] if v != "fp32"}
    if importlib.util.find_spec("openvino") is not None:
        expected.add(("openvino", "fp32"))
    rows = {(r["engine"], r["precision"]): r for r in report["rows"]}
    assert expected <= set(rows), report["left_out"]
    if not rows:
        pytest.skip("no candidate engine here: the tiny artifact has fp32 only, and OpenVINO is not installed")
    for row in rows.values():
        assert set(row["tasks"]) == tasks
        assert row["tensor_max_abs"]["encoder"] >= 0.0
        for task in ("sentiment", "paraphrase"):
            result = row["tasks"][task]
            assert 0.0 <= result["same_class"] <= 1.0
            assert result["same_class_low"] <= result["same_class"] <= result["same_class_high"] + 1e-9  # float sums
        assert row["tasks"]["similarity"]["pearson_delta"] >= 0.0 and row["tasks"]["qa"]["f1_delta"] >= 0.0
        qa = row["tasks"]["qa"]  # the answerable questions' F1 too, where the sample has any
        assert "HasAns_f1_delta" not in qa or qa["HasAns_f1_delta"] == abs(qa["HasAns_f1_exported"]
                                                                             - qa["HasAns_f1_reference"])
        assert isinstance(row["failures"], list) and isinstance(row["fp32_level_failures"], list)
    printed = capsys.readouterr().out
    assert all(f"{engine}/{precision}" in printed for engine, precision in rows)
