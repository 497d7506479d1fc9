"""The no-answer threshold: fitted for a target unanswerable share, on articles held out of training, stored in the
checkpoint and used by evaluation."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace as NS

import pytest

from bertzoo.qa import best_null_threshold
from bertzoo.trainer import train as train_module
from bertzoo.trainer.calibration import hold_out_articles
from bertzoo.trainer.checkpoint import load_model, resolve_checkpoint
from bertzoo.trainer.training_data import load_training_data

# a and c answerable (and answered right), b and d unanswerable; margins in that order.
EXAMPLES = [NS(id="a", answers=("x",), is_impossible=False), NS(id="b", answers=(), is_impossible=True),
            NS(id="c", answers=("y",), is_impossible=False), NS(id="d", answers=(), is_impossible=True)]
TEXTS = {"a": "x", "b": "z", "c": "y", "d": "z"}
MARGINS = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 3.0}


def test_the_target_share_moves_the_best_threshold():
    # As they are (1/2 unanswerable), answering only a is best (3 of 4); if only 1/5 were unanswerable, answering
    # b as well to reach c pays: weights 1.6 per answerable and 0.4 per unanswerable question give
    # 0.8 (all "") -> 2.4 (a) -> 2.0 (b) -> 3.6 (c) -> 3.2 (d), so the threshold is c's margin and F1 3.6 / 4.
    assert best_null_threshold(TEXTS, MARGINS, EXAMPLES)["best_f1_threshold"] == 0.0
    assert best_null_threshold(TEXTS, MARGINS, EXAMPLES, unanswerable_share=0.5)["best_f1_threshold"] == 0.0
    shifted = best_null_threshold(TEXTS, MARGINS, EXAMPLES, unanswerable_share=0.2)
    assert shifted["best_f1_threshold"] == 2.0 and shifted["best_f1"] == pytest.approx(90.0)
    # Mostly unanswerable: still only a (0.4 per answerable, 1.6 per unanswerable).
    assert best_null_threshold(TEXTS, MARGINS, EXAMPLES, unanswerable_share=0.8)["best_f1_threshold"] == 0.0
    with pytest.raises(ValueError, match="unanswerable_share"):
        best_null_threshold(TEXTS, MARGINS, EXAMPLES, unanswerable_share=1.0)


def _question(title: str, impossible: bool) -> NS:
    return NS(title=title, is_impossible=impossible)


def test_hold_out_takes_the_articles_with_most_unanswerable_questions_but_never_the_last():
    data = ([_question("A", False)] * 3 + [_question("B", True)] * 2 + [_question("B", False)]
            + [_question("C", True)] * 4 + [_question("D", True)])
    kept, held = hold_out_articles(data, 1)
    assert {q.title for q in held} == {"C"} and len(kept) + len(held) == len(data)
    kept, held = hold_out_articles(data, 5)  # asks for all: D (the fewest) stays in training
    assert {q.title for q in held} == {"B", "C"} and {q.title for q in kept} == {"A", "D"}
    assert hold_out_articles(data, 0)[1] == []
    assert hold_out_articles([_question("A", False), _question("B", False)], 1)[1] == []  # SQuAD v1.1: nothing
    assert hold_out_articles([_question("A", True), _question("B", False)], 1)[1] == []  # the only one stays


def test_holding_out_fewer_articles_than_asked_says_so(caplog):
    data = [_question("B", True)] * 2 + [_question("C", True)] * 4
    with caplog.at_level("WARNING"):
        held = hold_out_articles(data, 3)[1]
    assert {q.title for q in held} == {"C"}
    assert "qa_calibration_articles is 3" in caplog.text and "1 held out" in caplog.text


def test_real_unanswerable_questions_repeat_and_the_synthetic_ones_do_not(tiny_train_config):
    def questions(repeat: int) -> list:
        config = tiny_train_config(tasks=("qa",), limit_per_task=None, qa_real_unanswerable_repeat=repeat)
        return load_training_data(config)[0]["qa"]

    once, thrice = questions(1), questions(3)
    real = {e.id for e in once if e.is_impossible and "-noans-" not in e.id}
    assert real and Counter(e.id for e in once).most_common(1)[0][1] == 1
    expected = Counter(e.id for e in once) + Counter({i: 2 for i in real})
    assert Counter(e.id for e in thrice) == expected, "only the real unanswerable ones repeat, synthetic ones do not"
    with pytest.raises(ValueError, match="qa_real_unanswerable_repeat"):
        tiny_train_config(qa_real_unanswerable_repeat=0)


def test_training_fits_the_threshold_on_held_out_articles_and_the_checkpoint_keeps_it(tiny_train_config):
    # The bundled SQuAD 2.0 sample has unanswerable questions in two articles; Spectre has the most.
    config = tiny_train_config(tasks=("qa",), limit_per_task=None, max_steps=4, qa_calibration_share=None)
    splits, held = load_training_data(config)
    assert held and {e.title for e in held} == {"Spectre_(2015_film)"}
    held_contexts = {e.context for e in held}
    assert not any(e.title == "Spectre_(2015_film)" or e.context in held_contexts for e in splits["qa"]), \
        "no training question (real or synthetic) may come from a held-out article"

    model, metrics = train_module.train(config)
    run = resolve_checkpoint(config.out_dir)
    records = [json.loads(line) for line in (run.parent / "train_log.jsonl").read_text().splitlines()]
    fitted = [r["qa_calibration"] for r in records if "qa_calibration" in r][-1]
    assert fitted["questions"] == len(held) and fitted["articles"] == ["Spectre_(2015_film)"]
    # Fitted on these very questions at their own share, the held-out F1 cannot get worse than at the old value.
    assert fitted["f1_at_threshold"] >= fitted["f1_at_previous"]
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["qa_null_threshold"] == fitted["threshold"] == model.config.qa_null_threshold
    reloaded, _, _ = load_model(config.out_dir)
    assert reloaded.config.qa_null_threshold == fitted["threshold"]
    assert metrics["qa"]["null_threshold"] == fitted["threshold"], "dev evaluation must use the fitted threshold"
