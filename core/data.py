"""Torch-free readers for the task data files (stdlib only on purpose: the CLI and the fast tests import this
module and must not pay for torch).

Formats (see the data README for provenance and quirks):

* CS224N minBERT files (``ids-sst-*.csv``, ``ids-cfimdb-*.csv``, ``quora-*.csv``, ``sts-*.csv``): tab-separated with
  CSV quoting (doubled ``"``), a pandas-style header whose first cell is empty (the index column), and text fields that
  carry a leading space. Unlabelled test files simply lack the label column.
* GLUE SST-2 (``train.tsv``/``dev.tsv``): ``sentence\\tlabel`` header, sentences end with a trailing space.
* SQuAD v1.1 / v2.0 official JSON. v1.1 has no ``is_impossible`` field (every question is answerable).

Damaged rows are skipped, never guessed at: each one is logged on the ``bertzoo.data`` logger as
``path:line: reason`` and, if the caller passes a ``skipped`` list, appended to it so callers can count or report
them. Problems that make a whole file unusable (missing file, missing column, invalid JSON) raise :class:`DataError`.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UserError

__all__ = [
    "DataError",
    "PairExample",
    "QAExample",
    "SentenceExample",
    "read_cs224n_pairs",
    "read_cs224n_sentiment",
    "read_glue_sst2",
    "read_squad",
    "read_squad_files",
]

log = logging.getLogger("bertzoo.data")

PathLike = str | Path


@dataclass(frozen=True)
class SentenceExample:
    """One single-sentence classification example (sentiment)."""

    id: str
    text: str  # stripped of the leading/trailing whitespace the files carry
    label: int | None  # None when the file has no label column (unlabelled test files)


@dataclass(frozen=True)
class PairExample:
    """One sentence-pair example: paraphrase (label 0.0/1.0) or similarity (label in [0, 5])."""

    id: str
    text_a: str
    text_b: str
    label: float | None


@dataclass(frozen=True)
class QAExample:
    """One extractive-QA question with its context paragraph."""

    id: str
    question: str
    context: str
    answers: tuple[str, ...]  # gold answer texts (empty for unanswerable)
    answer_starts: tuple[int, ...]  # char offsets into context, parallel to answers
    is_impossible: bool
    title: str = ""


class DataError(UserError, ValueError):
    """A data file cannot be used at all. The message always names the file (and the line or field if relevant)."""


# Label validators for the pair tasks: the CS224N files write both labels as floats ("0.0", "4.6").
_PAIR_LABEL_RULES = {
    "is_duplicate": (lambda x: x in (0.0, 1.0), "not 0 or 1"),
    "similarity": (lambda x: 0.0 <= x <= 5.0, "not in [0, 5]"),
}


def _skip(skipped: list[str] | None, path: Path, where: int | str, reason: str) -> None:
    msg = f"{path}:{where}: {reason}"
    if skipped is not None:
        skipped.append(msg)  # the caller reports them in one line; each row is in the --verbose log
        log.debug(msg)
    else:
        log.warning(msg)


def _check_exists(path: Path) -> None:
    if not path.is_file():
        raise DataError(f"{path}: file not found" if not path.exists() else f"{path}: not a regular file")


def _first_undecodable_line(path: Path) -> int:
    """The 1-based number of the first line that is not valid UTF-8 (a decoding error's offset counts from the chunk
    the reader was decoding, not from the file's start)."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 1


def _read_tsv(
    path: Path, required: Sequence[str], label: str, skipped: list[str] | None
) -> Iterator[tuple[int, int, dict[str, str] | None]]:
    """Yield ``(row_index, start_line, fields)`` for every data row of a tab-separated, CSV-quoted file.

    ``fields`` maps the required columns (and ``label`` when the header has it) to raw values; it is None for a row
    with the wrong number of fields (already logged), so callers can still count rows for stable ids.
    """
    _check_exists(path)
    # newline="" lets csv handle quoted fields that contain line breaks, so line_num stays a physical line count.
    # utf-8-sig reads plain UTF-8 unchanged but drops a BOM that would otherwise glue itself to the first column name.
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(f"{path}: empty file (no header line)") from None
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{_first_undecodable_line(path)}: not valid UTF-8 ({e.reason}); save the file as "
                            "UTF-8") from None
        except csv.Error as e:
            raise DataError(f"{path}:1: unreadable header: {e}") from None
        names = [h.strip() for h in header]
        for col in required:
            if col not in names:
                raise DataError(f"{path}: missing required column {col!r} (header: {names})")
        wanted = [*required, label] if label in names else list(required)
        pos = {col: names.index(col) for col in wanted}

        start = reader.line_num + 1
        index = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:  # e.g. a NUL byte; the reader cannot resume reliably after this
                raise DataError(f"{path}:{reader.line_num}: {e}") from None
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{_first_undecodable_line(path)}: not valid UTF-8 ({e.reason} at byte "
                                f"{e.object[e.start:e.start + 1]!r}); save the file as UTF-8") from None
            line, start = start, reader.line_num + 1
            if not row:  # a blank line is not a record (e.g. an extra newline at the end of the file)
                continue
            if len(row) != len(names):
                _skip(skipped, path, line, f"expected {len(names)} fields, got {len(row)}")
                yield index, line, None
            else:
                yield index, line, {col: row[i] for col, i in pos.items()}
            index += 1


