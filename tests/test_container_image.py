"""The CPU image (deploy/docker/Dockerfile) for real, with podman: the image deploy/docker/build_cpu_image.sh built runs
with the tiny exported artifact mounted read-only and its ports published on loopback, its own HEALTHCHECK command
(`podman healthcheck run`, polled: no systemd schedules it here) passes once the server is SERVING, every RPC is
answered from the host through the published port (each task unary and streamed, ModelInfo, the metrics endpoint), and
SIGTERM (`podman stop`: the image's STOPSIGNAL) drains and ends the server with exit status 0 well before podman would
send SIGKILL. The container is removed in every case.

Outside CI the test skips where podman or the image is missing, naming the script that builds it; in CI (CI=true,
.ci/run builds the image first) a missing podman or image fails it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from bertzoo.serving.client import BertzooClient
from bertzoo.serving.proto import pb2
from conftest import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("BERTZOO_IMAGE", "localhost/bertzoo-serve:cpu")
BUILD = "bash deploy/docker/build_cpu_image.sh"
SHUTDOWN_GRACE = 10  # the server's drain (--shutdown-grace); podman sends SIGKILL only after STOP_TIMEOUT
QUEUE_DELAY_MS = 600
STOP_TIMEOUT = 40


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    # The runtime settings the VMs need (deploy/docker/podman.conf) unless the caller's environment names its own.
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF",
                                                           str(ROOT / "deploy" / "docker" / "podman.conf"))}
    result = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
    return result


@pytest.fixture(scope="session")
def image() -> str:
    """The image's name; a skip (in CI a failure) where podman or the image is missing, before the artifact is built
    (a session fixture named before tiny_artifact is set up before it)."""
    in_ci = os.environ.get("CI") == "true"
    if shutil.which("podman") is None:
        reason = f"podman is not installed ({BUILD} installs it and builds the image)"
    elif podman("image", "exists", IMAGE, check=False).returncode != 0:
        reason = f"the image {IMAGE} is not built ({BUILD} builds it)"
    else:
        return IMAGE
    if in_ci:
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


def readable_copy(artifact: Path, destination: Path) -> Path:
    """The artifact, readable by the image's user (uid 10001): pytest's temporary folders are the owner's alone."""
    shutil.copytree(artifact, destination)
    for path in [destination, *destination.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IRGRP | stat.S_IROTH | (stat.S_IXGRP | stat.S_IXOTH if path.is_dir() else 0))
    return destination


