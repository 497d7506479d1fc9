"""Distributed training runs on torchrun/DDP: two CPU processes on gloo keep identical weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertzoo.trainer.train import build_model

pytestmark = pytest.mark.slow  # real processes: `pytest -m 'not slow'` leaves them out


def test_two_gloo_processes_keep_equal_weights(tiny_train_config, tmp_path):
    config = tiny_train_config(out_dir=str(tmp_path / "run"), eval_every_epoch=False, max_steps=6,
                               tasks=("sentiment", "similarity"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    worker = Path(__file__).with_name("ddp_worker.py")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker),
         json.dumps(config.to_dict()), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = (load_file(str(tmp_path / f"rank{r}.safetensors")) for r in (0, 1))
    torch.manual_seed(config.seed)
    initial = build_model(config)[0].state_dict()
    changed = 0
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), f"{name} differs between ranks"
        changed += not torch.equal(tensor, initial[name])
    assert changed > 10, "training must have moved the weights"
    assert (tmp_path / "run" / "LATEST").read_text() == "checkpoint-000006"
