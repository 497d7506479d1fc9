"""``bertzoo client health`` as a probe for scripts, container HEALTHCHECKs and Kubernetes exec probes: one health
check (or checks until SERVING) turned into an exit code that says what went wrong, with grpc_health_probe's codes
where it has one. Apart from the clients: a probe reports what it saw, and reads only a client's ``health``.
"""

from __future__ import annotations

import time
from typing import Protocol

import grpc

from .client_channel import answers_http1, http1_reason


class HealthChecker(Protocol):
    """What a probe needs of a client: :meth:`bertzoo.serving.client.BertzooClient.health`."""

    def health(self, service: str = "", timeout: float | None = None) -> str: ...


# Exit codes of `bertzoo client health`, as grpc_health_probe's where it has one (2, 3, 4), so scripts written for
# either read the same: 0 only for SERVING.
HEALTH_SERVING = 0
HEALTH_CANNOT_CONNECT = 2  # nothing listens, the connection failed, or the deadline passed (also click's usage error)
HEALTH_RPC_FAILED = 3  # the server answered the health RPC with an error
HEALTH_NOT_SERVING = 4  # an answer other than SERVING: NOT_SERVING (loading, draining), SERVICE_UNKNOWN, UNKNOWN
HEALTH_AUTH_OR_TLS = 5  # TLS handshake failed (certificate, plaintext against TLS), or the call was not authorized
_TLS_WORDS = ("ssl", "tls", "handshake", "certificate")


def probe_health(client: HealthChecker, service: str = "", timeout: float = 5.0) -> tuple[int, str]:
    """One health check: (exit code, what happened in one line)."""
    try:
        status = client.health(service, timeout=timeout)
    except grpc.RpcError as e:
        code, details = e.code(), (e.details() or "").strip()
        if code == grpc.StatusCode.NOT_FOUND:  # the health service's answer for a service name it does not know
            return HEALTH_NOT_SERVING, f"SERVICE_UNKNOWN: no service {service!r} on this server"
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or any(
                word in details.lower() for word in _TLS_WORDS):
            return HEALTH_AUTH_OR_TLS, f"auth or TLS failure: {code.name}: {details}"
        if code == grpc.StatusCode.UNAVAILABLE and answers_http1(details):
            return HEALTH_CANNOT_CONNECT, http1_reason()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return HEALTH_CANNOT_CONNECT, f"cannot reach the server: {code.name}: {details}"
        return HEALTH_RPC_FAILED, f"health check failed: {code.name}: {details}"
    if status == "SERVING":
        return HEALTH_SERVING, status
    return HEALTH_NOT_SERVING, status


def wait_for_health(client: HealthChecker, service: str = "", wait: float = 0.0, timeout: float = 5.0,
                    interval: float = 0.25) -> tuple[int, str]:
    """Check until SERVING or ``wait`` seconds have passed (one check with ``wait=0``); the last result."""
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        result = probe_health(client, service, timeout=min(timeout, left) if left > 0.1 else timeout)
        if result[0] == HEALTH_SERVING or time.monotonic() + interval >= deadline:
            return result
        time.sleep(interval)
