"""benchmarks/serve_goals.py: each ratio is taken within its round, and a goal's line is counted on its own side."""

from __future__ import annotations

import pytest

from benchmarks import serve_goals as serve_goals_script


@pytest.fixture(scope="module")
def serve_goals():
    return serve_goals_script


def a_round(fp32: float, ceiling: float, int8: float, peer: float, p50: float, p99: float) -> dict:
    return {"fp32": {"items_per_s": fp32, "ceiling": ceiling, "half_saturation": {"p50_ms": p50, "p99_ms": p99}},
            "int8": {"items_per_s": int8, "ceiling": 2 * ceiling}, "peer": {"items_per_s": peer}}


def test_ratios_pair_each_round_with_itself(serve_goals):
    # the peer's rate swings between the rounds; a ratio of means would hide that fp32 kept 2x in both
    rounds = [a_round(200, 250, 450, 100, 10, 20), a_round(300, 330, 600, 150, 12, 48)]
    values = serve_goals.ratios(rounds, ["fp32", "int8"])
    assert values["fp32 / peer"] == [2.0, 2.0]
    assert values["fp32 of ceiling"] == pytest.approx([0.8, 300 / 330])
    assert values["int8 of ceiling"] == pytest.approx([0.9, 600 / 660])
    assert values["int8 / peer"] == [4.5, 4.0]
    assert values["p99/p50 at half saturation"] == [2.0, 4.0]


def test_the_report_counts_rounds_on_the_goals_side_of_its_line(serve_goals, capsys):
    serve_goals.report({"fp32 of ceiling": [0.85, 0.84, 0.9], "p99/p50 at half saturation": [3.0, 3.1, 2.0]})
    lines = {line.split(" | ")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["| fp32 of ceiling"].endswith("| >= 0.85 | 2 of 3 |")  # at the line meets it
    assert lines["| p99/p50 at half saturation"].endswith("| <= 3 | 2 of 3 |")  # a tail ratio meets it below


def test_each_ratio_is_held_against_its_own_goal(serve_goals):
    assert serve_goals.goal("optimized of ceiling") == (0.85, True)
    assert serve_goals.goal("optimized / peer") == (2.0, True)  # fp32 against the peer's fp32
    assert serve_goals.goal("int8 / peer") == (3.0, True)
    assert serve_goals.goal("p99/p50 at half saturation") == (3.0, False)
