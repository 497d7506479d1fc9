"""gRPC server interceptors: checks that run before a handler, on every call.

- :class:`BearerTokenInterceptor`: a call must carry ``authorization: Bearer <token>`` metadata, or it is answered
  UNAUTHENTICATED. Some methods (health checks, for load balancers and orchestrators that cannot send a token) can
  stay open.
- :class:`MalformedRequestInterceptor`: request bytes that are not a valid message, for any unary method (health
  checks included) and on bertzoo's request streams, are answered INVALID_ARGUMENT (left to gRPC, they would be
  UNKNOWN and log a traceback per request, even on the open health service), and a request over the size limit
  RESOURCE_EXHAUSTED, naming the limit (left to gRPC, it would never be counted).

``on_reject(method, code, reason)`` lets the server count refused calls in its metrics.
"""

from __future__ import annotations

import hmac
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Collection

import grpc
from google.protobuf.message import DecodeError

SCHEME = "bearer"  # RFC 6750: the scheme name is case-insensitive
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]
OnReject = Callable[[str, grpc.StatusCode, str], None]


def _denying(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind (unary / streaming) as ``handler`` that only aborts the call."""

    async def deny(_request_or_iterator, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, details)

    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    return grpc.unary_unary_rpc_method_handler(deny, **kwargs)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str, open_methods: Collection[str] = (), on_reject: OnReject | None = None) -> None:
        """``open_methods``: full method names (``/grpc.health.v1.Health/Check``) served without a token."""
        self._expected = f"{SCHEME} {token}".encode()
        self._open = frozenset(open_methods)
        self._on_reject = on_reject

    def _refusal(self, metadata: tuple | None) -> str | None:
        """Why the call's credentials are refused, or None: exactly one ``authorization`` value, the token's. Two
        values (a right one and a wrong one, in either order) are an ambiguous credential, not a credential: which
        one a proxy or a framework in front reads is not ours to guess."""
        given = [value for key, value in metadata or () if key == "authorization"]  # gRPC lowercases metadata keys
        if len(given) > 1:
            return f"ambiguous credentials: {len(given)} 'authorization' metadata entries; send exactly one"
        if given:
            value = given[0].encode() if isinstance(given[0], str) else given[0]
            scheme, _, token = value.partition(b" ")
            # Constant-time comparison: the reply time must not tell how much of a guess was right.
            if hmac.compare_digest(scheme.lower() + b" " + token.strip(), self._expected):
                return None
        return "missing or invalid credentials: send metadata 'authorization: Bearer <token>'"

    async def intercept_service(self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
                                ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method in self._open:
            return handler
        refusal = self._refusal(handler_call_details.invocation_metadata)
        if refusal is None:
            return handler
        if self._on_reject is not None:
            self._on_reject(method, grpc.StatusCode.UNAUTHENTICATED, "unauthenticated")
        return _denying(handler, grpc.StatusCode.UNAUTHENTICATED, refusal)


class BadMessage(Exception):
    """Request bytes the server will not parse: the status to answer."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, on_reject: OnReject | None = None, max_bytes: int | None = None) -> None:
        """Guards every unary-unary method of the server, and every message of its streaming-request methods served
        by an async generator (bertzoo's *Stream RPCs): a bad message ends the stream with the same status, once the
        handler has answered the requests before it."""
        self._on_reject = on_reject
        self._max_bytes = max_bytes
        # The guarded handler of each method, made at its first call: it depends on the method alone, and building it
        # anew for every call was a measurable share of a lone request's event-loop time.
        self._guarded: dict[str, grpc.RpcMethodHandler] = {}

    def _parse(self, method: str, parse: Callable[[bytes], object], raw: bytes) -> object:
        """The message in ``raw``, or :class:`BadMessage` with the status that says what is wrong with it."""
        if self._max_bytes is not None and len(raw) > self._max_bytes:
            if self._on_reject is not None:
                self._on_reject(method, grpc.StatusCode.RESOURCE_EXHAUSTED, "message_too_large")
            raise BadMessage(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"the request is {len(raw)} bytes, over the server's limit of {self._max_bytes} "
                             "(--max-message-bytes); send fewer or shorter texts per request")
        try:
            return parse(raw)
        except DecodeError as e:
            if self._on_reject is not None:
                self._on_reject(method, grpc.StatusCode.INVALID_ARGUMENT, "malformed")
            raise BadMessage(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid message: {e}") from e

    async def intercept_service(self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
                                ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method in self._guarded:
            return self._guarded[method]
        handler = await continuation(handler_call_details)
        guarded = self._guard(method, handler)
        if handler is not None:  # an unknown method stays uncached: a client could send any number of names
            self._guarded[method] = guarded
        return guarded

    def _guard(self, method: str, handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        if handler is None or handler.request_deserializer is None:
            return handler
        parse, check = handler.request_deserializer, self._parse
        # The handler now gets raw bytes and parses them itself, where a failure can become a proper status.
        if not handler.request_streaming and not handler.response_streaming:
            behavior = handler.unary_unary

            async def parse_then_handle(raw: bytes, context: grpc.aio.ServicerContext):
                try:
                    request = check(method, parse, raw)
                except BadMessage as e:
                    await context.abort(e.code, e.details)
                return await behavior(request, context)

            return grpc.unary_unary_rpc_method_handler(parse_then_handle, request_deserializer=None,
                                                       response_serializer=handler.response_serializer)
        if handler.request_streaming and handler.response_streaming and inspect.isasyncgenfunction(
                handler.stream_stream):
            stream_behavior = handler.stream_stream

            # A bad message ends the reading; the handler answers the requests before it, then the stream ends.
            async def parse_each_then_handle(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext):
                async def requests():
                    async for raw in raws:
                        yield check(method, parse, raw)

                try:
                    async for response in stream_behavior(requests(), context):
                        yield response
                except BadMessage as e:
                    await context.abort(e.code, e.details)

            return grpc.stream_stream_rpc_method_handler(parse_each_then_handle, request_deserializer=None,
                                                         response_serializer=handler.response_serializer)
        return handler
