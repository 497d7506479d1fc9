"""The KServe v2 (Open Inference Protocol) routes of the HTTP port, so Triton's and KServe's own clients work as they
do against a Triton server: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/bertzoo``,
``/v2/models/bertzoo/ready`` and ``POST /v2/models/bertzoo/infer``.

The model is the text-in model of the Triton repository ``bertzoo export --triton`` writes, with its inputs and
output: TASK (once, or once per row), TEXT_A and, for pairs and QA, TEXT_B, BYTES of shape [rows, 1]; ANSWER, one
JSON object per row with the field names of the RPCs' results. Tensors come as JSON ``data`` or in the binary tensor
data extension (what ``tritonclient`` sends by default); ANSWER goes back as the request asks. Each task's rows run
through the servicer as one request of that task. Errors are ``{"error": message}`` with the HTTP status of their
gRPC code.
"""

from __future__ import annotations

import importlib.metadata
import json
import struct
from collections.abc import Callable, Mapping

from aiohttp import web

from bertzoo import tasks as T

from .errors import HTTP_STATUS, InvalidRequest, ServingError
from .http_request import http_call, read_body, status_of
from .proto import answer_fields, pb2
from .servicer import REQUEST_TYPES, BertzooServicer, Failure
from .tasks_service import TaskService

MODEL = "bertzoo"
INPUTS = ("TASK", "TEXT_A", "TEXT_B")
HEADER_LENGTH = "Inference-Header-Content-Length"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def decode_bytes_tensor(raw: bytes) -> list[str]:
    """A BYTES tensor of the binary extension: each element's length (4 bytes, little-endian), then its bytes."""
    out, k = [], 0
    while k < len(raw):
        if k + 4 > len(raw):
            raise InvalidRequest("a BYTES tensor's binary data ends inside an element's length")
        (n,) = struct.unpack_from("<I", raw, k)
        if k + 4 + n > len(raw):
            raise InvalidRequest("a BYTES tensor's binary data ends inside an element")
        out.append(raw[k + 4:k + 4 + n].decode("utf-8", errors="replace"))
        k += 4 + n
    return out


