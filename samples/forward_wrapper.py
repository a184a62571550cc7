"""A forward wrapper on a module instance, the way accelerate (`add_hook_to_module`, `cpu_offload`,
`dispatch_model`) and nnsight do it, in plain torch.

Run:  hooktrace run samples/forward_wrapper.py

What to look for:
- `fc1.forward` is replaced on the instance by `partial(new_forward, fc1)` (accelerate's pattern:
  `functools.update_wrapper(partial(new_forward, module), old_forward)`). It is not a hook, yet it
  runs on every call: hooktrace shows it as a `forward_wrapper` of `fc1`.
- Its place is between `fc1`'s forward pre-hook and its forward hook: the pre-hook runs before the
  wrapper moved the weights (accelerate's offloading would show them on `meta` there), the forward
  hook after.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

CALLS: list[str] = []


def add_hook_to_module(module: nn.Module) -> nn.Module:
    """accelerate's `add_hook_to_module`, reduced to what changes the order."""
    old_forward = module.forward
    module._old_forward = old_forward

    def new_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        CALLS.append("wrapper:pre_forward")  # accelerate: hook.pre_forward (onload weights, move inputs)
        output = module._old_forward(*args, **kwargs)
        CALLS.append("wrapper:post_forward")  # accelerate: hook.post_forward (offload)
        return output

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), old_forward)
    return module


def make() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(8, 8))
    model.add_module("act", nn.ReLU())
    model.add_module("fc2", nn.Linear(8, 1))

    def pre(module: nn.Module, args: tuple) -> None:
        CALLS.append("pre")

    def post(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        CALLS.append("post")

    model.fc1.register_forward_pre_hook(pre)
    model.fc1.register_forward_hook(post)
    add_hook_to_module(model.fc1)
    return model, torch.randn(4, 8)
