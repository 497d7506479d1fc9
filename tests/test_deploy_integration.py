"""The compose bundle's parts for real, on loopback (deploy/local.py): two `bertzoo serve` replicas behind nginx
running deploy/compose/nginx.conf, and Prometheus with deploy/prometheus/rules.yml scraping both each second. Traffic
of every task goes through nginx, both replicas answer a share, Prometheus computes a p99 for every task, and SIGTERM
to one replica in the middle of the traffic loses no request (see the drain's comment for the one race gRPC leaves)."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from bertzoo.serving.client import BertzooClient, channel_options
from bertzoo.serving.proto import pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))
import local  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    bool(local.missing_tools()), reason=f"needs {' and '.join(local.missing_tools())} (.ci/run installs them with "
                                        "apt-get: Debian packages nginx and prometheus)")]

TASKS = ("sentiment", "paraphrase", "similarity", "qa", "embed")


def call(client: BertzooClient, task: str, i: int):
    if task == "sentiment":
        return client.sentiment([f"a fine film, number {i}"])
    if task == "embed":
        return client.embed([f"sentence {i}"])
    if task == "qa":
        return client.qa([("who won?", f"team {i} won the match on sunday.")])
    pair = [(f"how do I learn {i}?", f"how can I learn {i}?")]
    return client.paraphrase(pair) if task == "paraphrase" else client.similarity(pair)


def requests_answered(stack: local.LocalStack, i: int, protocol: str | None = None) -> float:
    """Requests replica ``i`` answered OK (over ``protocol`` only, where given)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_ports[i]}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "bertzoo_requests_total" and s.labels["code"] == "OK"
               and protocol in (None, s.labels["protocol"]))


def test_replicas_behind_nginx_scraped_by_prometheus_and_a_replica_drained_mid_traffic(tiny_artifact, tmp_path):
    _, artifact = tiny_artifact
    # The default --shutdown-grace (30 s): the drained replica's accepted calls finish, however loaded the machine.
    with local.LocalStack(artifact, tmp_path / "stack", replicas=2, serve_args=("--threads", "1")) as stack:
        # No client retries: what reaches the client is what nginx and the replicas made of each call.
        with BertzooClient(stack.target, options=channel_options(retries=False), timeout=30) as client:
            for i in range(150):
                call(client, TASKS[i % len(TASKS)], i)
            shares = [requests_answered(stack, i) for i in range(2)]
            assert sum(shares) >= 150 and min(shares) >= 30, shares  # round robin over both
            # A stream passes through nginx too: many requests on one call, each answered, in order.
            streamed = list(client.stream("Embed", (pb2.EmbedRequest(texts=[f"streamed {i}"]) for i in range(40)),
                                          timeout=60))
            assert [m.WhichOneof("result") for m in streamed] == ["response"] * 40
            # HTTP through nginx's port 8000 server: OpenAI's route, spread over both replicas too.
            for i in range(20):
                request = urllib.request.Request(f"http://{stack.http_target}/v1/embeddings",
                                                 data=json.dumps({"input": f"over http {i}"}).encode())
                with urllib.request.urlopen(request, timeout=30) as reply:
                    assert reply.status == 200 and json.loads(reply.read())["data"][0]["embedding"]
            http_shares = [requests_answered(stack, i, protocol="http") for i in range(2)]
            assert sum(http_shares) == 20 and min(http_shares) >= 3, http_shares

            # Half the clients retry as the bertzoo client does by default, half not at all. gRPC core cancels a call
            # that reaches the replica in the instant its drain starts (accepted in the GOAWAY handshake, then dropped
            # by the stopping server), and nginx passes that CANCELLED on: at most the one call a client has in flight
            # then. Everything else nginx must move to the other replica itself.
            failures: dict[bool, list[BaseException]] = {True: [], False: []}
            answered = [0]

            def traffic(offset: int, retries: bool) -> None:
                with BertzooClient(stack.target, options=channel_options(retries=retries), timeout=30) as own:
                    for i in range(offset, offset + 100):
                        try:
                            call(own, TASKS[i % len(TASKS)], i)
                            answered[0] += 1
                        except Exception as e:  # noqa: BLE001  (every failure is reported below)
                            failures[retries].append(e)

            threads = [threading.Thread(target=traffic, args=(k * 1000, k % 2 == 0)) for k in range(4)]
            for thread in threads:
                thread.start()
            time.sleep(0.5)
            stack.stop_replica(1)  # SIGTERM in the middle of the traffic
            for thread in threads:
                thread.join()
            assert not failures[True], failures[True][:3]
            assert len(failures[False]) <= 2, failures[False]
            assert all(getattr(e, "code", lambda: None)() == grpc.StatusCode.CANCELLED for e in failures[False]), \
                failures[False]
            assert answered[0] + len(failures[False]) == 400
            assert stack.servers[1].wait(60) == 0  # drained and exited cleanly
            for i in range(20):  # after the drain, the remaining replica answers everything
                call(client, TASKS[i % len(TASKS)], i)

        # What Prometheus holds once it has scraped the end of the test (on a loaded machine its 1 s scrapes and rule
        # evaluations fall behind, so each check gets up to 30 s; the 5 m window spans the whole test).
        def p99(task: str) -> list[dict]:
            return stack.query(f'histogram_quantile(0.99, sum by (le) (rate(bertzoo_request_seconds_bucket'
                               f'{{job="bertzoo", task="{task}"}}[5m])))')

        def up() -> dict[str, str]:
            return {r["metric"]["instance"]: r["value"][1] for r in stack.query('up{job="bertzoo"}')}

        def recorded_tasks() -> set[str]:  # the recording rules are loaded and run
            return {r["metric"]["task"] for r in stack.query("task:bertzoo_request_seconds:p99_5m")}

        expected_up = {f"127.0.0.1:{stack.metrics_ports[0]}": "1", f"127.0.0.1:{stack.metrics_ports[1]}": "0"}
        checks = {"a finite p99 for every task": lambda: all(
                      result and math.isfinite(float(result[0]["value"][1])) for result in map(p99, TASKS)),
                  "the stopped replica down, the other up": lambda: up() == expected_up,
                  "the recording rules' p99 for every task": lambda: recorded_tasks() >= set(TASKS)}
        for what, check in checks.items():
            try:
                local.wait_until(check, 30, f"no {what}")
            except TimeoutError as e:
                scrapes = {how: {r["metric"]["instance"]: r["value"][1]  # per replica: a timed-out scrape is up 0
                                 for r in stack.query(f'{how}_over_time(up{{job="bertzoo"}}[5m])')}
                           for how in ("sum", "count")}
                raise AssertionError(f"{e}: p99 {[(task, p99(task)) for task in TASKS]}, up {up()}, "
                                     f"recorded {recorded_tasks()}, scrapes (successful, all) {scrapes}") from None
