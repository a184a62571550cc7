"""FSDP2 `fully_shard` + composable `checkpoint` on 2 ranks: whose forward hooks run first, on every rank.

Run:  hooktrace run --nproc 2 samples/fsdp_two_ranks.py -o fsdp.json   # fsdp.rank0.json, fsdp.rank1.json

hooktrace initialises the default process group (gloo on CPU) before it calls `make()`, so the
factory just uses it; under plain `torchrun` the guard below initialises it.

What to look for:
- On each block, `FSDPState._pre_forward` (badge `prepend`) fires before `checkpoint`'s forward
  pre-hook although `checkpoint(block)` registered first: `fully_shard` registers it with
  `prepend=True`, so parameters are all-gathered before anything else sees them.
- In backward, the blocks run forward again (phase `recompute`): checkpoint's recompute, with
  FSDP's hooks firing a second time.
- The per-rank summary says `ranks agree`: both ranks fire the same hooks in the same order,
  which collectives need.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make() -> tuple[nn.Module, torch.Tensor]:
    if not dist.is_initialized():  # hooktrace run --nproc has done it already
        dist.init_process_group("gloo")
    torch.manual_seed(0)  # same weights and inputs on every rank
    model = Net()
    for block in model.blocks:
        checkpoint(block)  # composable activation checkpointing: a forward pre-hook and a forward hook
        fully_shard(block)  # FSDP2: its pre-forward hook is registered with prepend=True
    fully_shard(model)
    return model, torch.randn(4, 16)
