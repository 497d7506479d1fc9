"""The encoder variants the serving benchmarks compare, and each one's in-process ceiling: what the server's own
batch computation reaches on the same sentences with no transport, the figure a served rate is a fraction of.
Shared by the serving benchmarks (serve_goals, serve_frontends, serve_h2load), so every one names a variant, starts
its server and measures its ceiling the same way.
"""

from __future__ import annotations

import importlib.util

from benchmarks.common.ceiling import in_process_rates
from bertzoo.cpu import native_bf16

TASKS = ("sentiment", "embed")  # the RPCs a ceiling is measured for by default
# A variant: its engine, that engine's create_backend arguments, the `bertzoo serve` flags that pick it, and the
# precision whose matrix-product peak it is held against (bf16 against fp32's: no bf16 product is measured here).
VARIANTS = {
    "fp32": ("onnxruntime", {"variant": "fp32"}, ["--variant", "fp32"], "fp32"),
    "optimized": ("onnxruntime", {"variant": "optimized"}, ["--variant", "optimized"], "fp32"),
    "int8": ("onnxruntime", {"variant": "int8"}, ["--variant", "int8"], "int8"),
    "openvino-fp32": ("openvino", {"precision": "fp32"}, ["--backend", "openvino", "--precision", "fp32"], "fp32"),
    "openvino-bf16": ("openvino", {"precision": "bf16"}, ["--backend", "openvino", "--precision", "bf16"], "fp32"),
}
FP32_VARIANTS = ("fp32", "optimized", "openvino-fp32")  # what is compared with the peer's fp32 engines


def default_variants() -> list[str]:
    """ONNX Runtime's three graphs, and OpenVINO's precisions where it is installed (bf16 only where native)."""
    names = ["fp32", "optimized", "int8"]
    if importlib.util.find_spec("openvino") is None:
        return names

    return names + ["openvino-fp32"] + (["openvino-bf16"] if native_bf16() else [])


def in_process_ceiling(artifact: str, variant: str, sentences: list[str], threads: int,
                       tasks: tuple[str, ...] = TASKS) -> dict[str, dict]:
    """Per task: the variant's in-process ceiling (``ceiling.in_process_rates``: the best over its settings) and the
    setting that gave it ("best"), the best of the settings that pad as the server does, and every setting's rate and
    padding efficiency."""
    engine, engine_args = VARIANTS[variant][:2]
    found = in_process_rates(artifact, engine, engine_args, sentences, threads, tasks)
    out = {}
    for task in tasks:
        settings = {s: f for (t, s), f in found.items() if t == task}
        best = max(settings, key=lambda s: settings[s]["rate"])
        out[task] = {"ceiling": settings[best]["rate"], "best": best, "settings": settings,
                     "as_served": max(f["rate"] for f in settings.values() if f["as_served"])}
    return out


def ceiling_at(artifact: str, variant: str, sentences: list[str], threads: int, task: str, setting: str) -> float:
    """The variant's in-process rate for ``task`` at one ``setting`` (a name of ``in_process_ceiling``'s settings,
    chosen there): the ceiling again, without measuring the settings that lost."""
    engine, engine_args = VARIANTS[variant][:2]
    found = in_process_rates(artifact, engine, engine_args, sentences, threads, (task,), only=setting)
    return found[(task, setting)]["rate"]
