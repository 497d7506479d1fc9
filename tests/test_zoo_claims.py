"""The statistics and bookkeeping of benchmarks/zoo_claims.py: the verdicts it prints are what the README reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import zoo_claims as zoo_claims_script
from benchmarks.common import intervals as bench_intervals


@pytest.fixture(scope="module")
def zoo_claims():
    return zoo_claims_script


def test_mean_and_welch_intervals_match_the_textbook():
    intervals = bench_intervals
    mean, var, half = intervals.mean_ci([1.0, 2.0, 3.0])
    assert (mean, var) == (2.0, 1.0) and half == pytest.approx(4.303 * math.sqrt(1 / 3))
    # equal variances and sizes: Welch's df = 2 (n - 1) = 4
    diff, dhalf = intervals.difference_ci([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])
    assert diff == 1.0 and dhalf == pytest.approx(2.776 * math.sqrt(2 / 3))
    assert intervals.t975(2.7) == 4.303  # df rounded down: the wider interval


def write(results: Path, claim: str, arm: str, scores: list[float]) -> None:
    for seed, score in enumerate(scores):
        path = results / claim / arm / f"seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"sentiment": {"accuracy": score}}))


def test_report_says_confirmed_refuted_or_unresolved_from_the_interval(zoo_claims, tmp_path):
    write(tmp_path, "ssaf_sst5", "baseline", [0.50, 0.51, 0.49])
    write(tmp_path, "ssaf_sst5", "ssaf_lambda-7", [0.55, 0.56, 0.54])
    write(tmp_path, "ssaf_sst5", "ssaf_lambda-5", [0.45, 0.46, 0.44])
    write(tmp_path, "ssaf_sst5", "ssaf_lambda-3", [0.50, 0.53, 0.48])
    write(tmp_path, "ssaf_sst5", "ssaf_lambda0", [0.52])
    rows = {line.split("|")[3].strip(): line for line in zoo_claims.report(tmp_path, ["ssaf_sst5"])[2:]}
    assert rows["ssaf_lambda-7"].rstrip(" |").endswith("confirmed")
    assert rows["ssaf_lambda-5"].rstrip(" |").endswith("refuted")
    assert rows["ssaf_lambda-3"].rstrip(" |").endswith("unresolved")
    assert "(one seed)" in rows["ssaf_lambda0"] and "confirmed" not in rows["ssaf_lambda0"]


def test_attention_guidance_claims_fine_tune_one_shared_pre_training_per_arm(zoo_claims):
    sst2, stsb = zoo_claims.CLAIMS["ag_sst2"], zoo_claims.CLAIMS["ag_stsb"]
    assert sst2.pretraining is stsb.pretraining is not None
    assert set(sst2.arms) == set(stsb.arms) == set(sst2.pretraining.arms) == {"baseline", "ag"}
    assert sst2.pretraining.arms["baseline"] == () and "--ag-weight" in sst2.pretraining.arms["ag"]
    assert "--random-init" in sst2.pretraining.options  # the paper's claim is about pre-training from scratch


def test_a_baseline_two_claims_share_is_trained_once(zoo_claims, tmp_path):
    write(tmp_path, "ssaf_sst5", "baseline", [0.49, 0.50])
    twin = zoo_claims.twin_result(tmp_path, "ssa_sst5", "baseline", 1)
    assert twin == tmp_path / "ssaf_sst5" / "baseline" / "seed1.json"
    assert zoo_claims.twin_result(tmp_path, "ssa_sst5", "baseline", 2) is None  # that seed has not run
    assert zoo_claims.twin_result(tmp_path, "ssa_sst5", "ssa", 0) is None  # the paper's arm is its own run
    write(tmp_path, "ag_sst2", "baseline", [0.80])
    assert zoo_claims.twin_result(tmp_path, "ag_sst2", "ag", 0) is None  # same fine-tuning, other pre-training
    assert zoo_claims.twin_result(tmp_path, "ag_stsb", "baseline", 0) is None  # same pre-training, other task


def test_a_claim_that_names_its_files_reads_those_alone(zoo_claims, tmp_path):
    data = tmp_path / "data"
    (data / "squad").mkdir(parents=True)
    for name in ("train-v1.1.first11.json", "train-v2.0.first10.json", "cs224n-dev-v2.0.json"):
        (data / "squad" / name).write_text("{}")
    (data / "ids-sst-train.csv").write_text("")
    claim = zoo_claims.CLAIMS["ssaf_squad"]
    view = Path(zoo_claims.claim_data(claim, "ssaf_squad", str(data), tmp_path / "out"))
    assert sorted(str(p.relative_to(view)) for p in view.rglob("*") if p.is_file()) == [
        "squad/cs224n-dev-v2.0.json", "squad/train-v1.1.first11.json"]
    assert zoo_claims.claim_data(claim, "ssaf_squad", str(data), tmp_path / "out") == str(view)  # again: no error
    assert zoo_claims.claim_data(zoo_claims.CLAIMS["ssaf_sst5"], "ssaf_sst5", str(data), tmp_path / "out") == str(data)
    (data / "squad" / "train-v1.1.first11.json").unlink()
    with pytest.raises(SystemExit, match="train-v1.1"):
        zoo_claims.claim_data(claim, "ssaf_squad", str(data), tmp_path / "out2")
