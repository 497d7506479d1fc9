"""What every HTTP route reads the same way: the request's deadline and its body, and an error's HTTP status."""

from __future__ import annotations

import asyncio

from aiohttp import web

from .errors import HTTP_STATUS, InvalidRequest, ServingError, SlowBody
from .servicer import HTTP_TIMEOUT_HEADER, HttpCall

BODY_SECONDS = 30.0  # a body must arrive within this, or within the request's deadline if sooner


def http_call(request: web.Request) -> HttpCall:
    """The request's call context: its deadline from ``X-Request-Timeout`` (seconds > 0), where given."""
    given = request.headers.get(HTTP_TIMEOUT_HEADER)
    if given is None:
        return HttpCall()
    try:
        timeout = float(given)
    except ValueError:
        timeout = float("nan")
    if not 0 < timeout < float("inf"):
        raise InvalidRequest(f"{HTTP_TIMEOUT_HEADER} must be a number of seconds > 0, got {given[:40]!r}")
    return HttpCall(timeout)


async def read_body(request: web.Request, call: HttpCall) -> bytes:
    """The whole body, or :class:`SlowBody` when it does not arrive within BODY_SECONDS or the request's deadline."""
    remaining = call.time_remaining()
    seconds = BODY_SECONDS if remaining is None else min(BODY_SECONDS, remaining)
    try:
        return await asyncio.wait_for(request.read(), seconds)
    except asyncio.TimeoutError:
        raise SlowBody(f"the request body did not arrive within {seconds:.3g} s") from None


def status_of(error: ServingError) -> int:
    return getattr(error, "http_status", None) or HTTP_STATUS.get(error.code, 500)
