"""benchmarks/squad_calibration.py's split of a SQuAD 2.0 score into the reader and the abstainer."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import squad_calibration as squad_calibration_script


@pytest.fixture(scope="module")
def calibration():
    return squad_calibration_script


# Two unanswerable questions (a, b) and two answerable ones (c, d); b and c share a null margin.
EXAMPLES = [SimpleNamespace(id=i, is_impossible=i in "ab") for i in "abcd"]
MARGINS = {"a": 3.0, "b": 1.0, "c": 1.0, "d": 0.0}
FORCED = {"HasAns_f1": 60.0, "HasAns_exact": 50.0}
ANSWERED_F1 = np.array([0.0, 0.0, 100.0, 20.0])  # each question's F1 when answered with its forced span


def test_roc_auc_counts_ordered_pairs_and_half_of_ties(calibration):
    report = calibration.answerability(EXAMPLES, MARGINS, FORCED, ANSWERED_F1)
    # (a, c), (a, d), (b, d) in order, (b, c) tied: 3.5 of 4 pairs
    assert report["null_margin_roc_auc"] == pytest.approx(0.875)
    assert report["f1_with_a_perfect_abstainer"] == pytest.approx((2 * 60.0 + 2 * 100.0) / 4)


def test_best_f1_under_a_has_answer_floor(calibration):
    report = calibration.answerability(EXAMPLES, MARGINS, FORCED, ANSWERED_F1)
    # Answering d alone gives F1 55 but HasAns F1 10; answering b, c, d (threshold 1) gives F1 55 and HasAns F1 60.
    assert report["best_f1_with_HasAns_f1_at_least_50"] == {"f1": pytest.approx(55.0), "HasAns_f1": pytest.approx(60.0),
                                                          "answered": 3}


def test_a_cut_between_equal_margins_is_no_threshold(calibration):
    # x (answerable) and y (unanswerable) share a margin: answering x but not y would score 100, no threshold does it.
    examples = [SimpleNamespace(id=i, is_impossible=i == "y") for i in "xyz"]
    report = calibration.answerability(examples, {"x": 1.0, "y": 1.0, "z": 0.0}, FORCED, np.array([100.0, 0.0, 100.0]),
                                       60.0)
    assert report["best_f1_with_HasAns_f1_at_least_60"] == {"f1": pytest.approx(200 / 3), "HasAns_f1": 100.0,
                                                          "answered": 3}
