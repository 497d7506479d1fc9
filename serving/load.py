"""``bertzoo bench-serve``: drive a running server with N concurrent clients sending real sentences, for a fixed time
or a fixed number of requests, and report throughput, latency percentiles and errors by status code.

Each client is a coroutine with a channel (a connection) of its own that sends its next request as soon as the last
one is answered (a closed loop), so throughput and latency are measured at exactly N requests in flight. The load
generator runs in Python: on a small machine, give it cores of its own, or it measures itself too.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
from tqdm import tqdm

from .client import AsyncBertzooClient, channel_options
from .proto import pb2

# Each task the load generator and the bulk client drive, and its RPC (with "Stream" appended, its streaming twin).
TASK_METHODS = {"sentiment": "Sentiment", "paraphrase": "Paraphrase", "similarity": "Similarity", "qa": "QA",
                "embed": "Embed"}


def load_items(task: str, data: str | Path | None = None) -> list:
    """Inputs for ``task`` from a data file (sentiment / embed: CS224N ``ids-sst-*.csv``, GLUE ``.tsv`` or a ``.txt``
    of one text per line, blank lines skipped; paraphrase: ``quora-*.csv``; similarity: ``sts-*.csv``; qa: SQuAD
    ``.json``; any task: ``.jsonl``, see :func:`read_jsonl_inputs`), by default the bundled dev sample. Texts for
    sentence tasks, (a, b) for pair tasks, (question, context) for QA."""
    from bertzoo import data as D
    from bertzoo.datafiles import load_split, samples_dir

    if data is not None and Path(data).suffix == ".jsonl":
        return read_jsonl_inputs(task, Path(data))
    if data is None:
        examples = load_split(samples_dir(), "sentiment" if task == "embed" else task, "dev")
    elif task in ("sentiment", "embed") and Path(data).suffix == ".txt":
        lines = Path(data).read_text(encoding="utf-8").splitlines()
        examples = [SimpleNamespace(text=line) for line in lines if line.strip()]
    elif task in ("sentiment", "embed"):
        path = Path(data)
        examples = D.read_glue_sst2(path) if path.suffix == ".tsv" else D.read_cs224n_sentiment(path)
    elif task in ("paraphrase", "similarity"):
        examples = D.read_cs224n_pairs(data, "is_duplicate" if task == "paraphrase" else "similarity")
    else:
        examples = D.read_squad(data)
    if task == "qa":
        items = [(e.question, e.context) for e in examples]
    elif task in ("paraphrase", "similarity"):
        items = [(e.text_a, e.text_b) for e in examples]
    else:
        items = [e.text for e in examples]
    if not items:
        raise ValueError(f"no {task} examples in {data or 'the bundled samples'}")
    return items


# The fields of a .jsonl input line, per task.
JSONL_FIELDS = {"sentiment": ("text",), "embed": ("text",), "paraphrase": ("text_a", "text_b"),
                "similarity": ("text_a", "text_b"), "qa": ("question", "context")}


def read_jsonl_inputs(task: str, path: Path) -> list:
    """Inputs from JSON lines: ``{"text": ...}`` for sentiment and embed, ``{"text_a": ..., "text_b": ...}`` for the
    pair tasks, ``{"question": ..., "context": ...}`` for qa (other fields are ignored; blank lines skipped)."""
    from bertzoo.data import DataError

    fields, items = JSONL_FIELDS[task], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: not JSON ({e.msg})") from e
        if not isinstance(record, dict) or not all(isinstance(record.get(f), str) for f in fields):
            raise DataError(f"{path}:{number}: a {task} input is an object with the text fields {', '.join(fields)}")
        items.append(record[fields[0]] if len(fields) == 1 else tuple(record[f] for f in fields))
    if not items:
        raise DataError(f"{path}: no inputs")
    return items


def request_for(task: str, items: Sequence):
    """The task's request message for ``items`` (as :func:`load_items` gives them)."""
    if task in ("sentiment", "embed"):
        return (pb2.SentimentRequest if task == "sentiment" else pb2.EmbedRequest)(texts=items)
    if task == "qa":
        return pb2.QARequest(items=[pb2.QAItem(question=q, context=c) for q, c in items])
    pairs = [pb2.TextPair(text_a=a, text_b=b) for a, b in items]
    return (pb2.ParaphraseRequest if task == "paraphrase" else pb2.SimilarityRequest)(pairs=pairs)


@dataclass
class LoadReport:
    task: str
    concurrency: int
    items_per_request: int
    stream: bool = False  # requests sent over the streaming RPC, one stream per client
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, successful requests only
    codes: Counter = field(default_factory=Counter)  # status code name -> requests

    def summary(self) -> dict:
        ok = self.codes.get("OK", 0)
        lat = np.asarray(self.latencies) * 1000.0
        pct = dict(zip(("p50_ms", "p95_ms", "p99_ms"), np.percentile(lat, (50, 95, 99)).tolist() if ok else [None] * 3,
                       strict=True))
        return {
            "task": self.task, "concurrency": self.concurrency, "items_per_request": self.items_per_request,
            "stream": self.stream,
            "seconds": round(self.seconds, 3), "requests": sum(self.codes.values()), "ok": ok,
            "errors": {code: n for code, n in self.codes.items() if code != "OK"},
            "requests_per_s": ok / self.seconds if self.seconds else 0.0,
            "items_per_s": ok * self.items_per_request / self.seconds if self.seconds else 0.0,
            **pct, "mean_ms": float(lat.mean()) if ok else None, "max_ms": float(lat.max()) if ok else None,
        }


