"""Every result file the documents cite as a figure's source exists: a figure whose JSON went missing, or a path
mistyped, fails here. Paths in commands (fenced blocks, or after --json / --out) name what a run would write, and are
not checked."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "benchmarks" / "RESULTS.md", ROOT / "benchmarks" / "README.md", ROOT / "README.md",
             ROOT / "ARCHITECTURE.md", ROOT / "serving" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REFERENCE = re.compile(r"(?<![\w/.-])(?:benchmarks/)?(results/[\w./{}*,-]*\w/?)")
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
COMMAND_OUTPUT = re.compile(r"--(?:json|out)[ =]$")


def cited(text: str) -> list[str]:
    text = FENCED.sub("", text)
    return [m.group(1) for m in REFERENCE.finditer(text) if not COMMAND_OUTPUT.search(text[max(0, m.start() - 7):
                                                                                              m.start()])]


def expand(reference: str) -> list[str]:
    """``results/a_{x,y}.json`` -> both names (a brace group, as a shell expands it)."""
    match = re.search(r"\{([^{}]*)\}", reference)
    if match is None:
        return [reference]
    head, tail = reference[:match.start()], reference[match.end():]
    return list(itertools.chain.from_iterable(expand(head + part + tail) for part in match.group(1).split(",")))


def test_every_cited_result_file_exists():
    references = [(doc.relative_to(ROOT), ref) for doc in DOCUMENTS for ref in cited(doc.read_text())]
    assert len(references) >= 20  # the pattern still finds the citations
    missing = [f"{doc}: {name}" for doc, ref in references for name in expand(ref)
               if not (any((ROOT / "benchmarks").glob(name)) if "*" in name else (ROOT / "benchmarks" / name).exists())]
    assert not missing, "cited but not in benchmarks/: " + "; ".join(missing)


def test_the_citation_check_sees_a_missing_file():
    text = "figures: `results/no_such_run_2026-01-01.json`; run `x --json results/not_yet.json`\n```\nresults/a.json\n```"
    assert cited(text) == ["results/no_such_run_2026-01-01.json"]
    assert expand("results/a_{x,y}.json") == ["results/a_x.json", "results/a_y.json"]
