"""Shared by the training-step capture tests: self-recording hooks, snapshots, a small model."""

from __future__ import annotations

import contextlib
import functools
import gc
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.optim.optimizer as optim_module
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

OPT_ATTRS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


class Log:
    """Hooks that record their own label; `ids` maps trace hook ids to labels once known."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def fn(self, label: str, returns: Callable[..., Any] | None = None) -> Callable[..., Any]:
        def hook(*args: Any, **kwargs: Any) -> Any:
            self.log.append(label)
            return returns(*args) if returns is not None else None

        hook.__qualname__ = f"hook_{label}"
        return hook

    def traced(self, trace: Any) -> list[str]:
        names = {h.id: h.name for h in trace.hooks}
        return [
            names[e.hook][len("hook_") :]
            for e in trace.events
            if e.type == "hook" and names[e.hook].startswith("hook_")
        ]


def by_name(trace: Any, label: str) -> Any:
    [hook] = [h for h in trace.hooks if h.name == f"hook_{label}"]
    return hook


def optimizer_state(opt: torch.optim.Optimizer) -> dict[str, list]:
    snap = {a: [(k, v) for k, v in getattr(opt, a).items()] for a in OPT_ATTRS}
    for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        snap[name] = list(getattr(optim_module, name).items())
    return snap


def class_state() -> dict[Any, Any]:
    """Every attribute of Optimizer and its subclasses, saved_tensors_hooks' methods and the patched
    autograd attributes."""
    out: dict[Any, Any] = {}
    todo = [torch.optim.Optimizer]
    while todo:
        cls = todo.pop()
        out.update({(cls, k): v for k, v in vars(cls).items()})
        todo.extend(cls.__subclasses__())
    out.update({(saved_tensors_hooks, k): v for k, v in vars(saved_tensors_hooks).items()})
    out[("HookMixin", "_register_hook")] = vars(torch.autograd.function._HookMixin)["_register_hook"]
    out[("SavedTensor", "unpack_hook")] = vars(torch._C._autograd.SavedTensor).get("unpack_hook")  # from 2.10
    out[("dist", "_register_comm_hook")] = getattr(dist, "_register_comm_hook", None)
    return out


def pytorch_step_code() -> Any:
    return torch.optim.Optimizer.profile_hook_step(lambda *a, **k: None).__code__


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def add_hook_to_module(module: nn.Module, log: list[str]) -> nn.Module:
    """accelerate's `add_hook_to_module`, reconstructed in plain torch."""
    old_forward = module.forward
    module._old_forward = old_forward

    def new_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        log.append(f"wrapper:{type(module).__name__}")
        return module._old_forward(*args, **kwargs)

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), old_forward)
    return module


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Only reference counting frees objects inside: a cycle through hooktrace would keep them alive."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