def encode_bytes_tensor(values: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def _parameters(tensor: dict) -> dict:
    parameters = tensor.get("parameters")
    return parameters if isinstance(parameters, dict) else {}


def _flat(data: object) -> list:
    return [x for item in data for x in _flat(item)] if isinstance(data, list) else [data]


def read_inputs(body: bytes, headers: Mapping[str, str]) -> tuple[dict[str, list[str]], dict]:
    """The request's BYTES inputs by name, and its JSON header (the binary extension's tensors follow it)."""
    length = headers.get(HEADER_LENGTH)
    try:
        split = int(length) if length is not None else len(body)
        header = json.loads(body[:split])
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"the inference request is not JSON (with {HEADER_LENGTH}: its JSON part): {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise InvalidRequest("the inference request needs an 'inputs' list")
    inputs, binary = {}, memoryview(body)[split:]
    for tensor in header["inputs"]:
        name = tensor.get("name") if isinstance(tensor, dict) else None
        if name not in INPUTS:
            raise InvalidRequest(f"input {name!r}: this model takes {', '.join(INPUTS)}")
        if tensor.get("datatype") != "BYTES":
            raise InvalidRequest(f"input {name}: datatype must be BYTES, got {tensor.get('datatype')!r}")
        size = _parameters(tensor).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or size > len(binary):
                raise InvalidRequest(f"input {name}: binary_data_size {size!r} is past the request's binary data")
            inputs[name], binary = decode_bytes_tensor(bytes(binary[:size])), binary[size:]
        elif isinstance(tensor.get("data"), list):
            values = _flat(tensor["data"])
            if not all(isinstance(v, str) for v in values):
                raise InvalidRequest(f"input {name}: BYTES data must be strings")
            inputs[name] = values
        else:
            raise InvalidRequest(f"input {name}: give 'data' or the binary extension's binary_data_size")
    return inputs, header


class KServeRoutes:
    def __init__(self, servicer: BertzooServicer, service: Callable[[], TaskService | None],
                 serving: Callable[[], bool]) -> None:
        self._servicer, self._service, self._serving = servicer, service, serving

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/v2", self.server_metadata)
        app.router.add_get("/v2/health/live", self.live)
        app.router.add_get("/v2/health/ready", self.ready)
        app.router.add_get("/v2/models/{name}", self.model_metadata)
        app.router.add_get("/v2/models/{name}/ready", self.model_ready)
        app.router.add_post("/v2/models/{name}/infer", self.infer)

    async def server_metadata(self, request: web.Request) -> web.Response:
        try:
            version = importlib.metadata.version("bertzoo")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return web.json_response({"name": "bertzoo", "version": version, "extensions": ["binary_tensor_data"]})

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        ready = self._serving()
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    def _unknown(self, request: web.Request) -> web.Response | None:
        name = request.match_info["name"]
        return None if name == MODEL else _error(404, f"no model {name!r}: this server's model is {MODEL!r}")

    async def model_ready(self, request: web.Request) -> web.Response:
        return self._unknown(request) or await self.ready(request)

    async def model_metadata(self, request: web.Request) -> web.Response:
        if (unknown := self._unknown(request)) is not None:
            return unknown
        tensor = lambda name: {"name": name, "datatype": "BYTES", "shape": [-1, 1]}  # noqa: E731
        return web.json_response({"name": MODEL, "versions": ["1"], "platform": "bertzoo",
                                  "inputs": [tensor(n) for n in INPUTS], "outputs": [tensor("ANSWER")]})

    async def infer(self, request: web.Request) -> web.Response:
        if (unknown := self._unknown(request)) is not None:
            return unknown
        service = self._service()
        try:
            call = http_call(request)
            inputs, header = read_inputs(await read_body(request, call), request.headers)
            tasks = (*service.spec.tasks, "embed") if service is not None else T.TASK_NAMES
            rows = T.text_rows(inputs.get("TASK", []), inputs.get("TEXT_A", []), inputs.get("TEXT_B"), tasks)
        except (ServingError, ValueError) as e:
            return _error(status_of(e) if isinstance(e, ServingError) else 400, str(e))
        if not rows:
            return _error(400, "TEXT_A is empty: send at least one row")
        answers: list[dict | None] = [None] * len(rows)
        for task in dict.fromkeys(task for task, _, _ in rows):
            members = [i for i, row in enumerate(rows) if row[0] == task]
            result = await self._servicer.serve_http(task, call, self._answer_for(task, [rows[i] for i in members]))
            if isinstance(result, Failure):
                return _error(HTTP_STATUS.get(result.code, 500), result.message)
            items = result.embeddings if task == "embed" else result.results
            for i, item in zip(members, items, strict=True):
                answers[i] = answer_fields(item)
        return self._answer(header, [json.dumps(a).encode() for a in answers])

    def _answer_for(self, task: str, rows: list[tuple[str, str, str | None]]):
        texts = [a for _, a, _ in rows]
        if task in ("sentiment", "embed"):
            request = REQUEST_TYPES[task](texts=texts)
        elif task == "qa":
            request = pb2.QARequest(items=[pb2.QAItem(question=a, context=b) for _, a, b in rows])
        else:
            request = REQUEST_TYPES[task](pairs=[pb2.TextPair(text_a=a, text_b=b) for _, a, b in rows])
        return self._servicer.answer(task, request)

    @staticmethod
    def _answer(header: dict, answers: list[bytes]) -> web.Response:
        """ANSWER as JSON data, or in the binary extension where the request asked for it (tritonclient's default)."""
        outputs = header.get("outputs") if isinstance(header.get("outputs"), list) else []
        asked = {o.get("name"): o for o in outputs if isinstance(o, dict)}
        binary = bool(_parameters(asked.get("ANSWER") or {}).get("binary_data"))
        output = {"name": "ANSWER", "datatype": "BYTES", "shape": [len(answers), 1]}
        response = {"model_name": MODEL, "model_version": "1", **({"id": header["id"]} if "id" in header else {})}
        if not binary:
            return web.json_response({**response, "outputs": [{**output, "data": [a.decode() for a in answers]}]})
        data = encode_bytes_tensor(answers)
        head = json.dumps({**response, "outputs": [{**output, "parameters": {"binary_data_size": len(data)}}]}).encode()
        return web.Response(body=head + data, content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(len(head))})
