"""Errors of the serving core, one per way a request can fail, each naming its gRPC status code.

The core (batcher, task service) raises these and knows nothing of gRPC; the transport (grpc_server.py) turns each
into its status code and message, and the metrics count failures by ``code`` and ``reason``.
"""

from __future__ import annotations


class ServingError(Exception):
    """A request failed; ``str(error)`` is the message for the client."""

    code = "INTERNAL"  # a grpc.StatusCode name
    reason = "internal"  # a short, fixed label for the failure counter (never user input: label cardinality)

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class InvalidRequest(ServingError):
    """Bad input; the message names the field (``texts[3]``) and the limit it broke."""

    code = "INVALID_ARGUMENT"
    reason = "invalid_argument"


class QueueFull(ServingError):
    code = "RESOURCE_EXHAUSTED"
    reason = "queue_full"


class Unavailable(ServingError):
    """The model is not loaded yet, or the server is shutting down."""

    code = "UNAVAILABLE"
    reason = "unavailable"


class DeadlineExceeded(ServingError):
    """The request's deadline passed while it waited; it was dropped before any compute."""

    code = "DEADLINE_EXCEEDED"
    reason = "deadline"


class SlowBody(ServingError):
    """An HTTP request's body did not arrive in time: 408, and its connection is freed for others."""

    code = "DEADLINE_EXCEEDED"
    reason = "slow_body"
    http_status = 408


class BackendFailure(ServingError):
    """The backend raised on a batch; every request with an item in that batch fails with this."""

    code = "INTERNAL"
    reason = "backend"


# The HTTP status of each gRPC status code, for the HTTP routes (serving/http_server.py, serving/kserve.py): as
# grpc-gateway maps them, and 499 for a request its client gave up on.
HTTP_STATUS = {"INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "NOT_FOUND": 404, "RESOURCE_EXHAUSTED": 429,
               "CANCELLED": 499, "INTERNAL": 500, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}
