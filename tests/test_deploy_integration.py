"""The compose bundle's parts for real, on loopback (deploy/local.py): two `bertzoo serve` replicas behind nginx
running deploy/compose/nginx.conf, and Prometheus with deploy/prometheus/rules.yml scraping both each second. Traffic
of every task goes through nginx, both replicas answer a share, Prometheus computes a p99 for every task, and SIGTERM
to one replica in the middle of the traffic loses no request."""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

import pytest

from bertzoo.serving.client import BertzooClient, channel_options

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))
import local  # noqa: E402

pytestmark = pytest.mark.skipif(
    bool(local.missing_tools()), reason=f"needs {' and '.join(local.missing_tools())} (.ci/run installs them with "
                                        "apt-get: Debian packages nginx and prometheus)")

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


def requests_answered(stack: local.LocalStack, i: int) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_ports[i]}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "bertzoo_requests_total" and s.labels["code"] == "OK")


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

            failures: list[BaseException] = []
            answered = [0]

            def traffic(offset: int) -> None:
                with BertzooClient(stack.target, options=channel_options(retries=False), timeout=30) as own:
                    for i in range(offset, offset + 100):
                        try:
                            call(own, TASKS[i % len(TASKS)], i)
                            answered[0] += 1
                        except Exception as e:  # noqa: BLE001  (every failure is reported below)
                            failures.append(e)

            threads = [threading.Thread(target=traffic, args=(k * 1000,)) for k in range(4)]
            for thread in threads:
                thread.start()
            time.sleep(0.5)
            stack.stop_replica(1)  # SIGTERM in the middle of the traffic
            for thread in threads:
                thread.join()
            assert not failures, failures[:3]
            assert answered[0] == 400
            assert stack.servers[1].wait(60) == 0  # drained and exited cleanly
            for i in range(20):  # after the drain, the remaining replica answers everything
                call(client, TASKS[i % len(TASKS)], i)

        time.sleep(2.5)  # two more scrapes, one of them of the stopped replica
        for task in TASKS:
            result = stack.query(f'histogram_quantile(0.99, sum by (le) (rate(bertzoo_request_seconds_bucket'
                                 f'{{job="bertzoo", task="{task}"}}[1m])))')
            assert result and math.isfinite(float(result[0]["value"][1])), (task, result)
        up = {r["metric"]["instance"]: r["value"][1] for r in stack.query('up{job="bertzoo"}')}
        assert up == {f"127.0.0.1:{stack.metrics_ports[0]}": "1", f"127.0.0.1:{stack.metrics_ports[1]}": "0"}
        recorded = stack.query("task:bertzoo_request_seconds:p99_5m")  # the recording rules are loaded and run
        assert {r["metric"]["task"] for r in recorded} >= set(TASKS)

