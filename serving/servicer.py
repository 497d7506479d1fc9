"""The bertzoo.v1.Bertzoo gRPC servicer: protobuf in and out around the transport-agnostic TaskService.

Every request, of a unary RPC or on a stream (or of an HTTP route, serving/http_server.py), is one call of
:meth:`BertzooServicer.serve_one`, which maps the core's errors to status codes and records the request metrics
(in-flight gauge, latency, result by code and reason) whatever happens, cancellation included. A unary RPC ends with
a failure's status; a stream answers it in the request's place and goes on. When the server starts to drain, every
open stream stops reading, answers the requests it has taken and ends with UNAVAILABLE, so its client sends the rest
to another replica now rather than when the grace runs out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from .config import ServeConfig
from .errors import ServingError, Unavailable
from .metrics import Metrics
from .proto import pb2, pb2_grpc
from .tasks_service import TaskService, Timing

log = logging.getLogger("bertzoo.serving")

Request = TypeVar("Request")
Response = TypeVar("Response")
StreamResponse = TypeVar("StreamResponse")
# One request's work: given the loaded service and the seconds left before the deadline, its response.
Answer = Callable[[TaskService, float | None], Awaitable[Response]]

# The server's deadline starts when the request arrives, a little after the client's, so a client whose deadline
# passes cancels the call while the server still sees up to the transit time (milliseconds, more under load) left.
# A cancellation that close to the deadline is the deadline.
DEADLINE_SKEW_SECONDS = 0.1
# Each task's request message (the HTTP routes parse their JSON into it).
REQUEST_TYPES = {"sentiment": pb2.SentimentRequest, "paraphrase": pb2.ParaphraseRequest,
                 "similarity": pb2.SimilarityRequest, "qa": pb2.QARequest, "embed": pb2.EmbedRequest}
DRAINING_MESSAGE = ("this replica is shutting down: the requests answered on this stream are done; send the rest "
                    "again, on a new stream (to another replica)")

HTTP_TIMEOUT_HEADER = "X-Request-Timeout"  # an HTTP request's deadline: seconds, as a gRPC call's timeout


class HttpCall:
    """The call context :meth:`BertzooServicer.serve_one` gets for an HTTP request: the seconds its client waits
    (its ``X-Request-Timeout`` header), where it said; as a gRPC call's deadline, from its arrival."""

    def __init__(self, timeout: float | None = None) -> None:
        self._ends = None if timeout is None else time.monotonic() + timeout

    def time_remaining(self) -> float | None:
        return None if self._ends is None else max(0.0, self._ends - time.monotonic())


@dataclass(frozen=True)
class Failure:
    """A request's failure: the status code's name (``grpc.StatusCode``) and the message the client gets."""

    code: str
    message: str


def _fields(result) -> dict:
    """A flat result dataclass's fields by name, as its protobuf message takes them (dataclasses.asdict deep-copies
    every value, a few microseconds per result on the request path)."""
    return vars(result)


def _timing(t: Timing) -> pb2.Timing:
    return pb2.Timing(queue_seconds=t.queue, tokenize_seconds=t.tokenize, inference_seconds=t.inference,
                      total_seconds=t.total)


