"""HTTP/1.1 JSON routes beside the gRPC port (``--http-port``), served by the same process as the gRPC RPCs (each
front end, or the one process) through the same servicer: the same task service, tokenization, limits, batching,
request metrics and errors. aiohttp runs them on the process's own event loop (uvloop where installed) with its C
HTTP parser; no HTTP is parsed here.

Routes:

- ``POST /v1/embeddings`` and ``GET /v1/models``: OpenAI's embeddings API, for the clients and frameworks made for it;
- ``POST /sentiment``, ``/paraphrase``, ``/similarity``, ``/qa``, ``/embed``: each RPC's request and answer as JSON
  (protobuf's JSON mapping with the .proto's field names: what ``bertzoo client`` prints);
- ``GET /health``: 200 while the server is SERVING (after warm-up, not while draining), 503 otherwise;
  ``GET /info``: ModelInfo as JSON;
- ``/v2/...``: the KServe v2 protocol for Triton's and KServe's clients (serving/kserve.py).

A failure answers with the HTTP status of its gRPC code and one line naming the field or limit: under ``/v1`` as
OpenAI's error object, elsewhere ``{"error": message, "code": GRPC_CODE}``. With ``--auth-token`` every route but
``/health`` needs exactly one ``Authorization: Bearer`` header. A request's ``X-Request-Timeout`` header (seconds) is
its deadline, as a gRPC call's: past it the answer is 504 and its work is dropped. A body must arrive within
``http_request.BODY_SECONDS`` (or the deadline, if sooner), else 408: a client trickling its body holds nothing long.
Requests count in the same metrics series as the RPCs, under ``protocol="http"``.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
from aiohttp import web
from google.protobuf import json_format

from .config import ServeConfig
from .errors import HTTP_STATUS, InvalidRequest, ServingError
from .http_request import http_call, read_body, status_of
from .kserve import KServeRoutes
from .metrics import Metrics
from .proto import answer_fields
from .servicer import REQUEST_TYPES, BertzooServicer, Failure, HttpCall
from .tasks_service import TaskService

log = logging.getLogger("bertzoo.serving")

# OpenAI's error types for each status (its API reference's error codes).
OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                      413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error", 504: "server_error"}
OPEN_PATHS = ("/health", "/v2/health/live", "/v2/health/ready")
def error_response(path: str, status: int, message: str, code: str) -> web.Response:
    if path.startswith("/v1/"):
        body = {"error": {"message": message, "type": OPENAI_ERROR_TYPES.get(status, "server_error"), "param": None,
                          "code": code.lower()}}
    else:
        body = {"error": message, "code": code}
    return web.json_response(body, status=status)


class HttpRoutes:
    """The routes, over the gRPC server's servicer (its per-request metrics and error mapping) and health state."""

    def __init__(self, config: ServeConfig, servicer: BertzooServicer, metrics: Metrics,
                 service: Callable[[], TaskService | None], serving: Callable[[], bool]) -> None:
        self._config, self._servicer, self._metrics = config, servicer, metrics
        self._service, self._serving = service, serving
        self.model_id = Path(config.model_dir).name or "bertzoo"

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self._config.message_limit, middlewares=[self._guard])
        app.router.add_post("/v1/embeddings", self.openai_embeddings)
        app.router.add_get("/v1/models", self.openai_models)
        for task in REQUEST_TYPES:
            app.router.add_post(f"/{task}", self.task)
        app.router.add_get("/health", self.health)
        app.router.add_get("/info", self.info)
        KServeRoutes(self._servicer, self._service, self._serving).add_to(app)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        """Auth first; every error, aiohttp's own (404, 405, 413) included, as JSON of the route's kind."""
        if self._config.auth_token and request.path not in OPEN_PATHS:
            given = request.headers.getall("Authorization", [])
            if len(given) != 1 or not hmac.compare_digest(given[0].encode(), f"Bearer {self._config.auth_token}".encode()):
                why = ("more than one authorization header" if len(given) > 1 else
                       "missing or wrong bearer token (Authorization: Bearer <token>)")
                self._metrics.record_refused(request.path.strip("/"), "UNAUTHENTICATED", "unauthenticated", "http")
                return error_response(request.path, 401, why, "UNAUTHENTICATED")
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            code = {413: "RESOURCE_EXHAUSTED", 404: "NOT_FOUND", 405: "INVALID_ARGUMENT"}.get(e.status, "INVALID_ARGUMENT")
            message = (f"the request body is over {self._config.message_limit} bytes (--max-message-bytes)"
                       if e.status == 413 else f"{e.reason}: {request.method} {request.path}")
            return error_response(request.path, e.status, message, code)
        except Exception:  # a bug: logged here, and the client gets one line, not aiohttp's page
            log.exception("HTTP %s %s: unexpected error", request.method, request.path)
            return error_response(request.path, 500, "internal server error (details in the server log)", "INTERNAL")

    async def _body(self, request: web.Request, call: HttpCall) -> dict:
        try:
            body = json.loads(await read_body(request, call))
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidRequest(f"the body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise InvalidRequest(f"the body must be a JSON object, got {type(body).__name__}")
        return body

    async def _answer(self, request: web.Request, task: str, call: HttpCall, answer) -> web.Response | object:
        """The servicer's answer for one request (metrics recorded there), or the error response."""
        result = await self._servicer.serve_http(task, call, answer)
        if isinstance(result, Failure):
            return error_response(request.path, HTTP_STATUS.get(result.code, 500), result.message, result.code)
        return result

    async def _message_answer(self, request: web.Request, task: str, call: HttpCall, answer) -> web.Response:
        """An answer that is a response message, as its JSON fields (or the error response)."""
        result = await self._answer(request, task, call, answer)
        return result if isinstance(result, web.Response) else web.json_response(answer_fields(result))

    async def task(self, request: web.Request) -> web.Response:
        task = request.path.strip("/")
        try:
            call = http_call(request)
            message = json_format.ParseDict(await self._body(request, call), REQUEST_TYPES[task]())
        except (ServingError, json_format.ParseError) as e:
            return self._refused(request, task, e)
        return await self._message_answer(request, task, call, self._servicer.answer(task, message))

    def _refused(self, request: web.Request, task: str, error: Exception) -> web.Response:
        """A request that never reached the servicer: a body too slow, or one not understood (counted as the
        servicer counts a malformed message)."""
        if isinstance(error, ServingError) and not isinstance(error, InvalidRequest):
            code, reason, status = error.code, error.reason, status_of(error)
        else:
            code, reason, status = "INVALID_ARGUMENT", "malformed", 400
        self._metrics.record_refused(task, code, reason, "http")
        return error_response(request.path, status, str(error).splitlines()[0], code)

    async def openai_embeddings(self, request: web.Request) -> web.Response:
        try:
            call = http_call(request)
            texts, encoding = self._openai_input(await self._body(request, call))
        except ServingError as e:
            return self._refused(request, "embed", e)

        async def answer(service: TaskService, timeout: float | None):
            return await service.embed(texts, timeout)

        result = await self._answer(request, "embed", call, answer)
        if isinstance(result, web.Response):
            return result
        vectors, timing = result
        data = [{"object": "embedding", "index": i,
                 "embedding": vector.tolist() if encoding == "float"
                 else base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode()}
                for i, vector in enumerate(vectors)]
        return web.json_response({"object": "list", "data": data, "model": self.model_id,
                                  "usage": {"prompt_tokens": timing.tokens, "total_tokens": timing.tokens}})

    def _openai_input(self, body: dict) -> tuple[list[str], str]:
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise InvalidRequest("input must be a string or a non-empty list of strings (token arrays are not taken)")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise InvalidRequest(f"encoding_format must be 'float' or 'base64', got {encoding!r}")
        dimensions = body.get("dimensions")
        service = self._service()
        if dimensions is not None and (service is None or dimensions != service.spec.hidden_size):
            size = "the model's" if service is None else str(service.spec.hidden_size)
            raise InvalidRequest(f"dimensions: this model's embeddings have {size} dimensions and are not shortened; "
                                 "leave dimensions out")
        return texts, encoding

    async def openai_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_id, "object": "model", "created": 0,
                                                              "owned_by": "bertzoo"}]})

    async def health(self, request: web.Request) -> web.Response:
        serving = self._serving()
        return web.json_response({"status": "SERVING" if serving else "NOT_SERVING"}, status=200 if serving else 503)

    async def info(self, request: web.Request) -> web.Response:
        try:
            call = http_call(request)
        except ServingError as e:
            return self._refused(request, "model_info", e)
        return await self._message_answer(request, "model_info", call, self._servicer.model_info_answer())


class HttpServer:
    """The routes on ``host:port``; ``reuse_port`` beside the other front ends of one server."""

    def __init__(self, routes: HttpRoutes, config: ServeConfig) -> None:
        self._config = config
        self._runner = web.AppRunner(routes.application(), access_log=None, shutdown_timeout=config.shutdown_grace)

    def _tls(self) -> ssl.SSLContext | None:
        """The gRPC port's TLS settings, client certificates (mTLS) included."""
        config = self._config
        if not config.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(config.tls_cert), str(config.tls_key))
        if config.tls_client_ca:
            context.load_verify_locations(str(config.tls_client_ca))
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    async def start(self, host: str, port: int, reuse_port: bool) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True, reuse_port=reuse_port,
                           ssl_context=self._tls())
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            raise OSError(f"could not listen on {host}:{port} for HTTP: {e.strerror or e} (--http-port; 0 turns "
                          "it off)") from None

    async def stop(self) -> None:
        """Stop accepting connections, let the requests in flight finish (up to the grace), close."""
        await self._runner.cleanup()
