"""Shared fixtures: tiny random encoders for speed, the real MiniLM only where a test says so."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from bertzoo.datafiles import samples_dir


@pytest.fixture(scope="session", autouse=True)
def cache_of_this_session(tmp_path_factory):
    """Caches the suite fills (serve --backend auto's engine choice, OpenVINO's compiled models) in a folder of the
    session, inherited by the servers it starts: never the user's ~/.cache, and no choice measured on another day."""
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if previous is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = previous


TINY_ENCODER = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 512,
}


def padded_and_packed_grads(encoder, ids, mask, weights, bf16: bool = False) -> tuple[dict, dict]:
    """Every encoder parameter's gradient of one loss that weighs each real token's state differently: from the
    padded batch, then from the same batch packed (bf16 autocast on the batch's device where asked)."""
    import torch

    real = mask.bool()

    def grads(pack: bool) -> dict:
        encoder.zero_grad()
        with torch.autocast(ids.device.type, torch.bfloat16, enabled=bf16):
            states = encoder(ids, mask, pack=pack).last_hidden_state
        (states[real].float() * weights[real]).sum().backward()
        return {name: p.grad.float().clone() for name, p in encoder.named_parameters() if p.grad is not None}

    return grads(False), grads(True)


@pytest.fixture
def tiny_train_config(tmp_path):
    """A TrainConfig for a tiny random encoder on the bundled samples: seconds, not minutes."""
    from bertzoo.trainer.config import TrainConfig

    def make(**overrides):
        values = dict(
            out_dir=str(tmp_path / "run"), random_init=True, encoder_overrides=dict(TINY_ENCODER),
            limit_per_task=24, eval_limit_per_task=12, batch_size=4, epochs=2, lr=1e-3, qa_max_length=128,
            qa_doc_stride=32, progress=False, log_every=1,
        )
        values.update(overrides)
        return TrainConfig(**values)

    return make


def raise_on_call(monkeypatch, owner, name: str, at_call: int):
    """Replace ``owner.name`` so that its ``at_call``-th call raises KeyboardInterrupt, where a killed process would
    stop; returns the real function, to put back."""
    real, calls = getattr(owner, name), {"n": 0}

    def crash(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, crash)
    return real


def interrupt_training(monkeypatch, config, at_loss_call: int) -> None:
    """Train with ``config`` until its ``at_loss_call``-th task loss, and raise KeyboardInterrupt there, as a killed
    run would stop; the run directory keeps whatever checkpoints were written before."""
    from bertzoo.trainer import train as train_module

    real_loss = raise_on_call(monkeypatch, train_module, "task_loss", at_loss_call)
    with pytest.raises(KeyboardInterrupt):
        train_module.train(config)
    monkeypatch.setattr(train_module, "task_loss", real_loss)


def multitask_batch():
    """Token ids for a MultitaskModel forward: 6 sentences of 9 tokens (3 pairs for the pair tasks), one padded."""
    import torch

    ids = torch.randint(1000, 2000, (6, 9))
    mask = torch.ones(6, 9, dtype=torch.long)
    mask[2, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="session")
def samples():
    return samples_dir()


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory):
    """(run dir, artifact dir) of a tiny random model trained 4 steps and exported (fp32 graphs): built once per
    session for the serving tests (about 15 s)."""
    from bertzoo.export.exporter import ExportOptions, export_checkpoint

    root = tmp_path_factory.mktemp("served")
    train_tiny_run(root / "run")
    export_checkpoint(root / "run", root / "artifact", ExportOptions(parity_limit=8))
    return root / "run", root / "artifact"


def train_tiny_run(out_dir: Path) -> None:
    """The tiny random model of ``tiny_artifact``, trained 4 steps on the bundled samples (fixed seed). Its weights
    carry the training CPU's float summation order, so no stored output is compared with it (tests/golden_model.py
    has the golden outputs' model)."""
    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.train import train

    train(TrainConfig(out_dir=str(out_dir), random_init=True, encoder_overrides=dict(TINY_ENCODER), limit_per_task=16,
                      batch_size=4, max_steps=4, lr=1e-3, qa_max_length=128, qa_doc_stride=32, progress=False,
                      eval_every_epoch=False))


TINY_SERVER_MAX_ITEMS = 8


@pytest.fixture(scope="module")
def tiny_server(tiny_artifact):
    """(running ServerThread, client) of the tiny artifact, at most TINY_SERVER_MAX_ITEMS items a request: one per
    test module that only calls it (fuzzing, the command-line client)."""
    from bertzoo.serving.client import BertzooClient
    from bertzoo.serving.grpc_server import ServerThread

    _, artifact = tiny_artifact
    with ServerThread(serve_config(artifact, max_items=TINY_SERVER_MAX_ITEMS)) as running, \
            BertzooClient(f"127.0.0.1:{running.port}") as client:
        yield running, client


class ControlledBackend:
    """Wraps the real backend: a delay per encoder pass, a one-shot failure, and the batch size of every pass."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.delay = 0.0
        self.fail_next = False
        self.batch_rows: list[int] = []
        self.batch_shapes: list[tuple[tuple[int, int], list[int]]] = []  # (input_ids shape, real length per row)
        self.lock = threading.Lock()

    def encode(self, batch):
        with self.lock:
            self.batch_rows.append(batch["input_ids"].shape[0])
            self.batch_shapes.append((batch["input_ids"].shape, batch["attention_mask"].sum(axis=1).tolist()))
            fail, self.fail_next = self.fail_next, False
        time.sleep(self.delay)
        if fail:
            raise RuntimeError("injected backend failure")
        return self.inner.encode(batch)

    def head(self, task, inputs):
        return self.inner.head(task, inputs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_config(model_dir, **overrides):
    """A ServeConfig for tests: loopback, any free port, no metrics endpoint and no HTTP port (a test that wants one
    names a free port), one backend thread without spinning (the tests share 2 cores)."""
    from bertzoo.serving.config import ServeConfig

    return ServeConfig(str(model_dir), **{"host": "127.0.0.1", "port": 0, "metrics_port": 0, "http_port": 0, "threads": 1,
                                          "ort_spinning": False, **overrides})


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for localhost / 127.0.0.1 (the TLS tests), written to ``directory``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


EXPECTED_SKIPS = Path(__file__).with_name("expected_skips.txt")


def pytest_sessionfinish(session, exitstatus) -> None:
    """In CI (CI=true), fail the run on any skip whose reason is not on tests/expected_skips.txt."""
    if os.environ.get("CI") != "true":
        return
    expected = [line.strip() for line in EXPECTED_SKIPS.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    unexpected = sorted({report.longrepr[2] for report in skipped if isinstance(report.longrepr, tuple)
                         and not any(pattern in report.longrepr[2] for pattern in expected)})
    if unexpected:
        reporter.write_line(f"CI: {len(unexpected)} unexpected skip reasons (tests/expected_skips.txt lists the "
                            "expected ones):", red=True)
        for reason in unexpected:
            reporter.write_line(f"  {reason}", red=True)
        session.exitstatus = 1
