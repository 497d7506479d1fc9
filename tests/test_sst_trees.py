"""The SST tree reader: every node a labelled phrase, malformed lines skipped and named, phrases in training."""

from __future__ import annotations

import pytest

from bertzoo.data import DataError, read_cs224n_sentiment
from bertzoo.sst_trees import parse_tree, read_sst_phrases


def test_every_node_is_a_phrase_children_first_root_last():
    nodes = parse_tree("(3 (2 (2 The) (2 Rock)) (4 (2 is) (4 great)))")
    assert nodes == [("The", 2), ("Rock", 2), ("The Rock", 2), ("is", 2), ("great", 4), ("is great", 4),
                     ("The Rock is great", 3)]


@pytest.mark.parametrize("line, where", [
    ("(3 (2 The) (2 Rock)", "not closed"),
    (")(2 The)", "closes no node"),
    ("(7 (2 The))", "label 7"),
    ("(x (2 The))", "character 1"),
    ("(3 (2 The)) extra", "after the tree"),
    ("(3 )", "without words"),
])
def test_malformed_trees_say_where(line, where):
    with pytest.raises(ValueError, match=where):
        parse_tree(line)


def test_reader_dedupes_excludes_skips_and_reads_the_byte_order_mark(tmp_path):
    path = tmp_path / "train.txt"
    path.write_bytes("\ufeff(4 (3 good) (2 film))\n(0 (2 (2 bad)) (1 plot\n\n(1 (3 good) (1 grief))\n".encode())
    skipped: list[str] = []
    phrases = read_sst_phrases(path, skipped, exclude={"good film"})
    assert [(p.text, p.label) for p in phrases] == [("good", 3), ("film", 2), ("grief", 1), ("good grief", 1)]
    assert len(skipped) == 1 and skipped[0].startswith(f"{path}:2: not an SST tree")
    assert phrases[0].id == "train-1-0"


def test_a_file_without_trees_is_refused_naming_it(tmp_path):
    path = tmp_path / "sst.csv"
    path.write_text("\tid\tsentence\tsentiment\n0\tabc\t a film\t3\n")
    with pytest.raises(DataError, match=f"{path}: no SST trees"):
        read_sst_phrases(path)
    path.write_bytes(b"(2 ok)\n(2 \xff)\n")
    with pytest.raises(DataError, match=f"{path}:2: not UTF-8"):
        read_sst_phrases(path)


def test_bundled_trees_are_the_bundled_sentences_with_their_labels(samples):
    sentences = read_cs224n_sentiment(samples / "ids-sst-train.csv", 5)
    phrases = read_sst_phrases(samples / "sst-trees" / "train.txt")
    label_of = {p.text: p.label for p in phrases}
    matched = [s for s in sentences if s.text in label_of]
    assert len(matched) >= 230  # a few CS224N sentences have no tree (the data README)
    assert all(label_of[s.text] == s.label for s in matched)
    assert len(phrases) > 10 * len(sentences)
