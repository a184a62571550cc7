"""Backward: full backward pre-hooks and hooks vs tensor hooks on the module's output.

Run:  hooktrace run samples/backward_order.py --phase backward

What to look for, for the last layer `2` (full backward pre-hook `before_backward`, full backward
hook `after_backward`) and two tensor hooks on its output, both registered in forward hooks
(kind `grad`, registered during the run):
- `layer_output_grad` is registered by the layer's own forward hook. Forward hooks run before
  PyTorch wraps the output for the full backward hooks, so this hook sits on the raw output, behind
  the wrapper: it fires AFTER `before_backward`.
- `model_output_grad` is registered by the model's forward hook, on the tensor the layer returned,
  which is the wrapped output: it fires BEFORE `before_backward` (surprise
  `output-hook-before-backward-pre`). Same tensor values, opposite order: where a tensor hook is
  registered decides whether it sees the gradient before or after the module's pre-hooks.
- `after_backward` fires last for the layer, once grad_input is known; the parameter hook
  `weight_grad` fires when the weight's gradient is computed, between the two.
"""

from __future__ import annotations

import torch
from torch import nn

CALLS: list[str] = []


def layer_output_grad(grad: torch.Tensor) -> None:
    CALLS.append("layer_output_grad")


def model_output_grad(grad: torch.Tensor) -> None:
    CALLS.append("model_output_grad")


def watch_layer_output(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    CALLS.append("watch_layer_output")
    output.register_hook(layer_output_grad)


def watch_model_output(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    CALLS.append("watch_model_output")
    output.register_hook(model_output_grad)


def before_backward(module: nn.Module, grad_output: tuple) -> None:
    CALLS.append("before_backward")


def after_backward(module: nn.Module, grad_input: tuple, grad_output: tuple) -> None:
    CALLS.append("after_backward")


def weight_grad(grad: torch.Tensor) -> None:
    CALLS.append("weight_grad")


def make() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    layer = model[2]
    layer.register_forward_hook(watch_layer_output)
    layer.register_full_backward_pre_hook(before_backward)
    layer.register_full_backward_hook(after_backward)
    layer.weight.register_hook(weight_grad)
    model.register_forward_hook(watch_model_output)
    return model, torch.randn(4, 8)
