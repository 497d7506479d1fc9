"""The README's walk-through runs as written: train, predict, export, serve, client, metrics.

The block after the `<!-- walkthrough -->` marker in README.md is run by bash, unchanged but for the ports (the
server's and the client's through their BERTZOO_* variables, the metrics and HTTP ports in the curl lines), so the
test never meets a server already on the defaults. After it, the test checks what the block's bullets promise: the
server is gone once `kill` returns and the shell waits for it (SIGTERM drains, then exits 0), and the same
`bertzoo train --out` run again is refused in one line, with the first run's checkpoint untouched. It runs in an
empty directory where `.venv` is README command 1's environment (`.[all]`, no test extras) where
BERTZOO_WALKTHROUGH_VENV names one (.ci/run makes it: in CI it must), else the environment running pytest, so
`. .venv/bin/activate` means what it means on a fresh clone after command 1. Training is the real default run (the
bundled samples, one epoch, the whole dev evaluation): a shorter one moves the int8 encoder past its parity gate
and the export refuses it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
MARKER = "<!-- walkthrough"
DEFAULT_METRICS = "localhost:9400"
DEFAULT_HTTP = "localhost:8000"


def walkthrough_block(text: str) -> str:
    """The fenced block right after the walk-through marker."""
    start = text.index(MARKER)
    match = re.compile(r"```(?:bash|sh)\n(.*?)```", re.S).search(text, start)
    assert match, "no fenced block after the walk-through marker"
    return match.group(1)


def commands(block: str) -> list[str]:
    """The block's commands, comments stripped, `\\` continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_walkthrough_is_in_the_readme_and_consistent():
    cmds = commands(walkthrough_block(README.read_text()))
    firsts = [c.split()[:2] for c in cmds]
    for step in (["bertzoo", "train"], ["bertzoo", "predict"], ["bertzoo", "export"], ["bertzoo", "serve"],
                 ["bertzoo", "client"]):
        assert step in firsts, f"the walk-through has no `{' '.join(step)}`"
    assert any(c.startswith(". .venv/bin/activate") for c in cmds), "the walk-through does not activate .venv"
    assert any(c.startswith("curl") and DEFAULT_METRICS in c for c in cmds), "no metrics call on the default port"
    assert any(c.startswith("curl") and f"{DEFAULT_HTTP}/v1/embeddings" in c for c in cmds), "no HTTP call"
    export = next(c for c in cmds if c.startswith("bertzoo export"))
    serve = next(c for c in cmds if c.startswith("bertzoo serve"))
    # What is exported is what is served: an int8 export is served with --variant int8.
    assert ("--int8" in export) == ("--variant int8" in serve), (export, serve)


@pytest.mark.slow
def test_readme_walkthrough_runs(tmp_path):
    first = os.environ.get("BERTZOO_WALKTHROUGH_VENV")
    if first is None and os.environ.get("CI") == "true":
        pytest.fail("CI: BERTZOO_WALKTHROUGH_VENV names no environment of README command 1 (.ci/run makes one)")
    venv = Path(first or sys.prefix)
    if not (venv / "bin" / "activate").exists():
        pytest.skip(f"pytest does not run from a virtual environment ({venv}): nothing for .venv to be")
    if first is not None:  # command 1's, not command 2's: no test extras in it
        assert (venv / "bin" / "bertzoo").exists() and not (venv / "bin" / "pytest").exists(), venv
    block = walkthrough_block(README.read_text())
    port, metrics_port, http_port = free_port(), free_port(), free_port()
    assert DEFAULT_METRICS in block and DEFAULT_HTTP in block
    block = block.replace(DEFAULT_METRICS, f"localhost:{metrics_port}").replace(DEFAULT_HTTP, f"localhost:{http_port}")
    (tmp_path / ".venv").symlink_to(venv)
    # After the block's `kill $!`: wait for the server (its exit status is the script's), and record whether any
    # process still listens on its port.
    script = ("set -euo pipefail\n"
              "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + block +
              "\nserver=$!\nwait $server; echo \"server exit $?\"\n")
    env = dict(os.environ, BERTZOO_PORT=str(port), BERTZOO_TARGET=f"localhost:{port}",
               BERTZOO_METRICS_PORT=str(metrics_port), BERTZOO_HTTP_PORT=str(http_port),
               BERTZOO_TRAIN_NO_PROGRESS="true")
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert (tmp_path / "artifacts").is_dir() and (tmp_path / "runs").is_dir()
    assert '"label"' in proc.stdout, proc.stdout[-3000:]  # the client's answer
    assert '{"object": "list", "data": [{"object": "embedding"' in proc.stdout, proc.stdout[-3000:]  # curl's
    assert re.search(r'bertzoo_requests_total\{code="OK",protocol="grpc",task="sentiment"\} [1-9]', proc.stdout), \
        proc.stdout[-3000:]
    assert "ready: health SERVING" in out and "(int8)" in out  # it served the variant it exported
    assert "server exit 0" in proc.stdout, out[-3000:]  # drained and stopped on SIGTERM
    with socket.socket() as s:  # nothing listens on the server's port any more
        assert s.connect_ex(("127.0.0.1", port)) != 0, "a process still listens on the server's port after kill"

    # The block's first training command again: refused in one line, the first run untouched.
    train = next(c for c in commands(block) if c.startswith("bertzoo train"))
    run_dir = tmp_path / train.split("--out", 1)[1].split()[0]
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    again = subprocess.run(["bash", "-c", f". .venv/bin/activate && {train}"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode != 0, again.stdout[-2000:] + again.stderr[-2000:]
    said = [line for line in again.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and "already holds a training run" in said[0] and "--force" in said[0], again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before
