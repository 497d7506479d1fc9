"""Regenerate ``tests/data/golden_outputs.json``, or measure how far this machine's engines are from it.

    python tests/data/make_golden.py                 # rewrite the stored outputs (fp32 PyTorch, this machine)
    python tests/data/make_golden.py --spread F.json # every engine here against the stored outputs, per output kind

Regenerate only when a change is meant to move every engine's answers (the model, the heads, tokenization, the batch
path), and say why in the commit. ``--spread`` is how tests/test_engine_golden.py's tolerances were set: run it on
every CPU kind you can reach (and with ATEN_CPU_CAPABILITY=avx2 / MKL_ENABLE_INSTRUCTIONS=AVX2 / ONEDNN_MAX_CPU_ISA=
AVX2 to take an AVX2-only CPU's code paths), and keep each tolerance well above the widest spread and well below the
closest decision's margin.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from bertzoo.cpu import cpu_flags, cpu_model  # noqa: E402
from bertzoo.serving.engine import prepare_inputs, run_batch  # noqa: E402
from bertzoo.tokenization import Tokenizer  # noqa: E402
from golden_model import (  # noqa: E402
    ENGINES,
    GOLDEN_FILE,
    build,
    decisions,
    deviations,
    from_json,
    margins,
    reference_outputs,
    to_json,
    works_for,
    write_golden_checkpoint,
)

ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu() -> dict:
    """The CPU's model name and its SIMD flags, as /proc/cpuinfo gives them."""
    return {"model": cpu_model() or platform.processor(),
            "flags": sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")))}


def commit() -> str:
    """The checked-out commit, "+changes" where the tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=TESTS, capture_output=True, text=True, check=True).stdout.strip()

    try:
        return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "-uno") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def regenerate(run: Path) -> None:
    import torch

    tokenizer = Tokenizer.from_file(run / "checkpoint-000000" / "tokenizer.json")
    works = works_for(tokenizer)
    outputs = reference_outputs(run, works, prepare_inputs(works, None, tokenizer.pad_id))
    record = {"made_by": "python tests/data/make_golden.py", "torch": torch.__version__, "cpu": cpu()["model"],
              "outputs": to_json(works, outputs)}
    GOLDEN_FILE.write_text(json.dumps(record, indent=0) + "\n")
    print(f"wrote {GOLDEN_FILE} ({len(works)} outputs)")


def spread(run: Path, root: Path, out: Path) -> None:
    import pytest

    from bertzoo.export.exporter import ExportOptions, export_checkpoint
    from bertzoo.serving.backends.base import BackendUnavailable

    artifact = root / "artifact"
    export_checkpoint(run, artifact, ExportOptions(optimize=True, int8=True, parity_limit=8))
    tokenizer = Tokenizer.from_file(artifact / "tokenizer.json")
    works = works_for(tokenizer)
    inputs = prepare_inputs(works, None, tokenizer.pad_id)
    stored = from_json(json.loads(GOLDEN_FILE.read_text())["outputs"])
    want = decisions(works, stored)
    engines = {}
    for engine in ENGINES:
        try:
            outputs = run_batch(build(engine, run, artifact), works, inputs, "mean")
        except (pytest.skip.Exception, BackendUnavailable) as skipped:  # e.g. bf16 under ONEDNN_MAX_CPU_ISA=AVX2
            print(f"{engine:32s} skipped: {getattr(skipped, 'msg', skipped)}")
            continue
        got = decisions(works, outputs)
        engines[engine] = {"deviation": deviations(works, outputs, stored),
                           "decisions_differ": {k: sum(a != b for a, b in zip(got[k], want[k], strict=True))
                                                for k in want}}
        widest = {k: f"{v['abs']:.1e}" for k, v in engines[engine]["deviation"].items()}
        print(f"{engine:32s} {widest} differing decisions {engines[engine]['decisions_differ']}")
    record = {"command": f"python tests/data/make_golden.py --spread {out.name}", "date": date.today().isoformat(),
              "commit": commit(), "cpu": cpu(),
              "isa_variables": {k: os.environ[k] for k in ISA_VARIABLES if k in os.environ},
              "reference_margins": margins(works, stored), "engines": engines}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spread", type=Path, metavar="JSON", help="measure every engine here; write the spread")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        write_golden_checkpoint(run)
        if args.spread:
            spread(run, Path(tmp), args.spread)
        else:
            regenerate(run)


if __name__ == "__main__":
    main()