def _parse_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        pass
    # Tolerate "3.0" (pandas writes ints as floats once a column had a NaN) but not "3.5".
    try:
        x = float(value)
    except ValueError:
        return None
    return int(x) if x.is_integer() else None


def _read_sentences(
    path: Path, text_col: str, id_col: str | None, label_col: str, num_labels: int | None, skipped: list[str] | None
) -> list[SentenceExample]:
    required = [text_col] if id_col is None else [id_col, text_col]
    out: list[SentenceExample] = []
    for index, line, row in _read_tsv(path, required, label_col, skipped):
        if row is None:
            continue
        text = row[text_col].strip()
        if not text:
            _skip(skipped, path, line, f"empty {text_col}")
            continue
        label: int | None = None
        if label_col in row:
            raw = row[label_col].strip()
            label = _parse_int(raw)
            if label is None:
                _skip(skipped, path, line, f"{label_col} {raw!r} is not an integer")
                continue
            if label < 0 or (num_labels is not None and label >= num_labels):
                allowed = "non-negative" if num_labels is None else f"in 0..{num_labels - 1}"
                _skip(skipped, path, line, f"{label_col} {label} is not {allowed}")
                continue
        # GLUE rows have no id column: name them by data-row index (malformed rows included) so ids stay stable.
        ex_id = row[id_col].strip() if id_col is not None else f"{path.stem}-{index}"
        out.append(SentenceExample(id=ex_id, text=text, label=label))
    return out


def read_cs224n_sentiment(
    path: PathLike, num_labels: int | None = None, skipped: list[str] | None = None
) -> list[SentenceExample]:
    """Read a CS224N sentiment file (``ids-sst-*.csv``: 5 labels, ``ids-cfimdb-*.csv``: 2 labels).

    Columns: ``''`` (index), ``id``, ``sentence``, optional ``sentiment``. Labels must be integers in
    ``0..num_labels-1`` (any non-negative integer when ``num_labels`` is None).
    """
    return _read_sentences(Path(path), "sentence", "id", "sentiment", num_labels, skipped)


def read_glue_sst2(path: PathLike, skipped: list[str] | None = None) -> list[SentenceExample]:
    """Read a GLUE SST-2 TSV (``sentence\\tlabel``, label 0/1). Ids are ``f"{file stem}-{data row index}"``, 0-based."""
    return _read_sentences(Path(path), "sentence", None, "label", 2, skipped)


def read_cs224n_pairs(path: PathLike, label_field: str, skipped: list[str] | None = None) -> list[PairExample]:
    """Read a CS224N pair file: ``quora-*.csv`` (``label_field="is_duplicate"``) or ``sts-*.csv`` (``"similarity"``).

    Columns: ``''`` (index), ``id``, ``sentence1``, ``sentence2``, optional label column.
    """
    if label_field not in _PAIR_LABEL_RULES:
        raise ValueError(f"label_field must be one of {sorted(_PAIR_LABEL_RULES)}, got {label_field!r}")
    valid, why = _PAIR_LABEL_RULES[label_field]
    path = Path(path)
    out: list[PairExample] = []
    for _, line, row in _read_tsv(path, ["id", "sentence1", "sentence2"], label_field, skipped):
        if row is None:
            continue
        label: float | None = None
        if label_field in row:
            raw = row[label_field].strip()
            # The two damaged quora-dev rows land here: an unbalanced quote swallows the tab, leaving the label empty.
            if not raw:
                _skip(skipped, path, line, f"empty {label_field}")
                continue
            try:
                label = float(raw)
            except ValueError:
                _skip(skipped, path, line, f"{label_field} {raw!r} is not a number")
                continue
            if not valid(label):  # both rules are comparisons, so NaN fails them too
                _skip(skipped, path, line, f"{label_field} {raw!r} is {why}")
                continue
        a, b = row["sentence1"].strip(), row["sentence2"].strip()
        if not a or not b:
            _skip(skipped, path, line, "empty sentence1" if not a else "empty sentence2")
            continue
        out.append(PairExample(id=row["id"].strip(), text_a=a, text_b=b, label=label))
    return out


