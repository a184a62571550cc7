"""FSDP2 on a one-rank gloo group, imported by the script itself (`hooktrace exec` opens its capture
before the script's imports): each all-reduce hook call records its step (tests/test_capture_fsdp_comm.py)."""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
dist.init_process_group("gloo", rank=0, world_size=1)
calls = []
step = 0


def all_reduce_hook(reduced: torch.Tensor) -> None:
    calls.append(f"all_reduce_hook step {step}")


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
fully_shard(model[0])
fully_shard(model)
model[0].set_all_reduce_hook(all_reduce_hook)
model.set_all_reduce_hook(all_reduce_hook)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):  # noqa: B007 - the hook reads `step`
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
print("\n".join(calls), file=sys.stderr)
dist.destroy_process_group()
