"""The install profiles of pyproject.toml: the server and client work without the trainer's packages, and a command
that needs a package its installation lacks says which extra to install.

Each check runs in a fresh interpreter in which torch (and the other training and export packages) cannot be imported,
as in an environment made with `pip install 'bertzoo[serve]'`."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HIDDEN = ("torch", "transformers", "matplotlib", "onnxscript", "triton", "sentence_transformers")

HIDE = f"""
import importlib.abc, sys

class _Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {HIDDEN!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, _Hidden())
"""


def run_without_torch(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE + textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_the_server_and_client_run_without_torch(tiny_artifact, tmp_path):
    _, artifact = tiny_artifact
    result = run_without_torch(f"""
        from bertzoo.cli import main  # the whole CLI, every sub-command registered
        from bertzoo.serving.client import BertzooClient
        from bertzoo.serving.config import ServeConfig
        from bertzoo.serving.grpc_server import ServerThread

        config = ServeConfig({str(artifact)!r}, host="127.0.0.1", port=0, metrics_port=0, http_port=0, threads=1)
        with ServerThread(config) as running, BertzooClient(f"127.0.0.1:{{running.port}}") as client:
            client.wait_ready(timeout=120)
            assert len(client.sentiment(["a fine film", "dull"]).results) == 2
            assert len(client.embed(["a fine film"]).embeddings[0].values) == client.model_info().embedding_dimensions
            assert len(client.similarity([("a man plays", "someone plays")]).results) == 1
            assert len(client.qa([("Who went?", "Alice went to Paris.")]).results) == 1
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {HIDDEN!r})
        print("served; loaded:", loaded)
    """, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "served; loaded: []" in result.stdout


def test_a_command_that_needs_torch_names_the_extra(tmp_path):
    result = run_without_torch("""
        from bertzoo.cli import main
        main(["train", "--max-steps", "1"], prog_name="bertzoo")
    """, tmp_path)
    assert result.returncode == 1
    assert "`bertzoo train` needs the torch package" in result.stderr
    assert "pip install 'bertzoo[train]'" in result.stderr
    assert "Traceback" not in result.stderr
