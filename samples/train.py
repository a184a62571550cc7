"""A training script as you would write it: a small model, AdamW, one checkpointed block, and a
clamping pre-hook that a "library" puts in front with `prepend=True`.

Run:  hooktrace exec samples/train.py        (as `python samples/train.py` runs it)

What to look for:
- `clamp_inputs` runs before `log_inputs` on `<root>`, although `log_inputs` was registered first:
  prepend=True puts a hook in front (surprise `replaced-value`: it returns new inputs).
- The checkpointed block's `pack` hooks are PyTorch's own (`--hide-library` leaves them out), and
  its forward runs again during backward (`recompute`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.GELU())
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.block, x, use_reentrant=False))


def log_inputs(module: nn.Module, args: tuple) -> None:
    pass


def clamp_inputs(module: nn.Module, args: tuple) -> tuple:
    return (args[0].clamp(-3, 3),)


def check_grads(module: nn.Module, grad_input: tuple, grad_output: tuple) -> None:
    pass


def main() -> None:
    torch.manual_seed(0)
    model = Net()
    model.register_forward_pre_hook(log_inputs)
    model.register_forward_pre_hook(clamp_inputs, prepend=True)  # what a library would do
    model.head.register_full_backward_hook(check_grads)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
