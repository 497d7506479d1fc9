"""What a training process sets up before its first step: its place in a torchrun launch (rank, world size, device,
the process group) and its seeded random generators. Kept out of the loops: fine-tuning runs under DDP, pre-training
in one process, and both seed the same way.

torchrun sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; a plain launch (none set) is one process on the GPU if
there is one, else the CPU.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass
class Dist:
    """This process's place in the run; rank 0 (``is_main``) alone logs, evaluates and writes checkpoints."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Dist:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; a plain launch is one process. Several processes join one process
    group (nccl on GPUs, gloo on the CPU), each on its own GPU where there are GPUs."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    return Dist(dist.get_rank(), world_size, device)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators: training is deterministic given the seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
