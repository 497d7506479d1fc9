"""The GPU session's goal lines: each goal read from the right rows, met or missed by its direction."""

from benchmarks.serve_frontends import GPU_GOALS, gpu_goal_lines


def row(rate: float, task: str = "sentiment", per_request: int = 1) -> dict:
    return {"items_per_s": rate, "task": task, "sentences_per_request": per_request}


def test_each_goal_is_met_or_missed_from_its_own_rows():
    gpu = {"ceiling_per_s": 120_000.0,
           "rows": [{"items_per_s": 21_000.0, "sentences_per_request": 1}],  # one-sentence rows carry no task
           "replica_rows": [row(90_000.0, "embed", 32),  # a 32-sentence rate never counts as a one-sentence one
                            row(59_000.0, "sentiment", 32), row(18_000.0)],
           "lone": {"auto, s128": {"client": 1.4}, "auto, one sentence": {"client": 9.9}}}
    assert gpu_goal_lines(gpu) == [
        "goal: in-process ceiling 120,000.00/s against 100,000/s: met",
        "goal: one-sentence requests 21,000.00/s against 20,000/s: met",
        "goal: one-sentence requests against the ceiling 0.17 against 0.85: MISSED",
        "goal: embed, 32 sentences a request 90,000.00 sentences/s against 60,000 sentences/s: met",
        "goal: sentiment, 32 sentences a request 59,000.00 sentences/s against 60,000 sentences/s: MISSED",
        "goal: lone 128-token request, client p50 1.40 ms against 1.5 ms: met"]
    assert set(GPU_GOALS) == {"ceiling_per_s", "one_sentence_per_s", "one_sentence_of_ceiling",
                              "per_request_32_sentences_per_s", "lone_s128_client_ms"}  # each one checked above
