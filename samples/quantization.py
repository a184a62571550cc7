"""Eager-mode quantization `prepare` inserts observers as prepended forward hooks.

Run:  hooktrace run samples/quantization.py --no-backward

What to look for:
- Before `prepare`, the user registered `inspect_output` as a forward hook on `conv` and `fc`.
- `torch.ao.quantization.prepare` adds an observer to each quantizable module and registers
  `_observer_forward_hook` with `prepend=True` (registered at torch/ao/quantization/quantize.py).
  The tree shows it with the `prepend` badge, in front of `inspect_output`: the observer records
  the output before the user's hook runs, so a user hook that returns a new output changes what
  the next module sees but not what the observer recorded.
- `quant` (QuantStub) has only the observer hook.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.ao.quantization import DeQuantStub, QuantStub, get_default_qconfig, prepare

CALLS: list[str] = []


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quant = QuantStub()
        self.conv = nn.Conv2d(3, 4, 3)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4 * 6 * 6, 10)
        self.dequant = DeQuantStub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv(self.quant(x)))
        return self.dequant(self.fc(x.flatten(1)))


def inspect_output(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    CALLS.append(f"inspect_output:{type(module).__name__}")


def make() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Net().eval()
    model.conv.register_forward_hook(inspect_output)
    model.fc.register_forward_hook(inspect_output)
    model.qconfig = get_default_qconfig("qnnpack")  # x86/fbgemm warn about reduce_range
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore", DeprecationWarning)
        prepare(model, inplace=True)
    return model, torch.randn(2, 3, 8, 8)