async def run_load(connection: str | dict, task: str, items: Sequence, *, concurrency: int = 8,
                   duration: float | None = 10.0, requests: int | None = None, items_per_request: int = 1,
                   timeout: float = 30.0, progress: bool = False, stream: bool = False) -> LoadReport:
    """Closed-loop load: ``concurrency`` clients until ``duration`` seconds passed or ``requests`` were sent.
    ``connection``: host:port, or the keyword arguments of AsyncBertzooClient (target, token, TLS files); each client
    has its own connection, without retries (a refusal is what the benchmark counts). ``progress``: a bar of answered
    requests (on a terminal). ``stream``: each client sends its requests over one call of the RPC's streaming twin
    (``SentimentStream``, ...), still one at a time, so both modes measure at the same requests in flight."""
    if task not in TASK_METHODS:
        raise ValueError(f"task must be one of {tuple(TASK_METHODS)}, got {task!r}")
    if duration is None and requests is None:
        raise ValueError("give a duration or a number of requests")
    if isinstance(connection, str):
        connection = {"target": connection}
    method = TASK_METHODS[task]
    source = itertools.cycle(items)
    sent = itertools.count()
    report = LoadReport(task, concurrency, items_per_request, stream)
    started = time.perf_counter()
    stop_at = None if duration is None else started + duration
    bar = tqdm(total=requests, desc=f"bench-serve {task}", unit="req", disable=None if progress else True, leave=False,
               dynamic_ncols=True, mininterval=0.5)

    def more() -> bool:
        return (requests is None or next(sent) < requests) and (stop_at is None or time.perf_counter() < stop_at)

    def count(code: str, t0: float) -> None:
        if code == "OK":
            report.latencies.append(time.perf_counter() - t0)
        report.codes[code] += 1
        bar.update(1)

    async def unary_client(channel: AsyncBertzooClient) -> None:
        while more():
            request = request_for(task, [next(source) for _ in range(items_per_request)])
            t0 = time.perf_counter()
            try:
                await channel.call(method, request)
            except grpc.aio.AioRpcError as e:
                count(e.code().name, t0)
            else:
                count("OK", t0)

    async def stream_client(channel: AsyncBertzooClient) -> None:
        call = None
        while more():
            request = request_for(task, [next(source) for _ in range(items_per_request)])
            t0 = time.perf_counter()
            try:
                call = call or channel.stream(method)
                await call.write(request)
                answer = await asyncio.wait_for(call.read(), timeout)
            except grpc.aio.AioRpcError as e:  # the stream ended: count it, open a new one
                count(e.code().name, t0)
                call = None
            except asyncio.TimeoutError:
                count("DEADLINE_EXCEEDED", t0)
                call.cancel()
                call = None
            else:
                if answer is grpc.aio.EOF:
                    raise RuntimeError(f"the server ended the {method}Stream call without answering")
                count(answer.error.code if answer.WhichOneof("result") == "error" else "OK", t0)
        if call is not None:
            await call.done_writing()

    async def client() -> None:
        # A connection of its own: by default gRPC gives every channel to one target the same TCP connection (its
        # global subchannel pool), so N clients would be one connection, cheaper for the server than N users are
        # and unlike an HTTP peer's N connections.
        options = [*channel_options(retries=False), ("grpc.use_local_subchannel_pool", 1)]
        channel = AsyncBertzooClient(**connection, timeout=timeout, options=options)
        try:
            await (stream_client if stream else unary_client)(channel)
        finally:
            await channel.close()

    with bar:
        await asyncio.gather(*(client() for _ in range(concurrency)))
    report.seconds = time.perf_counter() - started
    return report


def format_report(summary: dict) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} ms"

    errors = ", ".join(f"{code}: {n}" for code, n in sorted(summary["errors"].items())) or "none"
    return "\n".join([
        f"task {summary['task']}{' (streams)' if summary.get('stream') else ''}, {summary['concurrency']} clients, "
        f"{summary['items_per_request']} items per request, "
        f"{summary['seconds']:.1f} s",
        f"requests   {summary['requests']} ({summary['ok']} OK; errors: {errors})",
        f"throughput {summary['requests_per_s']:.1f} requests/s, {summary['items_per_s']:.1f} items/s",
        f"latency    p50 {ms(summary['p50_ms'])}, p95 {ms(summary['p95_ms'])}, p99 {ms(summary['p99_ms'])}, "
        f"max {ms(summary['max_ms'])}",
    ])
