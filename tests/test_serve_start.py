"""How `bertzoo serve` starts: the defaults it picks from the machine and the artifact, the one-line errors of a busy
port or an absent server, and an in-process serve() that leaves the process's signal handling as it found it."""

from __future__ import annotations

import http.server
import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import textwrap
import threading

import pytest
from click.testing import CliRunner

from bertzoo.artifact import write_manifest
from bertzoo.cli import main
from bertzoo.serving import machine_defaults
from conftest import free_port


def _with_variants(artifact, tmp_path, int8_same_class: float, optimized_passed: bool = True):
    """A copy of ``artifact`` whose manifest lists int8 and optimized encoders (the fp32 file under their names) with
    parity reports: int8's sentiment agreement ``int8_same_class``, passing its own (int8) gates."""
    copy = tmp_path / f"artifact-{int8_same_class}-{optimized_passed}"
    shutil.copytree(artifact, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    files = manifest["graphs"]["encoder"]["files"]
    files["int8"], files["optimized"] = files["fp32"], files["fp32"]
    fp32 = manifest["parity"]["fp32"]
    int8_tasks = {**fp32["tasks"], "sentiment": {**fp32["tasks"]["sentiment"], "same_class": int8_same_class,
                                                 "same_class_high": min(1.0, int8_same_class + 0.01)}}
    manifest["parity"]["int8"] = {**fp32, "tasks": int8_tasks, "passed": True}
    manifest["parity"]["optimized"] = {**fp32, "passed": optimized_passed}
    write_manifest(copy, manifest)
    return str(copy)


def test_auto_variant_is_the_fastest_encoder_at_fp32_level_agreement(tiny_artifact, tmp_path):
    _, artifact = tiny_artifact
    assert machine_defaults.variant(str(artifact)) == "fp32"  # the tiny artifact has no other encoder
    # int8 passed its own gates (>= 95% same class) but not fp32's (99.5%): not a default.
    assert machine_defaults.variant(_with_variants(artifact, tmp_path, 0.96)) == "optimized"
    assert machine_defaults.variant(_with_variants(artifact, tmp_path, 0.96, optimized_passed=False)) == "fp32"
    assert machine_defaults.variant(_with_variants(artifact, tmp_path, 1.0)) == "int8"


def test_auto_backend_is_openvino_bf16_only_where_int8_falls_short_and_the_cpu_has_native_bf16(
        tiny_artifact, tmp_path, monkeypatch):
    _, artifact = tiny_artifact
    short, exact = _with_variants(artifact, tmp_path, 0.96), _with_variants(artifact, tmp_path, 1.0)
    for native in (True, False):
        monkeypatch.setattr(machine_defaults, "native_bf16", lambda native=native: native)
        assert machine_defaults.backend(exact, "cpu", variant_forced=False) == "onnxruntime"  # int8 at fp32 level
        expected = "openvino" if native and importlib.util.find_spec("openvino") else "onnxruntime"
        assert machine_defaults.backend(short, "cpu", variant_forced=False) == expected
        assert machine_defaults.backend(short, "cpu", variant_forced=True) == "onnxruntime"  # --variant asked for
        assert machine_defaults.backend(short, "cuda", variant_forced=False) == "onnxruntime"


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 2), (4, 4), (8, 4), (16, 8), (64, 8)])
def test_auto_instances_follow_the_cores(monkeypatch, cores, expected):
    monkeypatch.setattr(machine_defaults, "cores", lambda: cores)
    assert machine_defaults.instances("onnxruntime", "cpu", None) == expected
    assert machine_defaults.instances("onnxruntime", "cpu", 1) == 1  # --threads 1: one core to share
    assert machine_defaults.instances("onnxruntime", "cuda", None) == 1
    assert machine_defaults.instances("torch", "cpu", None) == 1


@pytest.mark.parametrize(("cores", "cpu", "cuda"), [(2, 1, 1), (8, 1, 4), (16, 2, 8), (32, 4, 8)])
def test_auto_frontends_follow_the_device_and_cores(monkeypatch, cores, cpu, cuda):
    monkeypatch.setattr(machine_defaults, "cores", lambda: cores)
    assert machine_defaults.frontends("cpu") == cpu
    assert machine_defaults.frontends("cuda") == cuda
    assert machine_defaults.frontends("cpu", threads=2) == 1  # --threads 2: the engine's share, not the node's


def test_a_bad_count_is_one_line_naming_the_option(tiny_artifact):
    _, artifact = tiny_artifact
    for option in ("--frontends", "--instances", "--engines"):
        result = CliRunner().invoke(main, ["serve", str(artifact), option, "two"])
        assert result.exit_code == 2 and option in result.output and "neither auto nor a count" in result.output


