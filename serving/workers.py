"""The engines' worker threads: one per engine instance, at its lane's CPU priority, and, where several instances
share out every core this process may use, each instance on cores of its own.

An engine is built on its worker (so the threads it starts, such as ONNX Runtime's intra-op pool, inherit the
worker's priority and cores: Linux threads inherit both from their creator) and runs every batch there.

Why cores of their own: beside the event loop, gRPC's poller and the tokenizer, two one-thread engines left
unplaced are moved between the cores by the scheduler mid-batch. Each on its own core served more sentences/s at 64
clients (int8 and fp32, 2 cores); the event loop still runs on any core.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from bertzoo.cpu import flush_denormals

log = logging.getLogger("bertzoo.serving")

# CPU priorities (Linux nice values) of the lanes' workers. The event loop (network, validation, refusals) keeps the
# normal priority, so while the engine saturates every core a request is still accepted, queued or refused at once.
# The long lane's worker takes only what the main lane leaves: beside a long-lane worker of equal priority a
# one-sentence encoder call's tail latency grew far more than at nice 19 (a one-sentence request beside the lane's
# worst cases: benchmarks/RESULTS.md, "Reliability").
MAIN_LANE_NICE = 5
LONG_LANE_NICE = 19


def usable_cores() -> list[int]:
    """The cores this process may run on (a container's cpuset included), in order; empty where the platform does not
    say (not Linux)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return []


def instance_cores(instances: int, threads: int | None) -> list[frozenset[int] | None]:
    """The cores of each main-lane engine instance (``instances`` of them, each on ``threads`` intra-op threads): its
    own run of ``threads`` usable cores, where the instances' threads add up to exactly the usable cores. None for
    every instance (any core) otherwise: one instance, threads that leave cores to something else, or more threads
    than cores (a container whose CPU limit is a quota sees every core of its node, and placing engines there would
    pile every replica's onto the same first cores)."""
    cores = usable_cores()
    if instances < 2 or threads is None or instances * threads != len(cores):
        return [None] * instances
    return [frozenset(cores[k * threads:(k + 1) * threads]) for k in range(instances)]


def place_thread(nice: int, cores: frozenset[int] | None = None) -> None:
    """Run the calling thread, and the threads it creates from now on, at CPU priority ``nice`` and, given
    ``cores``, on those cores only, flushing denormal floats to zero (:func:`bertzoo.cpu.flush_denormals`: ONNX
    Runtime's masked softmax ran several times slower on them; a thread of the engine's own, so no other code of the
    process sees the mode)."""
    flush_denormals()
    name, tid = threading.current_thread().name, threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (AttributeError, OSError) as e:  # not Linux, or not allowed: the lanes still work, without priorities
        log.warning("could not lower the priority of %s (%s)", name, e)
    if cores is not None:
        try:
            os.sched_setaffinity(tid, cores)
        except (AttributeError, OSError) as e:  # the engine still runs, on any core
            log.warning("could not place %s on cores %s (%s)", name, sorted(cores), e)


def model_worker(lane: str = "main", instance: int = 0, cores: frozenset[int] | None = None) -> ThreadPoolExecutor:
    """A lane's one-thread executor for its engine ``instance``, at that lane's CPU priority and, given ``cores``
    (:func:`instance_cores`), on them: build the engine on it, then hand it to the lane's
    :class:`~bertzoo.serving.batcher.Batcher`."""
    nice = MAIN_LANE_NICE if lane == "main" else LONG_LANE_NICE
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"bertzoo-{lane}{instance or ''}",
                              initializer=place_thread, initargs=(nice, cores))
