"""`bertzoo client health` as a probe: its exit code against a real server in each state a script, a container
HEALTHCHECK or a Kubernetes exec probe meets (loading, serving, draining, an unknown service, TLS trouble, nothing
listening)."""

from __future__ import annotations

import threading
import time

import pytest
from click.testing import CliRunner

from bertzoo.cli import main
from conftest import free_port, self_signed, serve_config


def health(port: int, *args: str):
    result = CliRunner().invoke(main, ["client", "health", "--target", f"127.0.0.1:{port}", "--timeout", "5", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


class Gate:
    """A loader, or a backend's encode, that waits until the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()


def test_exit_codes_while_loading_serving_and_for_an_unknown_service(tiny_artifact):
    from bertzoo.serving.grpc_server import ServerThread
    from bertzoo.serving.model import load_served_model

    _, artifact = tiny_artifact
    gate = Gate()

    def slow_loader(config):
        gate.open.wait(60)
        return load_served_model(config)

    running = ServerThread(serve_config(artifact), slow_loader)
    starting = threading.Thread(target=running.start)
    starting.start()
    try:
        for _ in range(200):  # until the port is bound (health answers NOT_SERVING from then on)
            if running.server.port:
                break
            time.sleep(0.05)
        code, out, err = health(running.port)
        assert code == 4 and "NOT_SERVING" in err and out == ""

        gate.open.set()
        code, out, _ = health(running.port, "--wait", "60")  # what a script waiting for readiness runs
        assert code == 0 and '"SERVING"' in out
        assert health(running.port, "--service", "bertzoo.v1.Bertzoo")[0] == 0
        code, _, err = health(running.port, "--service", "no.such.Service")
        assert code == 4 and "SERVICE_UNKNOWN" in err
    finally:
        gate.open.set()
        starting.join()
        running.stop(0)
    code, _, err = health(running.port)  # stopped: nothing listens
    assert code == 2 and "cannot reach" in err


def test_draining_server_is_not_healthy(tiny_artifact):
    """After SIGTERM's drain begins, while an accepted call still runs, the probe fails (the server takes no new calls)."""
    from bertzoo.serving.client import BertzooClient
    from bertzoo.serving.grpc_server import ServerThread
    from bertzoo.serving.model import load_served_model

    _, artifact = tiny_artifact
    gate = Gate()

    class HeldBackend:
        def __init__(self, backend) -> None:
            self._backend = backend

        def encode(self, batch):
            gate.open.wait(60)
            return self._backend.encode(batch)

        def head(self, task, inputs):
            return self._backend.head(task, inputs)

    def loader(config):
        served = load_served_model(config)
        served.backend = HeldBackend(served.backend)
        return served

    running = ServerThread(serve_config(artifact, warmup=False), loader).start()
    with BertzooClient(f"127.0.0.1:{running.port}") as client:
        call = threading.Thread(target=client.sentiment, args=(["held until the gate opens"],))
        call.start()
        time.sleep(0.5)
        stopping = threading.Thread(target=running.stop, args=(30,))
        stopping.start()
        time.sleep(0.5)
        try:
            code, _, err = health(running.port)
            assert code in (2, 4), err
        finally:
            gate.open.set()
            call.join()
            stopping.join()


def test_tls_failure_has_its_own_exit_code(tiny_artifact, tmp_path):
    from bertzoo.serving.grpc_server import ServerThread

    _, artifact = tiny_artifact
    cert, key = self_signed(tmp_path)
    with ServerThread(serve_config(artifact, tls_cert=str(cert), tls_key=str(key), auth_token="s3cret")) as running:
        # TLS with the system roots, which do not trust the server's self-signed certificate.
        code, _, err = health(running.port, "--tls")
        assert code == 5 and "TLS" in err
        # Trusting it: SERVING, with or without a (wrong) token, since health checks are open to orchestrators.
        assert health(running.port, "--tls-ca", str(cert))[0] == 0
        assert health(running.port, "--tls-ca", str(cert), "--token", "wrong")[0] == 0


def test_nothing_listening_and_bad_arguments():
    code, _, err = health(free_port())
    assert code == 2 and "cannot reach" in err and "Traceback" not in err
    code, _, _ = health(free_port(), "--wait", "-1")
    assert code == 2  # click's usage error


@pytest.mark.parametrize("wait", ["0.6"])
def test_wait_gives_up_with_the_last_reason(wait):
    started = time.monotonic()
    code, _, err = health(free_port(), "--wait", wait)
    assert code == 2 and 0.5 <= time.monotonic() - started < 5


def test_a_server_without_the_health_service_is_an_rpc_failure():
    """A gRPC server that answers, but not the health protocol (UNIMPLEMENTED): exit code 3, not 'cannot connect'."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        code, _, err = health(port)
    finally:
        server.stop(0)
    assert code == 3 and "UNIMPLEMENTED" in err
