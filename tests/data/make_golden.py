"""Regenerate ``tests/data/golden_outputs.json``: the tiny fixed-seed checkpoint of the ``tiny_artifact`` fixture,
trained again, answering tests/test_engine_golden.py's fixed inputs on the fp32 PyTorch model. Run it only when a
change is meant to move every engine's answers (the model, the heads, tokenization, the batch path), and say why in
the commit:

    python tests/data/make_golden.py
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from test_engine_golden import GOLDEN_FILE, reference_outputs, to_json, works_for  # noqa: E402

from bertzoo.serving.engine import prepare_inputs  # noqa: E402
from bertzoo.tokenization import Tokenizer  # noqa: E402
from conftest import train_tiny_run  # noqa: E402


def main() -> None:
    import torch

    from bertzoo.trainer.checkpoint import TOKENIZER, resolve_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        train_tiny_run(run)
        tokenizer = Tokenizer.from_file(resolve_checkpoint(run) / TOKENIZER)
        works = works_for(tokenizer)
        outputs = reference_outputs(run, works, prepare_inputs(works, None, tokenizer.pad_id))
    record = {"made_by": "python tests/data/make_golden.py", "torch": torch.__version__,
              "machine": platform.machine(), "outputs": to_json(works, outputs)}
    GOLDEN_FILE.write_text(json.dumps(record, indent=0) + "\n")
    print(f"wrote {GOLDEN_FILE} ({len(works)} outputs)")


if __name__ == "__main__":
    main()
