"""Quick start: global hooks run before module hooks, even a module hook registered with prepend=True.

Run:  hooktrace run samples/quickstart.py

What to look for:
- On every module call the global forward pre-hook (badge `global`) fires before the module's own
  forward pre-hooks, although `first_pre` was registered on the model with `prepend=True` afterwards:
  `prepend` only reorders within the module's own dict (surprise `global-first`).
- `first_pre` (badge `prepend`) fires before `log_pre`, which was registered earlier.
- The forward hook `log_out` sees the output; in backward, the full backward pre-hook and hook
  fire for the same modules in reverse order.
"""

from __future__ import annotations

import torch
from torch import nn

# Each hook appends its name here, so tests can compare hooktrace's order with the real one.
CALLS: list[str] = []


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def global_pre(module: nn.Module, args: tuple) -> None:
    CALLS.append(f"global_pre:{type(module).__name__}")


def log_pre(module: nn.Module, args: tuple) -> None:
    CALLS.append("log_pre")


def first_pre(module: nn.Module, args: tuple) -> None:
    CALLS.append("first_pre")


def log_out(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    CALLS.append("log_out")


def backward_pre(module: nn.Module, grad_output: tuple) -> None:
    CALLS.append("backward_pre")


def backward(module: nn.Module, grad_input: tuple, grad_output: tuple) -> None:
    CALLS.append("backward")


def make() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), nn.Linear(8, 2))
    nn.modules.module.register_module_forward_pre_hook(global_pre)
    model.register_forward_pre_hook(log_pre)
    model.register_forward_pre_hook(first_pre, prepend=True)
    model.register_forward_hook(log_out)
    model[1].register_full_backward_pre_hook(backward_pre)
    model[1].register_full_backward_hook(backward)
    return model, torch.randn(4, 8)
