"""Triton Inference Server as a peer: the build nvidia-pytriton carries (peers/triton_setup.sh), serving an artifact's
Triton repository with the model's engine in process (export/triton_python_model.py, ENGINE onnxruntime)."""

from __future__ import annotations

import argparse
import shutil
import urllib.request
from pathlib import Path

from benchmarks.common.processes import free_port, start
from bertzoo.export.triton_repo import in_process_engine_config


def start_triton(settings: argparse.Namespace, variant: str, folder: Path) -> tuple:
    """tritonserver on loopback with a repository of the ``bertzoo`` model alone, once it is ready: (process, gRPC
    port, HTTP port). ``settings``: artifact, triton (its virtual environment), instances, threads."""
    repository = folder / variant
    shutil.rmtree(repository, ignore_errors=True)
    shutil.copytree(Path(settings.artifact) / "triton" / "bertzoo", repository / "bertzoo")
    config = repository / "bertzoo" / "config.pbtxt"
    config.write_text(in_process_engine_config(config.read_text(), Path(settings.artifact), variant,
                                               settings.instances, settings.threads // settings.instances,
                                               str(Path(settings.triton).resolve())))
    grpc_port, http_port = free_port(), free_port()
    venv = Path(settings.triton)

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as response:
            return response.status == 200

    process = start([str(venv / "bin" / "tritonserver"), "--model-repository", str(repository),
                     "--backend-directory", str(venv / "backends"), "--grpc-address", "127.0.0.1",
                     "--grpc-port", str(grpc_port), "--http-address", "127.0.0.1", "--http-port", str(http_port),
                     "--allow-metrics", "false", "--exit-timeout-secs", "5", "--log-info", "false"], ready)
    return process, grpc_port, http_port