def _qa_problem(qa: dict[str, Any], context: str) -> str | None:
    """Return why a SQuAD question is unusable, or None if it is fine."""
    if not isinstance(qa.get("id"), str) or not qa["id"]:
        return "missing or non-string 'id'"
    if not isinstance(qa.get("question"), str) or not qa["question"].strip():
        return "missing or empty 'question'"
    answers = qa.get("answers", [])
    if not isinstance(answers, list):
        return "'answers' is not a list"
    impossible = qa.get("is_impossible", False)  # v1.1 has no such field: every question is answerable
    if not isinstance(impossible, bool):
        return f"'is_impossible' is not a boolean: {impossible!r}"
    if impossible and answers:
        return "is_impossible but 'answers' is not empty"
    if not impossible and not answers:
        return "answerable but 'answers' is empty"
    for k, ans in enumerate(answers):
        text, start = (ans.get("text"), ans.get("answer_start")) if isinstance(ans, dict) else (None, None)
        # bool is an int subclass; a JSON true must not pass as offset 1.
        if not isinstance(text, str) or not text or not isinstance(start, int) or isinstance(start, bool):
            return f"answers[{k}] lacks a non-empty 'text' and an integer 'answer_start'"
        # start < 0 first: a negative slice would silently index from the end of the context.
        if start < 0 or context[start : start + len(text)] != text:
            found = context[max(start, 0) : max(start, 0) + len(text)]
            return f"answers[{k}] {text!r} does not match context at {start} (found {found!r})"
    return None


def read_squad(path: PathLike, skipped: list[str] | None = None) -> list[QAExample]:
    """Read an official SQuAD v1.1 or v2.0 JSON file.

    Malformed questions (answer text not found at its offset, impossible with answers, ...) and repeated question
    ids (the first is kept) are skipped and reported with their JSON path, e.g. ``data[3].paragraphs[2].qas[5]``.
    """
    path = Path(path)
    _check_exists(path)
    try:
        with path.open(encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DataError(f"{path}: not SQuAD JSON (no top-level 'data' list)")

    out: list[QAExample] = []
    first_seen: dict[str, str] = {}
    for i, article in enumerate(doc["data"]):
        # Structural damage above the question level means the file is not what we think it is: refuse it.
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise DataError(f"{path}: data[{i}] has no 'paragraphs' list")
        title = article.get("title", "")
        title = title if isinstance(title, str) else ""
        for j, para in enumerate(article["paragraphs"]):
            where = f"data[{i}].paragraphs[{j}]"
            if not isinstance(para, dict) or not isinstance(para.get("context"), str):
                raise DataError(f"{path}: {where} has no 'context' string")
            if not isinstance(para.get("qas"), list):
                raise DataError(f"{path}: {where} has no 'qas' list")
            context = para["context"]
            for k, qa in enumerate(para["qas"]):
                qa_where = f"{where}.qas[{k}]"
                problem = _qa_problem(qa, context) if isinstance(qa, dict) else "question is not a JSON object"
                if problem is not None:
                    _skip(skipped, path, qa_where, problem)
                    continue
                if qa["id"] in first_seen:
                    _skip(skipped, path, qa_where, f"duplicate id {qa['id']!r} (first at {first_seen[qa['id']]})")
                    continue
                first_seen[qa["id"]] = qa_where
                answers = qa.get("answers", [])
                out.append(
                    QAExample(
                        id=qa["id"],
                        question=qa["question"].strip(),
                        context=context,  # not stripped: answer offsets index into it
                        answers=tuple(a["text"] for a in answers),
                        answer_starts=tuple(a["answer_start"] for a in answers),
                        is_impossible=qa.get("is_impossible", False),
                        title=title,
                    )
                )
    return out


def read_squad_files(paths: Iterable[PathLike], skipped: list[str] | None = None) -> list[QAExample]:
    """Read several SQuAD files and de-duplicate questions by id; the first file that has an id wins.

    Overlap between files is expected (the shared v1.1 and v2.0 train excerpts share 3,077 ids), so repeats are not
    errors. A repeat whose content differs is logged as a warning, since it means the files disagree.
    """
    out: list[QAExample] = []
    seen: dict[str, tuple[QAExample, Path]] = {}
    for p in paths:
        p = Path(p)
        dupes = 0
        added = len(out)
        for ex in read_squad(p, skipped):
            if ex.id not in seen:
                seen[ex.id] = (ex, p)
                out.append(ex)
                continue
            dupes += 1
            first, first_path = seen[ex.id]
            # Titles and is_impossible may legitimately differ in form between versions; compare the content.
            if (first.question, first.context, first.answers, first.answer_starts) != (
                ex.question,
                ex.context,
                ex.answers,
                ex.answer_starts,
            ):
                log.warning("%s: question %r differs from the copy in %s; keeping the first", p, ex.id, first_path)
        new = out[added:]
        unanswerable = sum(ex.is_impossible for ex in new)
        log.info("%s: %d questions taken (%d answerable, %d unanswerable)%s", p, len(new), len(new) - unanswerable,
                 unanswerable, f"; {dupes} ids already loaded from earlier files dropped" if dupes else "")
    return out
