"""The training step's precision: bf16 autocast where asked (fp32 on a CPU by default), and the one line a CPU run
gets when its precision is not the fast one for its CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch

import bertzoo.cpu
from bertzoo.trainer import precision


@pytest.fixture
def cpu_with(monkeypatch):
    def set_flags(*flags: str) -> None:
        monkeypatch.setattr(bertzoo.cpu, "cpu_flags", lambda: {"avx2", "fma", *flags})
    return set_flags


@pytest.mark.parametrize("flags, native", [((), False), (("avx512f",), False), (("avx512_bf16",), True),
                                           (("amx_bf16", "amx_tile"), True)])
def test_native_bf16_is_avx512_bf16_or_amx(cpu_with, flags, native):
    cpu_with(*flags)
    assert bertzoo.cpu.native_bf16() is native


def test_bf16_autocast_where_asked_and_fp32_on_a_cpu_by_default():
    cpu = torch.device("cpu")
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with precision.autocast_context("bf16", cpu):
        assert (a @ b).dtype == torch.bfloat16
    for default in ("auto", "fp32"):
        with precision.autocast_context(default, cpu):
            assert (a @ b).dtype == torch.float32


def test_a_cpu_run_is_told_when_its_precision_is_not_the_fast_one(cpu_with):
    cpu = torch.device("cpu")
    cpu_with("avx512_bf16")
    assert "--precision bf16" in precision.cpu_precision_advice("auto", cpu)
    assert precision.cpu_precision_advice("bf16", cpu) is None
    cpu_with("avx512f")
    assert "emulated" in precision.cpu_precision_advice("bf16", cpu)
    assert precision.cpu_precision_advice("auto", cpu) is None
    assert precision.cpu_precision_advice("fp32", cpu) is None
    assert precision.cpu_precision_advice("bf16", torch.device("cuda")) is None  # GPUs: not this advice


@pytest.mark.parametrize("preset", ["baseline", "ssaf", "ag", "ssa"])
def test_every_training_path_trains_under_bf16_autocast_on_the_cpu(tiny_train_config, preset):
    from bertzoo.trainer import train as train_module
    from bertzoo.zoo import load_preset
    from conftest import TINY_ENCODER

    settings = dict(load_preset(preset).train)
    encoder = {**TINY_ENCODER, **settings.pop("encoder_overrides", {})}
    if preset == "ssa":
        settings["ssa_probe_limit"] = 8
    config = tiny_train_config(**settings, encoder_overrides=encoder, precision="bf16", tasks=("sentiment",),
                               eval_every_epoch=False)
    model, _ = train_module.train(config)
    # autocast computes in bf16 but keeps the weights (and so the checkpoint) in fp32
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    losses = [r["loss"]["sentiment"] for r in map(json.loads, open(f"{config.out_dir}/train_log.jsonl")) if "loss" in r]
    assert losses and all(math.isfinite(x) for x in losses)
