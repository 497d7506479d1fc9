"""``bertzoo client TASK --input FILE``: every input of a file answered by a running server over streams (one
request per input, so a bad input fails alone), as JSON lines in input order: ``{"index": i, ...the task's result}``
or ``{"index": i, "error": {"code": ..., "message": ...}}``. A stream broken by a replica's drain or restart carries
on on a new one (:meth:`BertzooClient.stream_all`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .client import BertzooClient
from .load import TASK_METHODS, request_for
from .proto import answer_fields


def _result(task: str, response) -> dict:
    """The one result of a one-input response, as JSON fields."""
    if task == "embed":
        return {"embedding": list(response.embeddings[0].values)}
    return answer_fields(response.results[0])


def answer_inputs(client: BertzooClient, task: str, items: Sequence, timeout: float | None = None) -> Iterator[dict]:
    """One JSON-ready answer per item of ``items`` (as :func:`bertzoo.serving.load.load_items` reads them), in order."""
    requests = [request_for(task, [item]) for item in items]
    for index, message in enumerate(client.stream_all(TASK_METHODS[task], requests, timeout=timeout)):
        if message.WhichOneof("result") == "error":
            yield {"index": index, "error": {"code": message.error.code, "message": message.error.message}}
        else:
            yield {"index": index, **_result(task, message.response)}
