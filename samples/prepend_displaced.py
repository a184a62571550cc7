"""A later `prepend=True` displaces an earlier one: "prepend" means "first for now", not "first".

Run:  hooktrace run samples/prepend_displaced.py

What to look for:
- `cast_inputs` was registered with `prepend=True` because it must see the raw inputs first
  (think of a library that casts or shards inputs).
- Later, `log_inputs` is also registered with `prepend=True` and goes in front of it. The tree shows
  both with the `prepend` badge, `log_inputs` first, and the surprise `prepend-displaced` names
  `cast_inputs`: it is not first any more, so `log_inputs` sees the inputs before the cast.
- `user_pre`, registered first without prepend, runs last.
"""

from __future__ import annotations

import torch
from torch import nn

CALLS: list[str] = []


def user_pre(module: nn.Module, args: tuple) -> None:
    CALLS.append("user_pre")


def cast_inputs(module: nn.Module, args: tuple) -> tuple:
    CALLS.append("cast_inputs")
    return tuple(a.float() for a in args)


def log_inputs(module: nn.Module, args: tuple) -> None:
    CALLS.append(f"log_inputs:{args[0].dtype}")


def install_cast(model: nn.Module) -> None:
    """What a library does: insert its hook in front of whatever is there."""
    model.register_forward_pre_hook(cast_inputs, prepend=True)


def install_logging(model: nn.Module) -> None:
    """Added later by someone else, also with prepend=True, so it now runs before the cast."""
    model.register_forward_pre_hook(log_inputs, prepend=True)


def make() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    model.register_forward_pre_hook(user_pre)
    install_cast(model)
    install_logging(model)
    return model, torch.randn(4, 8, dtype=torch.float64)
