"""Saved-tensor hooks: `save_on_cpu`, a custom `saved_tensors_hooks`, and checkpoint's own.

Run:  hooktrace run samples/saved_tensors.py

What to look for:
- Every tensor autograd saves for backward goes through a `pack` hook during forward (named
  after the module call it ran in) and comes back through the matching `unpack` hook in backward.
- `block` runs under `save_on_cpu()` (PyTorch's offloading `saved_tensors_hooks`): its pack and
  unpack hooks are `save_on_cpu.__init__.<locals>.pack_to_cpu` / `unpack_from_cpu`.
- `ckpt` runs under non-reentrant `checkpoint`, whose own pack hooks save almost nothing. The
  first `unpack` of one of its tensors in backward is what triggers the recompute: the `recompute`
  phase (the block's forward again, with the recomputation's own pack hooks) starts right after it.
- `count_pack` / `count_unpack` are the user's own pair around the head.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd.graph import save_on_cpu, saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

CALLS: list[str] = []


def count_pack(tensor: torch.Tensor) -> torch.Tensor:
    CALLS.append("pack")
    return tensor


def count_unpack(tensor: torch.Tensor) -> torch.Tensor:
    CALLS.append("unpack")
    return tensor


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.ckpt = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with save_on_cpu():
            x = self.block(x)
        x = checkpoint(self.ckpt, x, use_reentrant=False)
        with saved_tensors_hooks(count_pack, count_unpack):
            return self.head(x)


def make() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Net(), torch.randn(4, 8)
