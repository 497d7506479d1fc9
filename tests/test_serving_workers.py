"""The engines' worker threads: each lane's priority, and with several instances that share out every usable core,
each instance's cores."""

from __future__ import annotations

import os
import threading

import pytest

from bertzoo.serving import workers
from bertzoo.serving.workers import instance_cores, model_worker, usable_cores

linux_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(usable_cores()) < 2,
                                    reason="needs Linux CPU affinity and at least 2 usable cores")


@pytest.mark.parametrize(("usable", "instances", "threads", "expected"), [
    ([0, 1], 2, 1, [{0}, {1}]),
    ([0, 1, 2, 3], 2, 2, [{0, 1}, {2, 3}]),
    ([2, 5, 6, 9], 4, 1, [{2}, {5}, {6}, {9}]),  # a cpuset's cores, in order
    ([0, 1, 2, 3], 2, 1, [None, None]),  # threads that leave cores to something else
    ([0, 1], 4, 1, [None] * 4),  # more threads than cores
    ([0, 1], 1, 2, [None]),  # one instance has every core anyway
    ([], 2, 1, [None, None]),  # a platform that does not say
])
def test_instances_get_cores_of_their_own_only_where_they_cover_every_usable_core(monkeypatch, usable, instances,
                                                                                 threads, expected):
    monkeypatch.setattr(workers, "usable_cores", lambda: usable)
    got = instance_cores(instances, threads)
    assert got == [None if e is None else frozenset(e) for e in expected]


@linux_affinity
def test_a_worker_and_the_threads_it_starts_run_on_its_cores():
    core = usable_cores()[-1]
    worker = model_worker("main", 1, frozenset({core}))

    def placement() -> tuple[set[int], set[int]]:
        child: list[set[int]] = []
        thread = threading.Thread(target=lambda: child.append(os.sched_getaffinity(threading.get_native_id())))
        thread.start()  # as an engine's own thread pool would be, started from the worker
        thread.join()
        return os.sched_getaffinity(threading.get_native_id()), child[0]

    try:
        own, child = worker.submit(placement).result()
    finally:
        worker.shutdown()
    assert own == {core} and child == {core}


@linux_affinity
def test_a_worker_without_cores_runs_anywhere():
    worker = model_worker("long")
    try:
        cores = worker.submit(lambda: os.sched_getaffinity(threading.get_native_id())).result()
    finally:
        worker.shutdown()
    assert cores == set(usable_cores())
