"""Torch-free reader for the Stanford Sentiment Treebank's PTB tree files (``train.txt``, ``dev.txt``).

One sentence per line, every node labelled 0-4: ``(3 (2 (2 The) (2 Rock)) (4 ...))``. Each node's leaves, joined by
spaces, are a phrase with its own sentiment label, so one sentence brings all of its phrases (about 150k distinct
labelled phrases in SST train). The leaves keep the treebank's PTB escapes (``-LRB-``, `````` ``, ``\\/``), exactly as
the CS224N sentence files write them, so a tree's root phrase equals that file's sentence text.

Phrases are a training option for sentiment (``bertzoo train --sst-phrases FILE``); evaluation stays on sentences.
"""

from __future__ import annotations

from pathlib import Path

from .data import DataError, PathLike, SentenceExample, _check_exists, _first_undecodable_line, _skip

__all__ = ["parse_tree", "read_sst_phrases"]


def parse_tree(line: str) -> list[tuple[str, int]]:
    """Every node of one PTB tree as ``(phrase, label)``, children before their parent, the root last.

    Raises ValueError with the position and what was expected on a malformed tree.
    """
    phrases: list[tuple[str, int]] = []
    # Each open node: [label, leaves under it so far].
    stack: list[tuple[int, list[str]]] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c.isspace():
            i += 1
        elif c == "(":
            j = i + 1
            while j < n and line[j].isdigit():
                j += 1
            if j == i + 1 or j >= n or not line[j].isspace():
                raise ValueError(f"character {i + 1}: expected '(' followed by a label 0-4 and a space")
            label = int(line[i + 1:j])
            if label > 4:
                raise ValueError(f"character {i + 2}: label {label} is not in 0..4")
            stack.append((label, []))
            i = j
        elif c == ")":
            if not stack:
                raise ValueError(f"character {i + 1}: ')' closes no node")
            label, leaves = stack.pop()
            if not leaves:
                raise ValueError(f"character {i + 1}: a node without words")
            phrases.append((" ".join(leaves), label))
            if stack:
                stack[-1][1].extend(leaves)
            elif line[i + 1:].strip():
                raise ValueError(f"character {i + 2}: text after the tree's last ')'")
            i += 1
        else:
            if not stack:
                raise ValueError(f"character {i + 1}: a word outside any node")
            j = i
            while j < n and not line[j].isspace() and line[j] not in "()":
                j += 1
            stack[-1][1].append(line[i:j])
            i = j
    if stack:
        raise ValueError(f"{len(stack)} node(s) not closed (the tree is cut short)")
    if not phrases:
        raise ValueError("no tree on this line")
    return phrases


def read_sst_phrases(path: PathLike, skipped: list[str] | None = None,
                     exclude: set[str] | frozenset[str] = frozenset()) -> list[SentenceExample]:
    """Every distinct labelled phrase of an SST tree file, in file order (a phrase's first occurrence wins).

    ``exclude``: phrase texts to leave out (e.g. the sentences a sentence file already holds). Malformed lines are
    skipped and reported like malformed rows of the other readers; a file with no usable tree raises DataError.
    """
    path = Path(path)
    _check_exists(path)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError:
        raise DataError(f"{path}:{_first_undecodable_line(path)}: not UTF-8 text; SST tree files are UTF-8") from None
    seen = set(exclude)
    out: list[SentenceExample] = []
    trees = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            nodes = parse_tree(line)
        except ValueError as e:
            _skip(skipped, path, number, f"not an SST tree: {e}")
            continue
        trees += 1
        for index, (text, label) in enumerate(nodes):
            if text not in seen:
                seen.add(text)
                out.append(SentenceExample(id=f"{path.stem}-{number}-{index}", text=text, label=label))
    if not trees:
        raise DataError(f"{path}: no SST trees; expected one '(label (label word) ...)' tree per line")
    return out
