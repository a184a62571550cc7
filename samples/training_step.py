"""A training step with an optimizer: step hooks, AccumulateGrad hooks, "optimizer in backward".

Run:  hooktrace run samples/training_step.py

What to look for:
- The step ends with `optimizer.step()`: its pre-hook and (after the update) its post-hook are in
  the `optimizer` phase. (A global `register_optimizer_step_pre_hook` would fire for every
  optimizer, the in-backward ones too; it is left out here because it would stay registered in
  the process after the run.)
- `head.weight` and `head.bias` are updated *inside* backward ("optimizer in backward"): a
  `post_accumulate_grad` hook on each runs its own SGD step as soon as its gradient is ready, and
  sets `.grad` to None so the main optimizer skips them.
- A `node` hook on the `AccumulateGrad` node of `body.weight` (how FSDP1 and DeepSpeed attach
  post-backward work) is named after the parameter it accumulates, and fires after that
  parameter's gradient is accumulated, in the `backward` phase. The node is the one the parameter
  has when the hook is registered: moving the model afterwards to another device or dtype
  (`--device cuda` on this CPU-built model, `.to("cuda")`, `.double()`) makes PyTorch replace it, so
  the hook never fires there, and `never-fired` says that the parameter's move replaced its
  AccumulateGrad node (the order file differs between CPU and CUDA for that reason). `--device meta`
  goes further: the move makes new parameter tensors, so the `post_accumulate_grad` hooks stay on
  the old ones too, and `never-fired` says the move replaced each parameter (and its node). Register
  such hooks after the move, or build the model on its device, to keep them.
"""

from __future__ import annotations

import torch
from torch import nn

import hooktrace

CALLS: list[str] = []
_KEEP: list[object] = []  # AccumulateGrad nodes live only while someone holds them


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def make() -> hooktrace.Target:
    torch.manual_seed(0)
    model = Net()

    # "optimizer in backward": one tiny optimizer per head parameter, stepped from its hook
    for name, param in model.head.named_parameters():
        inner = torch.optim.SGD([param], lr=0.01)

        def step_now(p: torch.Tensor, inner: torch.optim.Optimizer = inner, name: str = name) -> None:
            CALLS.append(f"in_backward_step:head.{name}")
            inner.step()
            p.grad = None

        param.register_post_accumulate_grad_hook(step_now)

    weight = model.body.weight
    acc = weight.view_as(weight).grad_fn.next_functions[0][0]
    _KEEP.append(acc)

    def after_accumulate(grad_inputs: tuple, grad_outputs: tuple) -> None:
        CALLS.append("accumulated:body.weight")

    acc.register_hook(after_accumulate)

    body = [p for n, p in model.named_parameters() if n.startswith("body.")]
    optimizer = torch.optim.SGD(body, lr=0.1)

    def before_step(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        CALLS.append("optimizer_pre")

    def after_step(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        CALLS.append("optimizer_post")

    optimizer.register_step_pre_hook(before_step)
    optimizer.register_step_post_hook(after_step)
    return hooktrace.Target(model, inputs=torch.randn(4, 8), optimizer=optimizer)
