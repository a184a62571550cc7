"""A forward raises: only forward hooks registered with `always_call=True` still run.

Run:  hooktrace run samples/always_call.py      (exit code 1 is expected: the model raises)

What to look for:
- `Flaky.forward` raises `RuntimeError`. hooktrace still shows the partial trace, writes it with
  `-o`, exits with 1 and names the module (`flaky`) and the exception.
- The forward hooks of `flaky`: `release_resources` (badge `always`) runs after the exception;
  `record_output` (no always_call) does not run and is reported as never fired.
- The module `flaky`'s `exit` event carries the error, and so does its parent's.
"""

from __future__ import annotations

import torch
from torch import nn

CALLS: list[str] = []


class Flaky(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("flaky layer failed on purpose")


def record_output(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    CALLS.append("record_output")


def release_resources(module: nn.Module, args: tuple, output: object) -> None:
    CALLS.append("release_resources")


def before(module: nn.Module, args: tuple) -> None:
    CALLS.append("before")


def make() -> tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential()
    model.add_module("encoder", nn.Linear(4, 4))
    model.add_module("flaky", Flaky())
    model.flaky.register_forward_pre_hook(before)
    model.flaky.register_forward_hook(record_output)
    model.flaky.register_forward_hook(release_resources, always_call=True)
    return model, torch.randn(2, 4)