def _serve(artifact, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "bertzoo.cli", "serve", str(artifact), "--host", "127.0.0.1", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_busy_ports_are_one_line_naming_the_address_and_option(tiny_artifact):
    _, artifact = tiny_artifact
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one = ("--frontends", "1")
        grpc_busy = _serve(artifact, "--port", str(port), "--metrics-port", "0", "--http-port", "0", *one)
        metrics_busy = _serve(artifact, "--port", str(free_port()), "--metrics-port", str(port), "--http-port", "0", *one)
        http_busy = [_serve(artifact, "--port", str(free_port()), "--metrics-port", "0", "--http-port", str(port),
                            "--frontends", n) for n in ("1", "2")]
    for busy in http_busy:  # one process, and the parent of two front ends
        assert busy.returncode == 1, busy.stderr[-2000:]
        assert f"127.0.0.1:{port}" in busy.stderr and "--http-port" in busy.stderr and "Traceback" not in busy.stderr
    assert grpc_busy.returncode == 1
    assert f"could not listen on 127.0.0.1:{port}" in grpc_busy.stderr and "--port" in grpc_busy.stderr
    assert "GRPC_VERBOSITY" not in grpc_busy.stderr and "Traceback" not in grpc_busy.stderr
    assert metrics_busy.returncode == 1
    assert f"could not serve metrics on 127.0.0.1:{port}" in metrics_busy.stderr
    assert "--metrics-port" in metrics_busy.stderr and "Traceback" not in metrics_busy.stderr


def test_a_client_that_reaches_nothing_says_so_and_names_the_option():
    target = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(main, ["client", "sentiment", "hello", "--target", target, "--timeout", "3"])
    assert result.exit_code == 1
    assert f"nothing answers at {target}: is `bertzoo serve` running there? (--target)" in result.output


class _StatusLineHandler(http.server.BaseHTTPRequestHandler):
    default_request_version = "HTTP/1.1"  # its refusal of HTTP/2's preface starts with a status line

    def log_message(self, *args) -> None:  # not into the command's captured stderr
        pass


@pytest.mark.parametrize("server", ["metrics", "status line"])
def test_a_client_pointed_at_an_http1_port_says_so(server):
    """The metrics port (prometheus_client's server, whose refusal of HTTP/2 is a page without a status line) or an
    HTTP/1.x server that sends one: the client and the health probe say the address answers HTTP/1.x, not gRPC, and
    name gRPC's default port, instead of "nothing answers"."""
    if server == "metrics":
        from prometheus_client import start_http_server

        http1, _ = start_http_server(0, addr="127.0.0.1")
    else:
        http1 = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StatusLineHandler)
        threading.Thread(target=http1.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{http1.server_address[1]}"
    try:
        call = CliRunner().invoke(main, ["client", "sentiment", "hello", "--target", target, "--timeout", "5"])
        probe = CliRunner().invoke(main, ["client", "health", "--target", target, "--timeout", "5"])
    finally:
        http1.shutdown()
        http1.server_close()
    reason = ("answers HTTP/1.x, not gRPC (HTTP/2): the metrics port perhaps (serve --metrics-port, 9400 by default)? "
              "`bertzoo serve` takes gRPC on port 50051 by default (--target)")
    assert call.exit_code == 1 and f"Error: {target} {reason}\n" in call.output, call.output
    assert probe.exit_code == 2 and f"{target}: {reason}" in probe.stderr, probe.stderr


def test_serve_leaves_the_signal_handlers_as_it_found_them(tiny_artifact):
    """After an in-process serve() returns, SIGINT raises KeyboardInterrupt again and SIGTERM is the default."""
    _, artifact = tiny_artifact
    script = textwrap.dedent(f"""
        import asyncio, os, signal, sys, threading
        sys.path.insert(0, {str(sys.path[0])!r})
        from bertzoo.serving.config import ServeConfig
        from bertzoo.serving.grpc_server import serve

        config = ServeConfig({str(artifact)!r}, host="127.0.0.1", port=0, metrics_port=0, http_port=0, threads=1,
                             shutdown_grace=1)

        async def main():
            asyncio.get_running_loop().call_later(3.0, os.kill, os.getpid(), signal.SIGTERM)
            await serve(config)

        asyncio.run(main())
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, signal.getsignal(signal.SIGTERM)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(2)
        except KeyboardInterrupt:
            print("SIGINT works")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "SIGINT works" in result.stdout, result.stderr[-2000:]
