"""Activation checkpointing re-runs forward hooks during backward (`torch.utils.checkpoint`).

Run:  hooktrace run samples/checkpoint_recompute.py

What to look for:
- Each block runs under `checkpoint(block, x, use_reentrant=False)`. Its activations are not kept;
  backward runs the block's forward again to recompute them.
- The forward pre-hook and forward hook of every layer inside a block fire twice: once in the
  `forward` phase and again in the `recompute` phase, in the middle of backward (surprise
  `recompute`). A hook that counts calls or logs activations sees each block twice.
- Non-reentrant checkpoint may stop a recompute early once it has what it needs; PyTorch raises
  and catches `_StopRecomputationError` for that. hooktrace records it on the module's `exit`
  event; it is not an error of the run.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

CALLS: list[str] = []


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self, width: int = 8, depth: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def make() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Net()
    for name, module in model.named_modules():
        if name.startswith("blocks.") and name.count(".") == 2:  # blocks.0.fc, blocks.0.act, ...

            def pre(module: nn.Module, args: tuple, name: str = name) -> None:
                CALLS.append(f"pre:{name}")

            def post(module: nn.Module, args: tuple, output: torch.Tensor, name: str = name) -> None:
                CALLS.append(f"post:{name}")

            module.register_forward_pre_hook(pre)
            module.register_forward_hook(post)
    return model, torch.randn(4, 8, requires_grad=True)