def wait_healthy(name: str, timeout: float = 150) -> int:
    """Runs the image's HEALTHCHECK command until it passes; the number of runs it took."""
    deadline = time.monotonic() + timeout
    runs = 0
    while True:
        runs += 1
        check = podman("healthcheck", "run", name, check=False, timeout=30)
        if check.returncode == 0:
            return runs
        state = podman("inspect", name, "--format", "{{.State.Status}}").stdout.strip()
        if state != "running":
            raise AssertionError(f"the container is {state} before it was healthy:\n"
                                 f"{podman('logs', name, check=False).stderr[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"HEALTHCHECK still failing after {timeout} s ({check.stdout.strip()} "
                                 f"{check.stderr.strip()}):\n{podman('logs', name, check=False).stderr[-3000:]}")
        time.sleep(1)


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def test_cpu_image_serves_every_rpc_through_published_ports_and_drains_on_sigterm(image, tiny_artifact, tmp_path):
    _, artifact = tiny_artifact
    model = readable_copy(artifact, tmp_path / "model")
    name = f"bertzoo-test-{uuid.uuid4().hex[:10]}"
    grpc_port, metrics_port, http_port = free_port(), free_port(), free_port()
    try:
        podman("run", "--detach", "--name", name,
               "--publish", f"127.0.0.1:{grpc_port}:50051", "--publish", f"127.0.0.1:{metrics_port}:9400",
               "--publish", f"127.0.0.1:{http_port}:8000",
               "--volume", f"{model}:/models/bertzoo:ro",
               # Single-thread engine instances: the tests share 2 cores.
               "--env", "BERTZOO_THREADS=1", "--env", "BERTZOO_INSTANCES=1",
               "--env", f"BERTZOO_SHUTDOWN_GRACE={SHUTDOWN_GRACE}",
               # An idle engine holds a lone request this long for company: the call sent before SIGTERM is still in
               # flight when the signal comes.
               "--env", f"BERTZOO_MAX_QUEUE_DELAY_MS={QUEUE_DELAY_MS}",
               # No timer runs the HEALTHCHECK (no systemd here): this test runs it with `podman healthcheck run`.
               "--health-interval", "disable",
               image)
        # The image's own HEALTHCHECK (kept by --format docker), not one of ours.
        healthcheck = podman("inspect", name, "--format", "{{json .Config.Healthcheck.Test}}").stdout
        assert '"bertzoo","client","health"' in healthcheck.replace(" ", ""), healthcheck
        wait_healthy(name)
        assert podman("inspect", name, "--format", "{{.Config.User}}").stdout.strip() == "10001"

        with BertzooClient(f"127.0.0.1:{grpc_port}", timeout=30) as client:
            assert client.health() == "SERVING"
            info = client.model_info()
            assert set(info.tasks) >= {"sentiment", "paraphrase", "similarity", "qa"}, info.tasks
            assert info.device == "cpu" and info.backend and info.variant and info.precision
            assert info.runtime_versions and info.embedding_dimensions > 0

            sentiment = client.sentiment(["a fine film", "a dull film"])
            assert len(sentiment.results) == 2
            assert all(r.label in info.sentiment_labels and len(r.probabilities) == len(info.sentiment_labels)
                       for r in sentiment.results)
            pairs = [("how do I learn python?", "how can I learn python?")]
            paraphrase = client.paraphrase(pairs)
            assert len(paraphrase.results) == 1 and 0 <= paraphrase.results[0].probability <= 1
            similarity = client.similarity(pairs)
            assert len(similarity.results) == 1 and 0 <= similarity.results[0].score <= 5
            context = "the home team won the match on sunday."
            qa = client.qa([("who won?", context)])
            answer = qa.results[0]
            assert answer.answer == (context[answer.start_char:answer.end_char] if answer.start_char >= 0 else "")
            embed = client.embed(["one sentence", "another one"])
            assert embed.dimensions == info.embedding_dimensions
            assert [len(e.values) for e in embed.embeddings] == [info.embedding_dimensions] * 2

            # Each task's stream: two requests, two answers, in order.
            requests = {"Sentiment": pb2.SentimentRequest(texts=["streamed"]),
                        "Paraphrase": pb2.ParaphraseRequest(pairs=[pb2.TextPair(text_a="a", text_b="b")]),
                        "Similarity": pb2.SimilarityRequest(pairs=[pb2.TextPair(text_a="a", text_b="b")]),
                        "QA": pb2.QARequest(items=[pb2.QAItem(question="who won?", context=context)]),
                        "Embed": pb2.EmbedRequest(texts=["streamed"])}
            for method, request in requests.items():
                answers = list(client.stream(method, iter([request, request]), timeout=30))
                assert [m.WhichOneof("result") for m in answers] == ["response"] * 2, (method, answers)

        # The HTTP port: OpenAI's embeddings route answers as the Embed RPC did.
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/embeddings",
                                         data=json.dumps({"input": ["one sentence"]}).encode())
        with urllib.request.urlopen(request, timeout=30) as reply:
            embedded = json.loads(reply.read())
        assert len(embedded["data"][0]["embedding"]) == info.embedding_dimensions

        metrics = metrics_text(metrics_port)
        assert "bertzoo_ready 1.0" in metrics
        for task in ("sentiment", "paraphrase", "similarity", "qa", "embed"):
            assert f'bertzoo_requests_total{{code="OK",protocol="grpc",task="{task}"}}' in metrics, task

        # SIGTERM (the image's STOPSIGNAL) with a call in flight: the server answers it, then exits 0 before
        # podman's SIGKILL.
        with BertzooClient(f"127.0.0.1:{grpc_port}", timeout=30) as client:
            in_flight = client.stub.Sentiment.future(pb2.SentimentRequest(texts=["sent before the stop"]), timeout=30)
            answered_at = []
            in_flight.add_done_callback(lambda _: answered_at.append(time.monotonic()))
            time.sleep(0.05)
            started = time.monotonic()
            podman("stop", "--time", str(STOP_TIMEOUT), name, timeout=STOP_TIMEOUT + 30)
            took = time.monotonic() - started
            assert len(in_flight.result(timeout=5).results) == 1  # answered, not cut
        assert answered_at and answered_at[0] > started  # it was still waiting when the stop began
        exit_code = podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
        logs = podman("logs", name, check=False)
        assert exit_code == "0", f"exit status {exit_code} after {took:.1f} s:\n{logs.stderr[-3000:]}"
        assert took < SHUTDOWN_GRACE + 10, f"stopping took {took:.1f} s"
        assert "stop signal" in logs.stdout + logs.stderr
    finally:
        podman("rm", "--force", "--time", "0", name, check=False, timeout=60)
