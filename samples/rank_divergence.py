"""Ranks that do not register the same hooks: a debugging hook added on rank 1 only.

Run:  hooktrace run --nproc 2 samples/rank_divergence.py      (exit code 1: the ranks diverge)

A hook behind `if dist.get_rank() == 1:` (logging, a NaN check, a profiler) looks harmless, but
hook-based distributed training assumes every rank fires the same hooks in the same order; a hook
that issues a collective, or changes what FSDP sees, then hangs or corrupts only some runs.

What to look for:
- The summary names the first divergence: at step 0, forward, module `blocks.1`, the forward hook
  on rank 0 is `FSDPState._post_forward` but on rank 1 it is `log_activation`.
- `log_activation` is listed as registered only on rank 1, and its call count differs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

STATS: list[float] = []


class Net(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(width, width), nn.Linear(width, width))
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.blocks(x)))


def log_activation(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    STATS.append(output.detach().abs().mean().item())


def make() -> tuple[nn.Module, torch.Tensor]:
    if not dist.is_initialized():  # hooktrace run --nproc has done it already
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Net()
    for layer in model.blocks:
        fully_shard(layer)
    fully_shard(model)
    if dist.get_rank() == 1:  # the bug: only rank 1 watches its activations
        model.blocks[1].register_forward_hook(log_activation, prepend=True)
    return model, torch.randn(4, 16)
