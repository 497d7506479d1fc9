"""Dynamic task prioritization (paper 004): the update math on hand-computed numbers, its state, and the trainer's
use of it (weights logged, changing, saved with the checkpoint and continued by --resume)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bertzoo.trainer import train as train_module
from bertzoo.trainer.batches import task_for_step
from bertzoo.trainer.prioritization import TaskPrioritizer, primary_scores
from conftest import interrupt_training

TASKS = ("a", "b", "c")


def test_update_follows_equation_8_with_smoothing_by_hand():
    p = TaskPrioritizer(TASKS, smoothing_start=0.9, smoothing_end=0.5)
    assert p.weights == pytest.approx([1 / 3] * 3)  # uniform start
    # gap = train score - dev score: 0.4, 0.1, 0.05 -> proposal 0.4/0.55, 0.1/0.55, 0.05/0.55.
    dev, train = {"a": 0.5, "b": 0.7, "c": 0.9}, {"a": 0.9, "b": 0.8, "c": 0.95}
    assert p.gaps(dev, train) == pytest.approx([0.4, 0.1, 0.05])
    assert p.proposal(dev, train) == pytest.approx([0.4 / 0.55, 0.1 / 0.55, 0.05 / 0.55])
    # progress 0: alpha = 0.9 of the proposal + 0.1 of the previous (uniform) weights.
    weights = p.update(dev, progress=0.0, reference=train)
    assert weights == pytest.approx([0.9 * 0.4 / 0.55 + 0.1 / 3, 0.9 * 0.1 / 0.55 + 0.1 / 3, 0.9 * 0.05 / 0.55 + 0.1 / 3])
    assert weights == pytest.approx([0.687879, 0.196970, 0.115152], abs=1e-6)
    # progress 1: alpha = 0.5; against the target 1.0 the gaps are 0.2, 0.5, 0.1 -> proposal 0.25, 0.625, 0.125.
    weights = p.update({"a": 0.8, "b": 0.5, "c": 0.9}, progress=1.0)
    assert weights == pytest.approx([0.5 * 0.25 + 0.5 * 0.687879, 0.5 * 0.625 + 0.5 * 0.196970,
                                     0.5 * 0.125 + 0.5 * 0.115152], abs=1e-6)
    assert sum(weights) == pytest.approx(1.0) and p.updates == 2


def test_smoothing_moves_linearly_between_its_endpoints():
    p = TaskPrioritizer(TASKS, smoothing_start=0.9, smoothing_end=0.5)
    assert p.smoothing(0.0) == pytest.approx(0.9) and p.smoothing(1.0) == pytest.approx(0.5)
    assert p.smoothing(0.5) == pytest.approx(0.7) and p.smoothing(0.25) == pytest.approx(0.8)
    assert p.smoothing(-1.0) == pytest.approx(0.9) and p.smoothing(3.0) == pytest.approx(0.5)  # clamped
    # alpha = 1 takes the proposal as it is; alpha = 0 never moves.
    scores = {"a": 0.2, "b": 0.6, "c": 0.6}
    assert TaskPrioritizer(TASKS, 1.0, 1.0).update(scores, 0.3) == pytest.approx([0.8 / 1.6, 0.4 / 1.6, 0.4 / 1.6])
    assert TaskPrioritizer(TASKS, 0.0, 0.0).update(scores, 0.3) == pytest.approx([1 / 3] * 3)
    with pytest.raises(ValueError, match="smoothing_start"):
        TaskPrioritizer(TASKS, smoothing_start=1.5)


def test_weights_are_normalised():
    p = TaskPrioritizer(TASKS, initial=[2.0, 1.0, 1.0])
    assert p.weights == pytest.approx([0.5, 0.25, 0.25])
    for progress in (0.0, 0.3, 0.9):
        assert sum(p.update({"a": 0.1, "b": 0.5, "c": 0.99}, progress)) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="positive"):
        TaskPrioritizer(TASKS, initial=[1.0, 0.0, 1.0])


def test_a_task_that_performs_worse_gets_more_weight():
    p = TaskPrioritizer(TASKS)
    train = {"a": 0.9, "b": 0.9, "c": 0.9}
    history = [p.update({"a": 0.4, "b": 0.6, "c": 0.8}, progress, train)[:] for progress in (0.0, 0.5, 1.0)]
    for weights in history:
        assert weights[0] > weights[1] > weights[2]
    assert history[-1][0] > history[0][0] > 1 / 3  # and it keeps gaining while it stays behind
    # The task that improves loses its priority.
    after = p.update({"a": 0.85, "b": 0.6, "c": 0.8}, 1.0, train)
    assert after[0] < history[-1][0] and after[1] > after[0]


def test_no_gap_keeps_a_small_share_and_nan_counts_as_zero():
    p = TaskPrioritizer(TASKS, smoothing_start=1.0, smoothing_end=1.0, min_gap=0.01)
    # Dev above train (no overfitting): the gap is floored, never zero or negative.
    gaps = p.gaps({"a": 0.9, "b": 0.5, "c": 0.7}, {"a": 0.8, "b": 0.7, "c": 0.7})
    assert gaps == pytest.approx([0.01, 0.2, 0.01])
    assert all(w > 0 for w in p.update({"a": 0.9, "b": 0.5, "c": 0.7}, 0.0, {"a": 0.8, "b": 0.7, "c": 0.7}))
    # Nowhere a gap: uniform.
    assert p.proposal({"a": 1.0, "b": 1.0, "c": 1.0}) == pytest.approx([1 / 3] * 3)
    # A NaN score (constant predictions' Pearson) is "nothing learned".
    assert p.gaps({"a": math.nan, "b": 0.5, "c": 0.5}) == pytest.approx([1.0, 0.5, 0.5])
    with pytest.raises(ValueError, match=r"no score for tasks \['c'\]"):
        p.update({"a": 0.5, "b": 0.5}, 0.5)


def test_state_round_trips_through_json():
    p = TaskPrioritizer(TASKS)
    p.update({"a": 0.3, "b": 0.6, "c": 0.7}, 0.2, {"a": 0.9, "b": 0.8, "c": 0.75})
    state = json.loads(json.dumps(p.state_dict()))
    q = TaskPrioritizer(TASKS)
    q.load_state_dict(state)
    assert q.weights == p.weights and q.updates == 1
    assert q.update({"a": 0.5, "b": 0.5, "c": 0.5}, 0.6) == p.update({"a": 0.5, "b": 0.5, "c": 0.5}, 0.6)
    with pytest.raises(ValueError, match="this run trains"):
        TaskPrioritizer(("a", "b")).load_state_dict(state)


def test_primary_scores_and_the_sampler_take_the_weights():
    metrics = {"sentiment": {"accuracy": 0.4, "n": 10.0}, "similarity": {"pearson": 0.7, "n": 10.0},
               "qa": {"f1": 55.0, "exact": 50.0}}
    assert primary_scores(metrics) == pytest.approx({"sentiment": 0.4, "similarity": 0.7, "qa": 0.55})
    drawn = [task_for_step(s, TASKS, [1, 1, 1], "dynamic", 100, 0, weights=[0.0, 0.0, 1.0]) for s in range(20)]
    assert set(drawn) == {"c"}


def _records(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "train_log.jsonl").read_text().splitlines()]


def test_dynamic_training_logs_changing_weights_and_saves_them(tiny_train_config, tmp_path):
    config = tiny_train_config(out_dir=str(tmp_path / "run"), sampling="dynamic", dtp_every=3, dtp_eval_limit=4,
                               eval_every_epoch=False, max_steps=12, limit_per_task=12)
    train_module.train(config)
    records = _records(tmp_path / "run")
    updates = [r for r in records if "dtp" in r]
    assert [r["step"] for r in updates] == [3, 6, 9]  # none at the last step: nothing would use it
    tasks = ["sentiment", "paraphrase", "similarity", "qa"]
    for r in updates:
        dtp = r["dtp"]
        assert list(dtp["weights"]) == tasks and sum(dtp["weights"].values()) == pytest.approx(1.0)
        assert set(dtp["dev"]) == set(dtp["train"]) == set(tasks)  # train - dev gap, dev loaded without eval
        assert all(0.0 <= s <= 1.0 or t == "similarity" for t, s in dtp["dev"].items())
    assert updates[0]["dtp"]["alpha"] == pytest.approx(0.9 + (0.5 - 0.9) * 3 / 12)
    logged = [tuple(r["task_weights"].values()) for r in records if "task_weights" in r]
    assert logged[0] == pytest.approx([0.25] * 4) and len(set(logged)) >= 3, "weights start uniform, then move"
    state = json.loads((tmp_path / "run" / "checkpoint-000012" / "trainer_state.json").read_text())
    assert state["prioritizer"]["weights"] == pytest.approx(list(updates[-1]["dtp"]["weights"].values()))
    assert state["prioritizer"]["updates"] == 3


def test_resume_continues_the_same_weights(tiny_train_config, tmp_path, monkeypatch):
    common = dict(tasks=("sentiment", "paraphrase", "similarity"), limit_per_task=12, epochs=2, sampling="dynamic",
                  dtp_every=4, dtp_eval_limit=4, eval_every_epoch=False)
    expected, _ = train_module.train(tiny_train_config(out_dir=str(tmp_path / "a"), **common))

    interrupted = tiny_train_config(out_dir=str(tmp_path / "b"), **common)
    # After the first epoch's checkpoint (step 9) and a re-weighting (step 12).
    interrupt_training(monkeypatch, interrupted, at_loss_call=13)
    assert (tmp_path / "b" / "LATEST").read_text() == "checkpoint-000009"
    resumed, _ = train_module.train(interrupted, resume=True)

    def final_weights(run: str) -> list[float]:
        return json.loads((tmp_path / run / "checkpoint-000018" / "trainer_state.json").read_text())["prioritizer"]
    assert final_weights("a") == final_weights("b")
    for name, tensor in expected.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), f"{name} differs after resume"
