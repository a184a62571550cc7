"""Many hook kinds on one small model at once, the order they fire in over two training steps.

Run:  hooktrace run samples/mixed_hooks.py --steps 2

Every hook appends its own name to `CALLS` when PyTorch calls it, so the trace can be compared with
what PyTorch really did; `scripts/torch_matrix.sh` compares this sample's order file between torch
versions (README "Torch versions").

What to look for:
- forward: the global pre-hook before `embed`'s own, the prepended `embed_pre_first` before
  `embed_pre`; `embed_pre` registers a buffer and a submodule (the global registration hooks fire
  inside it); `embed_post_kwargs` (with_kwargs) and the `always_call` hook after `embed`'s forward.
- `block` runs under a user's `saved_tensors_hooks` pair; its forward hook puts a grad hook on its
  output, a pre-hook and a hook on the output's autograd node, and a multi-grad hook on its input
  and output.
- `ckpt` runs under non-reentrant `checkpoint`: `ckpt_post` fires again in the `recompute` phase.
- backward: `legacy` has a legacy (non-full) backward hook; `block` full backward pre/post hooks,
  and its backward hook queues an end-of-backward callback (`end_of_backward`, last in backward);
  `head.weight` has a grad hook and a post-accumulate-grad hook; `embed.weight`'s `AccumulateGrad`
  node a hook.
- optimizer: the step pre- and post-hooks; the post-hook saves and reloads `head`'s and the
  optimizer's state dicts, so their state-dict hooks fire inside it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.autograd import Variable
from torch.autograd.graph import register_multi_grad_hook, saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

import hooktrace

CALLS: list[str] = []
_KEEP: list[object] = []  # AccumulateGrad nodes live only while someone holds them


def _call(name: str) -> None:
    CALLS.append(name)


def pack(tensor: torch.Tensor) -> torch.Tensor:
    _call("pack")
    return tensor


def unpack(tensor: torch.Tensor) -> torch.Tensor:
    _call("unpack")
    return tensor


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.ckpt = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.legacy = nn.Tanh()  # one autograd node, input to output: a legacy hook's grads are whole
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        with saved_tensors_hooks(pack, unpack):
            x = self.block(x)
        x = checkpoint(self.ckpt, x, use_reentrant=False)
        return self.head(self.legacy(x))


def make() -> hooktrace.Target:
    torch.manual_seed(0)
    model = Net()

    # global module hooks (every module of the process; hooktrace run is a process of its own)
    def global_pre(module: nn.Module, args: tuple) -> None:
        _call("global_pre")

    def buffer_registered(module: nn.Module, name: str, buffer: Any) -> None:
        _call("buffer_registered")

    def module_registered(module: nn.Module, name: str, submodule: Any) -> None:
        _call("module_registered")

    nn.modules.module.register_module_forward_pre_hook(global_pre)
    nn.modules.module.register_module_buffer_registration_hook(buffer_registered)
    nn.modules.module.register_module_module_registration_hook(module_registered)

    # embed: pre-hooks (one prepended), a with_kwargs forward hook, an always_call one
    def embed_pre(module: nn.Module, args: tuple) -> None:
        _call("embed_pre")
        module.register_buffer("steps", torch.zeros(()))
        module.add_module("scratch", nn.Identity())

    def embed_pre_first(module: nn.Module, args: tuple) -> None:
        _call("embed_pre_first")

    def embed_post_kwargs(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        _call("embed_post_kwargs")

    def embed_always(module: nn.Module, args: tuple, output: Any) -> None:
        _call("embed_always")

    model.embed.register_forward_pre_hook(embed_pre)
    model.embed.register_forward_pre_hook(embed_pre_first, prepend=True)
    model.embed.register_forward_hook(embed_post_kwargs, with_kwargs=True)
    model.embed.register_forward_hook(embed_always, always_call=True)

    # block: tensor, node and multi-grad hooks put on its output each forward; full backward hooks
    def output_grad(grad: torch.Tensor) -> None:
        _call("output_grad")

    def node_pre(grad_outputs: tuple) -> None:
        _call("node_pre")

    def node_post(grad_inputs: tuple, grad_outputs: tuple) -> None:
        _call("node_post")

    def both_grads(grads: Any) -> None:
        _call("both_grads")

    def block_out(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        _call("block_out")
        output.register_hook(output_grad)
        output.grad_fn.register_prehook(node_pre)
        output.grad_fn.register_hook(node_post)
        register_multi_grad_hook((args[0], output), both_grads)

    def end_of_backward() -> None:
        _call("end_of_backward")

    def block_backward_pre(module: nn.Module, grad_output: tuple) -> None:
        _call("block_backward_pre")

    def block_backward(module: nn.Module, grad_input: tuple, grad_output: tuple) -> None:
        _call("block_backward")
        Variable._execution_engine.queue_callback(end_of_backward)

    model.block.register_forward_hook(block_out)
    model.block.register_full_backward_pre_hook(block_backward_pre)
    model.block.register_full_backward_hook(block_backward)

    # ckpt: recomputed in backward
    def ckpt_post(module: nn.Module, args: tuple, output: Any) -> None:
        _call("ckpt_post")

    model.ckpt.register_forward_hook(ckpt_post)

    # legacy: a non-full backward hook
    def legacy_backward(module: nn.Module, grad_input: tuple, grad_output: tuple) -> None:
        _call("legacy_backward")

    model.legacy.register_backward_hook(legacy_backward)

    # parameters: a grad hook and a post-accumulate-grad hook; an AccumulateGrad node hook
    def weight_grad(grad: torch.Tensor) -> None:
        _call("weight_grad")

    def weight_accumulated(param: torch.Tensor) -> None:
        _call("weight_accumulated")

    def embed_accumulated(grad_inputs: tuple, grad_outputs: tuple) -> None:
        _call("embed_accumulated")

    model.head.weight.register_hook(weight_grad)
    model.head.weight.register_post_accumulate_grad_hook(weight_accumulated)
    weight = model.embed.weight
    acc = weight.view_as(weight).grad_fn.next_functions[0][0]
    _KEEP.append(acc)
    acc.register_hook(embed_accumulated)

    # state-dict hooks, fired by the optimizer's post-hook
    def head_state_dict_pre(module: nn.Module, prefix: str, keep_vars: bool) -> None:
        _call("head_state_dict_pre")

    def head_state_dict(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        _call("head_state_dict")

    def head_load_pre(module: nn.Module, state_dict: dict, prefix: str, *rest: Any) -> None:
        _call("head_load_pre")

    def head_load_post(module: nn.Module, incompatible_keys: Any) -> None:
        _call("head_load_post")

    model.head.register_state_dict_pre_hook(head_state_dict_pre)
    model.head.register_state_dict_post_hook(head_state_dict)
    model.head.register_load_state_dict_pre_hook(head_load_pre)
    model.head.register_load_state_dict_post_hook(head_load_post)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step_pre(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        _call("step_pre")

    def step_post(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        _call("step_post")
        model.head.load_state_dict(model.head.state_dict())
        opt.load_state_dict(opt.state_dict())

    def opt_state_dict_pre(opt: torch.optim.Optimizer) -> None:
        _call("opt_state_dict_pre")

    def opt_state_dict(opt: torch.optim.Optimizer, state_dict: dict) -> None:
        _call("opt_state_dict")

    def opt_load_pre(opt: torch.optim.Optimizer, state_dict: dict) -> None:
        _call("opt_load_pre")

    def opt_load_post(opt: torch.optim.Optimizer) -> None:
        _call("opt_load_post")

    optimizer.register_step_pre_hook(step_pre)
    optimizer.register_step_post_hook(step_post)
    optimizer.register_state_dict_pre_hook(opt_state_dict_pre)
    optimizer.register_state_dict_post_hook(opt_state_dict)
    optimizer.register_load_state_dict_pre_hook(opt_load_pre)
    optimizer.register_load_state_dict_post_hook(opt_load_post)
    return hooktrace.Target(model, inputs=torch.randn(4, 8), optimizer=optimizer)
