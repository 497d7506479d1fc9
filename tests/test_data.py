"""Tests for the torch-free data readers (bertzoo.data) and the file layout (bertzoo.datafiles)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bertzoo.data import (
    DataError,
    QAExample,
    read_cs224n_pairs,
    read_cs224n_sentiment,
    read_glue_sst2,
    read_squad,
    read_squad_files,
)
from bertzoo.datafiles import SENTIMENT_DATASETS, TASKS, find_files, load_split, patterns

SAMPLES = Path(__file__).resolve().parents[1] / "core" / "samples"
V11_SAMPLE = Path(__file__).resolve().parent / "data" / "squad-v1.1-sample.json"
SHARED = Path("/work/shared/data")

SST_HEADER = "\tid\tsentence\tsentiment\n"
PAIR_HEADER = "\tid\tsentence1\tsentence2\t{}\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


# ---------------------------------------------------------------- samples


@pytest.mark.parametrize(
    ("task", "dataset", "split", "expected"),
    [
        ("sentiment", "sst5", "train", 240),
        ("sentiment", "sst5", "dev", 80),
        ("sentiment", "cfimdb", "train", 40),
        ("sentiment", "cfimdb", "dev", 20),
        ("sentiment", "sst2", "train", 60),
        ("sentiment", "sst2", "dev", 30),
        ("paraphrase", "sst5", "train", 200),
        ("paraphrase", "sst5", "dev", 58),
        ("similarity", "sst5", "train", 200),
        ("similarity", "sst5", "dev", 60),
        ("qa", "sst5", "train", 122),
        ("qa", "sst5", "dev", 61),
    ],
)
def test_samples_load_with_expected_counts(task: str, dataset: str, split: str, expected: int) -> None:
    skipped: list[str] = []
    examples = load_split(SAMPLES, task, split, dataset, skipped=skipped)
    assert len(examples) == expected
    assert skipped == []  # a run on the samples warns of no malformed row
    assert len({e.id for e in examples}) == expected


def test_sample_sentiment_labels_and_whitespace() -> None:
    sst = load_split(SAMPLES, "sentiment", "train", "sst5")
    assert {e.label for e in sst} == set(range(5))
    # The CS224N files carry a leading space and GLUE a trailing one; both must be stripped.
    glue = load_split(SAMPLES, "sentiment", "dev", "sst2")
    for e in [*sst, *glue]:
        assert e.text == e.text.strip() and e.text
    assert glue[0].id == "dev-0"
    assert {e.label for e in glue} == {0, 1}


def test_sample_pairs_labels_in_range() -> None:
    sts = load_split(SAMPLES, "similarity", "train")
    assert all(0.0 <= e.label <= 5.0 for e in sts)
    assert len({e.label for e in sts}) > 10  # real float scores, not binarised
    quora = load_split(SAMPLES, "paraphrase", "train")
    assert {e.label for e in quora} == {0.0, 1.0}


def test_sample_squad_has_both_kinds_and_valid_offsets() -> None:
    for split in ("train", "dev"):
        qa = load_split(SAMPLES, "qa", split)
        impossible = [e for e in qa if e.is_impossible]
        assert impossible and len(impossible) < len(qa)
        assert all(not e.answers and not e.answer_starts for e in impossible)
        for e in qa:
            for text, start in zip(e.answers, e.answer_starts, strict=True):
                assert e.context[start : start + len(text)] == text
    # Dev keeps all reference answers (up to 3-4 per question).
    assert max(len(e.answers) for e in load_split(SAMPLES, "qa", "dev")) >= 3


# ---------------------------------------------------------------- CSV readers


def test_malformed_quora_rows_skipped_with_file_and_line(caplog: pytest.LogCaptureFixture) -> None:
    path = Path(__file__).parent / "data" / "quora-dev-damaged.csv"  # quora-dev.csv's 2 damaged rows, as upstream
    skipped: list[str] = []
    with caplog.at_level(logging.DEBUG, logger="bertzoo.data"):
        pairs = read_cs224n_pairs(path, "is_duplicate", skipped=skipped)
    # Find the physical lines of the two damaged rows independently of the reader.
    lines = path.read_text(encoding="utf-8").splitlines()
    expected = [n for n, line in enumerate(lines, 1) if line.split("\t")[0] in ("65479", "264614")]
    assert len(expected) == 2
    assert skipped == [f"{path}:{n}: empty is_duplicate" for n in expected]
    assert [r.getMessage() for r in caplog.records] == skipped
    assert not {"ad118c967d683c93883bf072d", "9054345d02cd6c5642a4904dc"} & {p.id for p in pairs}


def test_bad_rows_are_skipped_and_counted(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "ids-sst-x.csv",
        SST_HEADER
        + "0\ta\t good film\t4\n"
        + "1\tb\t too few fields\n"
        + "2\tc\t bad label\tfour\n"
        + "3\td\t out of range\t5\n"
        + "4\te\t empty label\t\n"
        + '5\tf\t "quoted\ttab"\t1\n'
        + "6\tg\t   \t1\n"
        + "7\th\t negative\t-1\n",
    )
    skipped: list[str] = []
    out = read_cs224n_sentiment(p, num_labels=5, skipped=skipped)
    assert [(e.id, e.text, e.label) for e in out] == [("a", "good film", 4)]
    assert [s.split(": ", 1)[0] for s in skipped] == [f"{p}:{n}" for n in (3, 4, 5, 6, 7, 8, 9)]
    assert "expected 4 fields, got 3" in skipped[0]
    assert "'four' is not an integer" in skipped[1]
    assert "5 is not in 0..4" in skipped[2]
    # Without num_labels any non-negative integer is accepted.
    assert [e.label for e in read_cs224n_sentiment(p)] == [4, 5]


def test_quoted_field_with_newline_reports_start_line(tmp_path: Path) -> None:
    # A quoted newline makes one record span two physical lines; the next row's line number must still be right.
    p = write(
        tmp_path,
        "sts-x.csv",
        PAIR_HEADER.format("similarity")
        + '0\ta\t"two\nlines"\tb\t2.5\n1\tb\tx\ty\t7\n2\tc\tx\ty\tnan\n3\td\t"bad\nscore"\ty\t-1\n',
    )
    skipped: list[str] = []
    out = read_cs224n_pairs(p, "similarity", skipped=skipped)
    assert [(e.text_a, e.label) for e in out] == [("two\nlines", 2.5)]
    assert skipped[0].startswith(f"{p}:4: similarity '7'")
    assert skipped[1].startswith(f"{p}:5: similarity 'nan'")
    assert skipped[2].startswith(f"{p}:6: similarity '-1'")  # the line where the record starts, not ends


def test_paraphrase_label_must_be_0_or_1(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "q.csv",
        PAIR_HEADER.format("is_duplicate")
        + "0\ta\tx\ty\t0.5\n1\tb\tx\ty\t1.0\n2\tc\tx\t \t0.0\n\n",  # blank last line: not a record
    )
    skipped: list[str] = []
    assert [e.label for e in read_cs224n_pairs(p, "is_duplicate", skipped)] == [1.0]
    assert skipped == [f"{p}:2: is_duplicate '0.5' is not 0 or 1", f"{p}:4: empty sentence2"]
    with pytest.raises(ValueError, match="label_field"):
        read_cs224n_pairs(p, "label")


def test_missing_label_column_means_unlabelled(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", "\tid\tsentence\n0\ta\t hello \n")
    assert read_cs224n_sentiment(p, 5) == [read_cs224n_sentiment(p)[0]]
    assert read_cs224n_sentiment(p)[0].label is None
    g = write(tmp_path, "test.tsv", "sentence\nfine . \n")
    assert read_glue_sst2(g)[0].label is None
    q = write(tmp_path, "pairs.csv", "\tid\tsentence1\tsentence2\n0\ta\tx\ty\n")
    assert read_cs224n_pairs(q, "is_duplicate")[0].label is None


def test_missing_column_raises_naming_column_and_file(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.csv", "\tid\ttext\tsentiment\n0\ta\thi\t1\n")
    with pytest.raises(DataError, match=r"bad\.csv.*'sentence'"):
        read_cs224n_sentiment(p)
    q = write(tmp_path, "badpair.csv", "\tid\tsentence1\tsimilarity\n")
    with pytest.raises(DataError, match=r"badpair\.csv.*'sentence2'"):
        read_cs224n_pairs(q, "similarity")


@pytest.mark.parametrize(
    "reader",
    [
        read_cs224n_sentiment,
        read_glue_sst2,
        lambda p: read_cs224n_pairs(p, "similarity"),
        read_squad,
        lambda p: read_squad_files([p]),
    ],
)
def test_missing_file_raises_naming_path(tmp_path: Path, reader) -> None:
    missing = tmp_path / "nope" / "missing-file.csv"
    with pytest.raises(DataError, match="missing-file.csv.*not found"):
        reader(missing)


def test_empty_file_raises(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="empty.csv"):
        read_cs224n_sentiment(write(tmp_path, "empty.csv", ""))


# ---------------------------------------------------------------- SQuAD


def squad_doc(qas: list[dict], context: str = "The cat sat on the mat.", version: str = "v2.0") -> dict:
    return {"version": version, "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


def qa(qid: str, answers: list[tuple[str, int]], impossible: bool | None = False) -> dict:
    d: dict = {
        "id": qid,
        "question": f"question {qid}?",
        "answers": [{"text": t, "answer_start": s} for t, s in answers],
    }
    if impossible is not None:
        d["is_impossible"] = impossible
    return d


def test_squad_v2_impossible_and_v1_default(tmp_path: Path) -> None:
    doc = squad_doc(
        [qa("a", [("cat", 4)]), {**qa("b", [], True), "plausible_answers": [{"text": "mat", "answer_start": 19}]}]
    )
    out = read_squad(write(tmp_path, "v2.json", json.dumps(doc)))
    assert out == [
        QAExample("a", "question a?", "The cat sat on the mat.", ("cat",), (4,), False, "T"),
        QAExample("b", "question b?", "The cat sat on the mat.", (), (), True, "T"),
    ]
    v1 = read_squad(write(tmp_path, "v1.json", json.dumps(squad_doc([qa("c", [("mat", 19)], None)], version="1.1"))))
    assert [(e.id, e.is_impossible, e.answers) for e in v1] == [("c", False, ("mat",))]


def test_squad_v11_sample_file() -> None:
    out = read_squad(V11_SAMPLE)
    assert len(out) == 10
    assert not any(e.is_impossible for e in out) and all(e.answers and e.title for e in out)


def test_squad_bad_questions_skipped_with_json_path(tmp_path: Path) -> None:
    doc = squad_doc(
        [
            qa("ok", [("cat", 4)]),
            qa("offset", [("cat", 5)]),  # off by one
            qa("neg", [("mat", -4)]),  # a negative slice would match from the end
            qa("imp", [("cat", 4)], True),  # impossible but has answers
            qa("noans", [], False),  # answerable without answers
            qa("ok", [("sat", 8)]),  # duplicate id: first one wins
            {"id": "noq", "answers": []},
        ]
    )
    p = write(tmp_path, "bad.json", json.dumps(doc))
    skipped: list[str] = []
    out = read_squad(p, skipped)
    assert [(e.id, e.answers) for e in out] == [("ok", ("cat",))]
    where = [s.split(": ", 1)[0] for s in skipped]
    assert where == [f"{p}:data[0].paragraphs[0].qas[{k}]" for k in range(1, 7)]
    assert "does not match context at 5" in skipped[0]
    assert "duplicate id 'ok' (first at data[0].paragraphs[0].qas[0])" in skipped[4]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", r"bad\.json:1: invalid JSON"),
        ('{"version": "v2.0"}', r"bad\.json: not SQuAD JSON"),
        ('{"data": [{"title": "x"}]}', r"bad\.json: data\[0\] has no 'paragraphs'"),
        ('{"data": [{"paragraphs": [{"qas": []}]}]}', r"data\[0\]\.paragraphs\[0\] has no 'context'"),
    ],
)
def test_squad_broken_file_raises(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(DataError, match=match):
        read_squad(write(tmp_path, "bad.json", text))


def test_squad_files_dedup_first_file_wins(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a = write(tmp_path, "a.json", json.dumps(squad_doc([qa("1", [("cat", 4)]), qa("2", [("mat", 19)])])))
    b = write(tmp_path, "b.json", json.dumps(squad_doc([qa("2", [("mat", 19)]), qa("3", [], True)])))
    c = write(tmp_path, "c.json", json.dumps(squad_doc([qa("3", [("sat", 8)])])))  # disagrees with b
    skipped: list[str] = []
    with caplog.at_level(logging.WARNING, logger="bertzoo.data"):
        out = read_squad_files([a, b, c], skipped)
    assert [(e.id, e.is_impossible) for e in out] == [("1", False), ("2", False), ("3", True)]
    assert skipped == []  # overlap across files is expected, not malformed
    assert len(caplog.records) == 1 and "'3' differs" in caplog.records[0].getMessage()


# ---------------------------------------------------------------- datafiles


def test_find_files_every_task_in_samples() -> None:
    for task in TASKS:
        for split in ("train", "dev"):
            for ds in SENTIMENT_DATASETS if task == "sentiment" else ("sst5",):
                assert find_files(SAMPLES, task, split, ds), (task, split, ds)
    assert [p.name for p in find_files(SAMPLES, "sentiment", "dev", "sst2")] == ["dev.tsv"]
    assert [p.name for p in find_files(SAMPLES, "qa", "dev")] == ["dev-v2.0.json"]


def test_find_files_pattern_priority(tmp_path: Path) -> None:
    # Only the subset exists: the second pattern is used.
    write(tmp_path, "quora/quora-train-subset.csv", "")
    write(tmp_path, "quora/quora-train-b.csv", "")
    assert [p.name for p in find_files(tmp_path, "paraphrase", "train")] == [
        "quora-train-b.csv",
        "quora-train-subset.csv",
    ]
    # The full file, when present, wins over the subset.
    write(tmp_path, "quora-train.csv", "")
    assert find_files(tmp_path, "paraphrase", "train") == [tmp_path / "quora-train.csv"]
    # QA dev falls through to the CS224N file, and a later squad/dev-*.json takes over.
    write(tmp_path, "squad/cs224n-dev-v2.0.json", "")
    write(tmp_path, "squad/xquad.en.json", "")
    assert find_files(tmp_path, "qa", "dev") == [tmp_path / "squad/cs224n-dev-v2.0.json"]
    write(tmp_path, "dev-v1.1.json", "")
    assert find_files(tmp_path, "qa", "dev") == [tmp_path / "dev-v1.1.json"]
    write(tmp_path, "squad/dev-v2.0.json", "")
    assert find_files(tmp_path, "qa", "dev") == [tmp_path / "squad/dev-v2.0.json"]


def test_find_files_raises_listing_patterns(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        find_files(tmp_path, "qa", "dev")
    msg = str(info.value)
    assert str(tmp_path) in msg
    for pattern in patterns("qa", "dev"):
        assert pattern in msg
    with pytest.raises(DataError, match=r"ids-cfimdb-train\.csv"):
        find_files(tmp_path, "sentiment", "train", "cfimdb")
    with pytest.raises(DataError, match="not found"):
        find_files(tmp_path / "missing", "qa", "dev")
    with pytest.raises(ValueError, match="unknown task"):
        find_files(tmp_path, "ner", "dev")
    with pytest.raises(ValueError, match="unknown sentiment dataset"):
        find_files(tmp_path, "sentiment", "dev", "imdb")


# ---------------------------------------------------------------- real data


@pytest.mark.skipif(not (SHARED / "quora-dev.csv").is_file(), reason=f"real data not present at {SHARED}")
def test_real_quora_dev_skips_exactly_the_two_damaged_rows() -> None:
    skipped: list[str] = []
    pairs = read_cs224n_pairs(SHARED / "quora-dev.csv", "is_duplicate", skipped=skipped)
    assert len(pairs) == 20_212
    assert skipped == [f"{SHARED / 'quora-dev.csv'}:{n}: empty is_duplicate" for n in (2577, 14222)]


@pytest.mark.skipif(not (SHARED / "squad/train-v1.1.json").is_file(), reason=f"real data not present at {SHARED}")
def test_a_slice_of_the_v11_training_set_merges_with_v20_files_by_id(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The rebuilt SQuAD v1.1 training set (no is_impossible: every question answerable) merges with SQuAD 2.0 files,
    one copy per id, with a line per file of what it added."""
    doc = json.loads((SHARED / "squad/train-v1.1.json").read_text(encoding="utf-8"))
    article = doc["data"][0]
    v11 = {"version": doc.get("version", "1.1"), "data": [{**article, "paragraphs": article["paragraphs"][:3]}]}
    v11_ids = [q["id"] for p in v11["data"][0]["paragraphs"] for q in p["qas"]]
    assert v11_ids and all("is_impossible" not in q for p in v11["data"][0]["paragraphs"] for q in p["qas"])
    repeat = {**v11["data"][0]["paragraphs"][0], "qas": v11["data"][0]["paragraphs"][0]["qas"][:1]}
    v20 = squad_doc([qa("v2-only", [], True)])
    v20["data"][0]["paragraphs"].append(repeat)  # an id the v1.1 slice has too
    first, second = write(tmp_path, "train-v1.1.slice.json", json.dumps(v11)), write(tmp_path, "train-v2.json",
                                                                                       json.dumps(v20))
    with caplog.at_level(logging.INFO, logger="bertzoo.data"):
        out = read_squad_files([first, second])
    assert [e.id for e in out] == [*v11_ids, "v2-only"]  # the repeat kept once, from the first file
    assert not any(e.is_impossible for e in out[:-1]) and out[-1].is_impossible
    lines = [r.getMessage() for r in caplog.records]
    assert f"{first}: {len(v11_ids)} questions taken ({len(v11_ids)} answerable, 0 unanswerable)" in lines
    assert f"{second}: 1 questions taken (0 answerable, 1 unanswerable); 1 ids already loaded from earlier files " \
           "dropped" in lines
