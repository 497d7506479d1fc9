"""Run by tests/test_ddp.py under torchrun: train a tiny model with DDP and dump this rank's final weights."""

import json
import sys

import torch.distributed as dist
from safetensors.torch import save_file

from bertzoo.trainer.config import TrainConfig
from bertzoo.trainer.train import train

if __name__ == "__main__":
    config = TrainConfig.from_dict(json.loads(sys.argv[1]))
    model, _ = train(config)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              f"{sys.argv[2]}/rank{dist.get_rank()}.safetensors")
    dist.destroy_process_group()
