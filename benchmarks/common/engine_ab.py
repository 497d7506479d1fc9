"""The engine in process, two ways side by side (``serve_ab --in-process``): the in-process rate of each ONNX Runtime
encoder variant under two arms, alternating rounds in one run, so the machine's drift falls on both equally.

- Two exports of one checkpoint (``BEFORE AFTER``): an export-side change (a graph rewrite, an exporter option).
- ``--denormals``: one export with the engine threads flushing denormal floats to zero (what a server's do,
  serving/workers.py) and without; also ONNX Runtime's Softmax alone over attention scores [32, 12, 40, 40] with 7
  columns of each row masked (the additive mask's large negative score) or none, where the cost comes from.

The rate is :func:`benchmarks.common.ceiling.in_process_rates`': the server's own batch computation (Sentiment: the
encoder, then the head) on every sentence, padded as the server pads, one engine on every core, batches of ``rows``,
the best of 2 passes. Each measurement runs on a fresh thread that starts without flushing.
"""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

from benchmarks.common.ceiling import in_process_rates
from bertzoo.artifact import load_manifest
from bertzoo.cpu import flush_denormals, set_flush_denormals

VARIANTS = ("fp32", "optimized", "int8")
SETTING = "1 engine(s), batches of {rows}, padded as the server pads, spinning off"

# An arm: its name, the artifact it serves, and whether the engine threads flush denormals.
Arm = tuple[str, str, bool]


def in_thread(function, *args):
    """``function(*args)`` on a new thread that starts with flushing off (as a server's worker does before it asks),
    so that no arm inherits another's mode."""
    result: list = []

    def run() -> None:
        set_flush_denormals(False)
        result.append(function(*args))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return result[0]


def served_rate(artifact: str, variant: str, flush: bool, sentences: list[str], threads: int, rows: int) -> float:
    """Sentences/s of the server's batch computation (Sentiment) on ``artifact``'s ``variant`` encoder."""
    found = in_process_rates(artifact, "onnxruntime", {"variant": variant}, sentences, threads, tasks=("sentiment",),
                             batch_sizes=(rows,), only=SETTING.format(rows=rows), flush=flush)
    return next(iter(found.values()))["rate"]


def softmax_us(masked: bool, flush: bool, repeats: int = 300) -> float:
    """Median microseconds of ONNX Runtime's Softmax over [32, 12, 40, 40] scores, the last 7 columns masked or not."""
    import onnx.helper as helper
    import onnxruntime as ort

    from bertzoo.serving.backends.ort import session_options

    shape = [32, 12, 40, 40]
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
                              [helper.make_tensor_value_info("x", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), session_options(flush_denormals=flush),
                                   providers=["CPUExecutionProvider"])
    if flush:
        flush_denormals()
    scores = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    if masked:
        scores[..., -7:] = np.finfo(np.float32).min  # the exported graph's additive mask
    times = []
    for k in range(repeats + 20):
        started = time.perf_counter()
        session.run(None, {"x": scores})
        if k >= 20:
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def softmax_costs() -> dict[str, float]:
    costs = {}
    for masked in (False, True):
        for flush in (False, True):
            label = f"{'masked' if masked else 'unmasked'}, flush {'on' if flush else 'off'}"
            costs[label] = in_thread(softmax_us, masked, flush)
            print(f"softmax [32, 12, 40, 40] {label}: {costs[label]:.0f} us", flush=True)
    return costs


def compare(arms: list[Arm], variants: list[str], sentences: list[str], rounds: int, threads: int,
            rows: int) -> list[dict]:
    """Every variant the arms' artifacts all have, under each arm, in alternating order over ``rounds``; prints
    each rate and, per variant, the second arm's ratio to the first in each round."""
    have = [set(load_manifest(artifact)["graphs"]["encoder"]["files"]) for _, artifact, _ in arms]
    results: list[dict] = []
    for variant in (v for v in variants if all(v in h for h in have)):
        for round_ in range(rounds):
            for name, artifact, flush in (arms if round_ % 2 == 0 else arms[::-1]):
                rate = in_thread(served_rate, artifact, variant, flush, sentences, threads, rows)
                results.append({"variant": variant, "round": round_, "arm": name, "artifact": artifact,
                                "flush": flush, "sentences_per_s": rate})
                print(f"{variant} round {round_ + 1} {name}: {rate:.1f} sentences/s", flush=True)
        by_arm = [[r["sentences_per_s"] for r in results if r["variant"] == variant and r["arm"] == name]
                  for name, _, _ in arms[:2]]
        ratios = sorted(b / a for a, b in zip(*by_arm, strict=True))
        print(f"{variant}: {arms[1][0]} / {arms[0][0]} {ratios[0]:.3f}-{ratios[-1]:.3f} (per round)", flush=True)
    return results
