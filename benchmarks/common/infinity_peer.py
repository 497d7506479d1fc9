"""The peer server, infinity-emb, on loopback at each of its CPU engines under the HTTP load generator
(peers/http_load.py, run with the peer's own Python): set up by peers/infinity_setup.sh, and measured beside bertzoo
by serve_defaults, serve_goals and serve_h2load.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common.processes import cpu_seconds, free_port, memory_mb, start, stop

INFINITY_ENGINES = {"infinity-emb, torch engine, fp32": ("torch", "torch"),
                    "infinity-emb, optimum engine, fp32 (graph-optimized)": ("optimum", "onnx-fp32"),
                    "infinity-emb, optimum engine, int8": ("optimum", "onnx-int8")}


def start_infinity(venv: str, models: str, engine: str, folder: str) -> tuple[subprocess.Popen, int, str]:
    """infinity-emb on loopback with ``engine`` and the model in MODELS/``folder``, once it is healthy: (process,
    port, the model name its requests carry)."""
    import urllib.request

    port, model = free_port(), str(Path(models) / folder)

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200

    process = start([str(Path(venv) / "bin" / "infinity_emb"), "v2", "--model-id", model, "--engine", engine,
                     "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), "--pooling-method",
                     "mean", "--batch-size", "64"], ready, timeout=600, env={"HF_HUB_OFFLINE": "1"})
    return process, port, model


def infinity_row(venv: str, models: str, engine: str, folder: str, texts: str, concurrency: int,
                 duration: float) -> dict:
    """infinity-emb at one CPU engine, started on loopback and warmed up, under the HTTP closed loop (sentences: the
    lines of the file ``texts``)."""
    python, load = str(Path(venv) / "bin" / "python"), str(Path(__file__).parent / "peers" / "http_load.py")
    process, port, model = start_infinity(venv, models, engine, folder)
    try:
        command = [python, load, f"http://127.0.0.1:{port}/embeddings", model, texts, "--concurrency", str(concurrency)]
        subprocess.run([*command, "--duration", "3"], check=True, capture_output=True)  # warm-up
        server0, t0 = cpu_seconds(process.pid), time.perf_counter()
        out = subprocess.run([*command, "--duration", str(duration)], check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        summary = json.loads(out.stdout)
        return {**summary, "server_cores": (cpu_seconds(process.pid) - server0) / wall,
                "load_generator_cores": summary["load_generator_cpu_s"] / wall,
                "peak_rss_mb": memory_mb(process.pid)["VmHWM"]}
    finally:
        stop(process)


def sentences_file(sentences: list[str]):
    """A temporary file of the sentences one per line, for the peer's load generator; delete it when done."""
    texts = tempfile.NamedTemporaryFile("w", suffix=".txt")  # noqa: SIM115 (the caller's context)
    texts.write("\n".join(s.replace("\n", " ") for s in sentences))
    texts.flush()
    return texts


def infinity_rows(venv: str, models: str, sentences: list[str], concurrency: int, duration: float) -> dict:
    """infinity-emb at each of its CPU engines in turn."""
    rows = {}
    with sentences_file(sentences) as texts:
        for name, (engine, folder) in INFINITY_ENGINES.items():
            rows[name] = infinity_row(venv, models, engine, folder, texts.name, concurrency, duration)
            print(f"{name}: {rows[name]['items_per_s']:.1f} sentences/s", flush=True)
    return rows
