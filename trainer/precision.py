"""The training step's precision: fp32, or bf16 autocast (master weights, optimizer state and checkpoints stay fp32).

``auto`` is bf16 on a GPU that supports it and fp32 on a CPU, so a CPU run gives the same numbers on every machine
and the recorded CPU figures stay reproducible. On a CPU with native bf16 (avx512_bf16, AMX) bf16 is opt-in and
faster per step (benchmarks/RESULTS.md, "Training recipe and scores", its subsection "bf16 autocast on the CPU");
on one without, oneDNN emulates it, slower than
fp32. A CPU run says at its start when its precision is not the fast one for its CPU.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from bertzoo.cpu import native_bf16


def uses_bf16(precision: str, device: torch.device) -> bool:
    return precision == "bf16" or (precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported())


def autocast_context(precision: str, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16) if uses_bf16(precision, device) else nullcontext()


def cpu_precision_advice(precision: str, device: torch.device) -> str | None:
    """One line for a CPU run whose precision is not the fast one for this CPU, else None."""
    native = native_bf16()
    if device.type != "cpu" or uses_bf16(precision, device) == native:
        return None
    if native:
        return ("this CPU computes bf16 natively (avx512_bf16 or amx_bf16): --precision bf16 takes 0.67-0.80 of fp32's step "
                "time, dev scores within seed noise of fp32 (benchmarks/RESULTS.md, \"bf16 autocast on the CPU\")")
    return ("--precision bf16 on a CPU without native bf16 (no avx512_bf16 or amx_bf16 flag) is emulated, slower than "
            "fp32; leave --precision at auto here")
