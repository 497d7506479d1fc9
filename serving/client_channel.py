"""The channel every bertzoo client opens: gRPC options (retries, keepalive, message sizes, load balancing over
the addresses a target resolves to), TLS credentials with an optional client certificate (mTLS), and the bearer token
sent as metadata. Apart from the clients so that other callers (``bertzoo bench-serve``'s load generator, the tests,
the benchmarks) open channels that behave as the clients' do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc

PemSource = bytes | str | Path | None

# gRPC retries a call itself (transparently to the caller, within its deadline) when the server answers UNAVAILABLE
# (a replica starting or draining), RESOURCE_EXHAUSTED (its queue full) or CANCELLED, with exponential backoff and
# jitter. A server answers CANCELLED only while it shuts down: gRPC core cancels a call that reaches a replica in the
# instant its drain starts (accepted by the connection's GOAWAY handshake, then dropped by the stopping server; a
# proxy such as nginx passes that answer on and cannot retry it), and a replica cuts calls still running when its
# --shutdown-grace ends. Every bertzoo RPC is a pure function of its request, so another replica may answer it. A
# call this client cancels itself ends at once and is never retried. Health checks are not retried: a probe must
# report what it saw.
RETRY_SERVICE_CONFIG = {"methodConfig": [{
    "name": [{"service": "bertzoo.v1.Bertzoo"}],
    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "2s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED", "CANCELLED"]},
}]}


def channel_options(retries: bool = True, keepalive_seconds: float = 30.0) -> list[tuple[str, object]]:
    """Options of every client channel. Keepalive pings every ``keepalive_seconds`` keep an idle connection open
    through NATs and load balancers (the server accepts pings that often); 0 turns them off."""
    options: list[tuple[str, object]] = [("grpc.max_send_message_length", -1),
                                         ("grpc.max_receive_message_length", 64 << 20),
                                         ("grpc.enable_retries", int(retries))]
    # round_robin: where the target resolves to several servers (a headless Kubernetes Service, DNS with one record
    # per replica, or "ipv4:10.0.0.1:50051,10.0.0.2:50051"), calls spread over all of them instead of gRPC's default
    # of one connection to the first; with one address nothing changes.
    config: dict = {"loadBalancingConfig": [{"round_robin": {}}]}
    if retries:
        config.update(RETRY_SERVICE_CONFIG)
    options.append(("grpc.service_config", json.dumps(config)))
    if keepalive_seconds:
        options += [("grpc.keepalive_time_ms", int(keepalive_seconds * 1000)), ("grpc.keepalive_timeout_ms", 10000),
                    ("grpc.keepalive_permit_without_calls", 1)]
    return options


def _pem(source: PemSource) -> bytes | None:
    return Path(source).read_bytes() if isinstance(source, (str, Path)) else source


def channel_credentials(tls: bool = False, root_certificates: PemSource = None, certificate_chain: PemSource = None,
                        private_key: PemSource = None) -> grpc.ChannelCredentials | None:
    """TLS credentials (``root_certificates``: a PEM file or its bytes; None: the system's roots), with a client
    certificate and key for mTLS; None for a plaintext channel."""
    if not tls and root_certificates is None and certificate_chain is None:
        return None
    if (certificate_chain is None) != (private_key is None):
        raise ValueError("a client certificate needs its private key, and a key its certificate")
    return grpc.ssl_channel_credentials(root_certificates=_pem(root_certificates), private_key=_pem(private_key),
                                        certificate_chain=_pem(certificate_chain))


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token`` (``authorization: Bearer <token>``); none without a token."""
    return (("authorization", f"Bearer {token}"),) if token else ()


# gRPC's C core tells of a peer that answers in HTTP/1.x in two ways: its status line where the first HTTP/2 frame
# belongs ("Trying to connect an http1.x server"), or, from Python's http.server and so from the /metrics port of
# `bertzoo serve`, an error page sent without a status line, whose text is read as a frame header ("got frame type
# 79", the page's 'O'). A frame type that is a printable character is text, not HTTP/2.
_FIRST_FRAME = re.compile(r"Expected SETTINGS frame as the first frame, got frame type (\d+)")


def answers_http1(details: str) -> bool:
    """Whether a failed call's details say that the address answered in HTTP/1.x (a web server, a metrics port)."""
    if "http1.x server" in details:
        return True
    frame = _FIRST_FRAME.search(details)
    return frame is not None and 0x20 <= int(frame.group(1)) < 0x7F


def http1_reason() -> str:
    """What to say of an address that answers HTTP/1.x: most likely the metrics port, and where gRPC is instead."""
    from .config import ServeConfig

    defaults = ServeConfig.__dataclass_fields__
    return (f"answers HTTP/1.x, not gRPC (HTTP/2): the metrics port perhaps (serve --metrics-port, "
            f"{defaults['metrics_port'].default} by default)? `bertzoo serve` takes gRPC on port "
            f"{defaults['port'].default} by default (--target)")
