"""benchmarks/common/engine_loop.py (`engine_hops --loop-alone`): the engine's loop serves the played front ends'
hops in process and every request is answered and counted; it reaches into EngineHost, so a change there shows here."""

from __future__ import annotations

from benchmarks.common.engine_loop import loop_alone


def test_the_loop_alone_answers_every_played_request(tiny_artifact):
    _, artifact = tiny_artifact
    rows = loop_alone(str(artifact), ["a gorgeous , witty , seductive movie .", "dull"], [1, 4], peers=3, window=8,
                      seconds=0.3, rounds=1, batch_seconds=0.0005)
    assert [(r["per_hop"], r["peers"]) for r in rows] == [(1, 3), (4, 3)]
    for row in rows:
        assert row["requests"] > 8  # the window, answered and sent again for 0.3 s
        assert row["loop_cpu_us_per_request"] > 0 and row["mean_batch_rows"] >= 1