def _stream_method(task: str, answer_for: str, wrap: Callable[..., StreamResponse]):
    """A ``*Stream`` RPC's handler: :meth:`BertzooServicer._stream` with the servicer's ``answer_for`` method (the one
    its unary RPC uses). gRPC aio serves a streaming handler only as an async generator function, so this is one."""

    async def handler(self: BertzooServicer, requests: AsyncIterator, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[StreamResponse]:
        async for response in self._stream(task, requests, context, getattr(self, answer_for), wrap):
            yield response

    return handler


class BertzooServicer(pb2_grpc.BertzooServicer):
    def __init__(self, service: Callable[[], TaskService | None], config: ServeConfig, metrics: Metrics,
                 runtime_versions: dict[str, str]) -> None:
        """``service()`` is the TaskService once the model is loaded and warmed up, None before."""
        self._service = service
        self._config = config
        self._metrics = metrics
        self._runtime_versions = runtime_versions
        self._unexpected: dict[str, tuple[float, int]] = {}  # task -> (time of the last traceback, errors since)
        # Set by the server's stop(): calls still running when the shutdown grace ends are cut, and counted here.
        self.grace_ends: float | None = None
        self.cut_at_shutdown = 0
        self.in_flight = 0
        self.draining = False
        self._stream_readers: set[asyncio.Task] = set()  # each open stream's reader, cancelled by drain_streams()
        self.open_streams = 0  # *Stream handlers running, answering or ending

    def drain_streams(self) -> int:
        """Stop reading every open stream: each answers the requests it has taken, then ends with UNAVAILABLE.
        Returns how many streams were open."""
        self.draining = True
        for reader in self._stream_readers:
            reader.cancel()
        return len(self._stream_readers)

    def _log_unexpected(self, task: str) -> None:
        """A bug's traceback once per task and minute; in between, one line, so a storm of failing requests cannot
        flood the log."""
        now, (last, suppressed) = time.monotonic(), self._unexpected.get(task, (float("-inf"), 0))
        if now - last >= 60.0:
            log.exception("%s: unexpected error (%d more since the last traceback)", task, suppressed)
            self._unexpected[task] = (now, 0)
        else:
            self._unexpected[task] = (last, suppressed + 1)

    async def serve_http(self, task: str, call: HttpCall, answer: Answer[Response]) -> Response | Failure:
        """:meth:`serve_one` for an HTTP request (counted under protocol "http"), ended at its deadline as gRPC ends
        a call at its deadline."""
        remaining = call.time_remaining()
        if remaining is None:
            return await self.serve_one(task, call, answer, "http")
        try:
            return await asyncio.wait_for(self.serve_one(task, call, answer, "http"), remaining)
        except asyncio.TimeoutError:  # serve_one counted it DEADLINE_EXCEEDED as it was cancelled
            return Failure("DEADLINE_EXCEEDED", f"no answer within the request's {HTTP_TIMEOUT_HEADER}")

    async def serve_one(self, task: str, context: grpc.aio.ServicerContext | HttpCall,
                        answer: Answer[Response], protocol: str = "grpc") -> Response | Failure:
        """One request, unary or on a stream: its response, or the status it fails with. Records the request's
        metrics (in-flight gauge, latency, result by code and reason) whatever happens, cancellation included."""
        started = time.perf_counter()
        code, reason = "OK", ""
        self._metrics.inflight.inc()
        self.in_flight += 1
        try:
            service = self._service()
            if service is None:
                raise Unavailable("the model is still loading; retry when health reports SERVING", reason="loading")
            return await answer(service, context.time_remaining())
        except ServingError as e:
            code, reason = e.code, e.reason
            return Failure(e.code, str(e))
        except asyncio.CancelledError:
            # gRPC cancels the handler when the client cancels, disconnects or its deadline passes.
            remaining = context.time_remaining()
            expired = remaining is not None and remaining <= DEADLINE_SKEW_SECONDS
            code, reason = ("DEADLINE_EXCEEDED", "deadline") if expired else ("CANCELLED", "cancelled")
            if self.grace_ends is not None and time.monotonic() >= self.grace_ends:
                # The server's grace ran out, not the client's patience: gRPC ends such a call UNAVAILABLE.
                code, reason = "UNAVAILABLE", "shutdown"
                self.cut_at_shutdown += 1
            raise
        except Exception:
            self._log_unexpected(task)
            code, reason = "INTERNAL", "unexpected"
            return Failure("INTERNAL", "internal server error (details in the server log)")
        finally:
            self.in_flight -= 1
            self._metrics.inflight.dec()
            self._metrics.record_request(task, code, reason, time.perf_counter() - started, protocol)

    async def _handle(self, task: str, context: grpc.aio.ServicerContext,
                      answer: Answer[Response]) -> Response:
        """A unary RPC: the response, or the call ends with the failure's status."""
        result = await self.serve_one(task, context, answer)
        if isinstance(result, Failure):
            await context.abort(grpc.StatusCode[result.code], result.message)
        return result

    async def _stream(self, task: str, requests: AsyncIterator[Request], context: grpc.aio.ServicerContext,
                      answer_for: Callable[[Request], Answer[Response]],
                      wrap: Callable[..., StreamResponse]) -> AsyncIterator[StreamResponse]:
        """A streaming RPC: each request served as the unary RPC serves it, up to ``stream_window`` at a time (so
        they share batches), and answered in request order, a failure as ``error`` in its place. A reader task
        takes requests off the stream while this generator writes the answers."""
        window = asyncio.Semaphore(self._config.stream_window)
        answers: asyncio.Queue[asyncio.Task | None] = asyncio.Queue()

        async def read() -> None:
            async for request in requests:
                await window.acquire()
                answers.put_nowait(asyncio.create_task(self.serve_one(task, context, answer_for(request))))

        def reading_ended(reader: asyncio.Task) -> None:
            # The end of the requests, or of reading them (read's error follows): a callback rather than read's own
            # `finally`, so it also comes when a drain cancels the reader before it ever ran.
            self._stream_readers.discard(reader)
            answers.put_nowait(None)

        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
        reader = asyncio.create_task(read())
        self._stream_readers.add(reader)
        reader.add_done_callback(reading_ended)
        open_streams = self._metrics.open_streams.labels(task)
        open_streams.inc()
        self.open_streams += 1
        try:
            while (answering := await answers.get()) is not None:
                result = await answering
                window.release()
                if isinstance(result, Failure):
                    yield wrap(error=pb2.StreamError(code=result.code, message=result.message))
                else:
                    yield wrap(response=result)
            await asyncio.wait([reader])
            if reader.cancelled():  # only drain_streams() cancels it while this generator runs
                await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
            reader.result()  # re-raises what ended the reading (a malformed message's abort, a broken stream)
        finally:
            open_streams.dec()
            self.open_streams -= 1
            reader.cancel()
            while not answers.empty():
                if (left := answers.get_nowait()) is not None:
                    left.cancel()

    # ------------------------------------------------------------------ each RPC's answer, unary and streaming

    def answer(self, task: str, request) -> Answer:
        """``task``'s unary answer to ``request`` (a REQUEST_TYPES message), for :meth:`serve_one`: the HTTP routes'."""
        answers = {"sentiment": self._sentiment, "paraphrase": self._paraphrase, "similarity": self._similarity,
                   "qa": self._qa, "embed": self._embed}
        return answers[task](request)

    def _sentiment(self, request: pb2.SentimentRequest) -> Answer[pb2.SentimentResponse]:
        async def answer(service: TaskService, timeout: float | None) -> pb2.SentimentResponse:
            results, timing = await service.sentiment(list(request.texts), timeout)
            return pb2.SentimentResponse(
                results=[pb2.SentimentResult(**_fields(r)) for r in results],
                timing=_timing(timing), labels=service.spec.labels["sentiment"])

        return answer

    def _paraphrase(self, request: pb2.ParaphraseRequest) -> Answer[pb2.ParaphraseResponse]:
        async def answer(service: TaskService, timeout: float | None) -> pb2.ParaphraseResponse:
            results, timing = await service.paraphrase([(p.text_a, p.text_b) for p in request.pairs], timeout)
            return pb2.ParaphraseResponse(results=[pb2.ParaphraseResult(**_fields(r)) for r in results],
                                          timing=_timing(timing))

        return answer

    def _similarity(self, request: pb2.SimilarityRequest) -> Answer[pb2.SimilarityResponse]:
        async def answer(service: TaskService, timeout: float | None) -> pb2.SimilarityResponse:
            results, timing = await service.similarity([(p.text_a, p.text_b) for p in request.pairs], timeout)
            return pb2.SimilarityResponse(results=[pb2.SimilarityResult(**_fields(r)) for r in results],
                                          timing=_timing(timing))

        return answer

    def _qa(self, request: pb2.QARequest) -> Answer[pb2.QAResponse]:
        async def answer(service: TaskService, timeout: float | None) -> pb2.QAResponse:
            spans, timing = await service.qa([(item.question, item.context) for item in request.items], timeout)
            return pb2.QAResponse(results=[pb2.QAResult(**_fields(s)) for s in spans], timing=_timing(timing))

        return answer

    def _embed(self, request: pb2.EmbedRequest) -> Answer[pb2.EmbedResponse]:
        async def answer(service: TaskService, timeout: float | None) -> pb2.EmbedResponse:
            vectors, timing = await service.embed(list(request.texts), timeout)
            return pb2.EmbedResponse(embeddings=[pb2.Embedding(values=v.tolist()) for v in vectors],
                                     timing=_timing(timing), dimensions=int(vectors.shape[1]))

        return answer

    async def Sentiment(self, request: pb2.SentimentRequest, context: grpc.aio.ServicerContext) -> pb2.SentimentResponse:
        return await self._handle("sentiment", context, self._sentiment(request))

    async def Paraphrase(self, request: pb2.ParaphraseRequest, context: grpc.aio.ServicerContext) -> pb2.ParaphraseResponse:
        return await self._handle("paraphrase", context, self._paraphrase(request))

    async def Similarity(self, request: pb2.SimilarityRequest, context: grpc.aio.ServicerContext) -> pb2.SimilarityResponse:
        return await self._handle("similarity", context, self._similarity(request))

    async def QA(self, request: pb2.QARequest, context: grpc.aio.ServicerContext) -> pb2.QAResponse:
        return await self._handle("qa", context, self._qa(request))

    async def Embed(self, request: pb2.EmbedRequest, context: grpc.aio.ServicerContext) -> pb2.EmbedResponse:
        return await self._handle("embed", context, self._embed(request))

    SentimentStream = _stream_method("sentiment", "_sentiment", pb2.SentimentStreamResponse)
    ParaphraseStream = _stream_method("paraphrase", "_paraphrase", pb2.ParaphraseStreamResponse)
    SimilarityStream = _stream_method("similarity", "_similarity", pb2.SimilarityStreamResponse)
    QAStream = _stream_method("qa", "_qa", pb2.QAStreamResponse)
    EmbedStream = _stream_method("embed", "_embed", pb2.EmbedStreamResponse)

    def model_info_answer(self) -> Answer[pb2.ModelInfoResponse]:
        async def answer(service: TaskService, _timeout: float | None) -> pb2.ModelInfoResponse:
            spec, config, limits = service.spec, self._config, service.spec.limits
            return pb2.ModelInfoResponse(
                tasks=spec.tasks, sentiment_labels=spec.labels["sentiment"], paraphrase_labels=spec.labels["paraphrase"],
                limits=pb2.Limits(
                    max_items_per_request=config.max_items, max_text_chars=config.max_text_chars,
                    max_seq_length=limits.max_seq_length, qa_max_length=limits.qa_max_length,
                    qa_doc_stride=limits.qa_doc_stride, qa_max_question_tokens=limits.qa_max_question_tokens,
                    qa_max_answer_tokens=limits.qa_max_answer_tokens, overlong=config.overlong,
                    stream_window=config.stream_window),
                backend=spec.backend, variant=spec.variant, pooling=spec.pooling, embedding_dimensions=spec.hidden_size,
                length_buckets=spec.length_buckets, qa_null_threshold=spec.qa_null_threshold,
                artifact_versions=spec.artifact_versions, runtime_versions=self._runtime_versions,
                device=spec.device, precision=spec.precision, engine_choice=config.engine_choice)

        return answer

    async def ModelInfo(self, request: pb2.ModelInfoRequest, context: grpc.aio.ServicerContext
                        ) -> pb2.ModelInfoResponse:
        return await self._handle("model_info", context, self.model_info_answer())
