"""The engine side of a server: the model, its tokenizer and the lanes (batchers) that run it, as the task service
sees them. The task service needs only what :class:`Lanes` holds, so the same service works whether the engine
lives in its own process (``--frontends`` N > 1: lanes reached over ZeroMQ, serving/engine_link.py) or in the
server's own (N = 1: :func:`open_local_lanes`, the batchers themselves).

A lane is anything with ``check_room()`` (raise what a submit would raise for lack of room) and ``submit(works,
timeout)`` returning a job whose ``future`` resolves to one output per work and which then carries ``submitted``,
``first_start`` and ``last_end`` (``time.perf_counter`` seconds: one clock for every process of a Linux host).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from bertzoo.pipeline import Backend
from bertzoo.tokenization import Tokenizer

from .batcher import Batcher
from .config import BatchSettings, ServeConfig
from .engine import EngineRunner, Work, padded_width
from .metrics import Metrics
from .model import ModelSpec, ServedModel, largest_batches, release_freed_memory, warm_up
from .workers import instance_cores, model_worker

log = logging.getLogger("bertzoo.serving")

ModelLoader = Callable[[ServeConfig], ServedModel]


class Lane(Protocol):
    def check_room(self) -> None: ...

    def submit(self, works: list[Work], timeout: float | None = None): ...


@dataclass
class Lanes:
    """What a task service runs on: the model's facts and tokenizer, the main lane, the long-request lane (the main
    one where the engine has no second instance) and how to close them."""

    spec: ModelSpec
    tokenizer: Tokenizer
    main: Lane
    long: Lane
    close: Callable[[], Awaitable[None]]


# The long lane's batches: a few QA windows (4 x 384 tokens), so a cancelled request or one past its deadline stops
# soon, and the engine's memory stays that of a small batch.
LONG_LANE_BATCH_TOKENS = 2048


def long_lane_settings(config: ServeConfig) -> BatchSettings:
    return BatchSettings(max_batch_size=config.batch.max_batch_size,
                         max_batch_tokens=min(config.batch.max_batch_tokens, LONG_LANE_BATCH_TOKENS),
                         max_queue=config.batch.max_queue, pad_to=config.batch.pad_to)


async def open_local_lanes(config: ServeConfig, loader: ModelLoader, metrics: Metrics) -> Lanes:
    """Load and warm up the model (on its worker threads: the event loop keeps answering meanwhile) and start its
    batchers in this process."""
    # Loaded on the main lane's worker thread, whose CPU priority (and cores) the engine's threads inherit.
    loop = asyncio.get_running_loop()
    cores = (instance_cores(config.instances, config.engine_threads) if config.pin_instances
             else [None] * config.instances)
    if cores[0] is not None:
        log.info("engine instances on cores of their own: %s",
                 ", ".join(f"{k} on {','.join(map(str, sorted(c)))}" for k, c in enumerate(cores)))
    main_worker = model_worker("main", 0, cores[0])
    try:
        served = await loop.run_in_executor(main_worker, loader, config)
    except BaseException:
        main_worker.shutdown(wait=False)
        raise
    pooling = served.spec.pooling
    # Items are grouped for batching by the width they will be padded to: with pad_to="longest" their own length
    # rounded up to 8 (a batch pads no row by more than 7 tokens), with pad_to="bucket" the length bucket.
    group = padded_width if config.batch.pad_to == "longest" else served.spec.bucket_for
    # The long-request lane (only where a request can be long): its own engine instance, on a low-priority thread.
    has_long = served.spare_backend is not None and config.long_request_tokens < config.max_request_tokens
    # Each engine instance is made (the main one is loaded) and warmed up on its own worker thread, all at once (with
    # --warmup-largest each one's warm-up is seconds of work).
    workers = [main_worker, *(model_worker("main", k, cores[k]) for k in range(1, config.instances))]
    settings = [config.batch] * len(workers)
    if has_long:
        workers.append(model_worker("long"))
        settings.append(long_lane_settings(config))

    def ready_engine(first: bool, batch: BatchSettings) -> Backend:
        assert first or served.spare_backend is not None  # config checked that instances can be rebuilt
        engine = served.backend if first else served.spare_backend()
        if config.warmup:
            warm_up(served, engine, batch if config.warmup_largest else None)
        return engine

    try:
        engines = await asyncio.gather(*(loop.run_in_executor(worker, ready_engine, k == 0, batch)
                                         for k, (worker, batch) in enumerate(zip(workers, settings, strict=True))))
    except BaseException:
        for worker in workers:
            worker.shutdown(wait=False)
        raise
    runners = [EngineRunner(engine, pooling) for engine in engines]
    main_count = config.instances
    main = Batcher(runners[0], group, served.tokenizer.pad_id, config.batch, metrics, executor=main_worker,
                   more_instances=list(zip(runners[1:main_count], workers[1:main_count], strict=True)))
    main.start()
    long = None
    if has_long:
        long = Batcher(runners[-1], group, served.tokenizer.pad_id, settings[-1], metrics, lane="long",
                       executor=workers[-1])
        long.start()
    release_freed_memory()
    if config.warmup:
        # Counted as --instances counts them; the long lane's own instance is named apart, not added in.
        largest = largest_batches(config.batch, served.spec.length_buckets[-1]) if config.warmup_largest else []
        log.info("warmed up %d engine instance%s%s on length buckets %s%s", config.instances,
                 "" if config.instances == 1 else "s", " (+1 for the long-request lane)" if long is not None else "",
                 served.spec.length_buckets,
                 f" and the largest batches (rows x width) {', '.join(f'{r}x{w}' for r, w in largest)}" if largest
                 else "")

    async def close() -> None:
        for batcher in (main, long):
            if batcher is not None:
                await batcher.close(timeout=1.0)  # the calls are done: only cancelled leftovers can remain

    return Lanes(served.spec, served.tokenizer, main, long if long is not None else main, close)
