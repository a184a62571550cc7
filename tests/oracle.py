"""Hooks that record themselves, so tests compare hooktrace's order with PyTorch's, not with ours."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Optional

import torch
import torch.nn.modules.module as nn_module

MODULE_DICT_ATTRS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
GLOBAL_DICT_ATTRS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
    "_global_buffer_registration_hooks",
)


class Zoo:
    """Registers hooks that log their own label; maps handle ids to labels and expected flags."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.labels: dict[int, str] = {}
        self.expected: dict[int, dict[str, Any]] = {}
        self.in_backward = False  # set by the test right before it calls backward()

    def fn(
        self, label: str, returns: Callable[..., Any] | None = None, raises: Optional[BaseException] = None
    ):
        def hook(*args: Any, **kwargs: Any) -> Any:
            self.log.append(label)
            if raises is not None:
                raise raises
            return returns(*args) if returns is not None else None

        hook.__qualname__ = f"hook_{label}"
        return hook

    def _keep(self, handle: Any, label: str, **expected: Any) -> Any:
        self.labels[handle.id] = label
        self.expected[handle.id] = expected
        return handle

    def module(self, m: torch.nn.Module, kind: str, label: str, **flags: Any) -> Any:
        method = {
            "forward_pre": m.register_forward_pre_hook,
            "forward": m.register_forward_hook,
            "backward_pre": m.register_full_backward_pre_hook,
            "backward": m.register_full_backward_hook,
            "backward_legacy": m.register_backward_hook,
        }[kind]
        returns = flags.pop("returns", None)
        raises = flags.pop("raises", None)
        handle = method(self.fn(label, returns, raises), **flags)
        return self._keep(handle, label, kind=kind, scope="module", **flags)

    def glob(self, kind: str, label: str, **flags: Any) -> Any:
        function = {
            "forward_pre": nn_module.register_module_forward_pre_hook,
            "forward": nn_module.register_module_forward_hook,
            "backward_pre": nn_module.register_module_full_backward_pre_hook,
            "backward": nn_module.register_module_full_backward_hook,
            "backward_legacy": nn_module.register_module_backward_hook,
        }[kind]
        handle = function(self.fn(label), **flags)
        return self._keep(handle, label, kind=kind, scope="global", **flags)

    def tensor(
        self, t: torch.Tensor, kind: str, label: str, returns: Callable[..., Any] | None = None
    ) -> Any:
        method = t.register_hook if kind == "grad" else t.register_post_accumulate_grad_hook
        return self._keep(method(self.fn(label, returns)), label, kind=kind, scope="tensor")

    def traced(self, trace: Any) -> list[str]:
        """Labels of this zoo's hooks in the order hooktrace recorded them firing."""
        return [self.labels[e.hook] for e in trace.events if e.type == "hook" and e.hook in self.labels]


def _unshim(value: Any) -> Any:
    return value.__wrapped__ if getattr(value, "__name__", "") == "hooktrace_shim" else value


def snapshot_dicts(
    model: Optional[torch.nn.Module] = None, tensors: tuple = (), see_through: bool = False
) -> dict[str, list]:
    """Every hook dict as (id, object) pairs, in order: equal snapshots mean same ids, order and objects.

    see_through: inside a trace, record what a shim stands for (what the dict will hold afterwards).
    """
    snap = _snapshot(model, tensors)
    if see_through:
        snap = {
            name: [(k, id(_unshim(v)), _unshim(v)) for k, _, v in entries] for name, entries in snap.items()
        }
    return snap


def _snapshot(model: Optional[torch.nn.Module], tensors: tuple) -> dict[str, list]:
    snap: dict[str, list] = {}
    for attr in GLOBAL_DICT_ATTRS:
        d = getattr(nn_module, attr, None)
        if d is not None:
            snap[attr] = [(k, id(v), v) for k, v in d.items()]
    if model is not None:
        for path, module in model.named_modules():
            for attr in MODULE_DICT_ATTRS:
                d = module.__dict__.get(attr)
                if d is not None:
                    snap[f"{path}:{attr}"] = [(k, id(v), v) for k, v in d.items()]
        tensors = tuple(tensors) + tuple(model.parameters())
    for i, t in enumerate(tensors):
        for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            d = getattr(t, attr, None)
            snap[f"tensor{i}:{attr}"] = [(k, id(v), v) for k, v in (d or OrderedDict()).items()]
    return snap


def assert_no_shims(snap: dict[str, list]) -> None:
    for name, entries in snap.items():
        for _k, _i, value in entries:
            assert getattr(value, "__name__", "") != "hooktrace_shim", f"a tracing shim was left in {name}"
