"""Naming tensor hooks: "<module>.<param>", "output of P", "input of P", "tensor in P" (docs/format.md)."""

from __future__ import annotations

import weakref
from types import FrameType
from typing import Any, Callable, Optional

import torch

from ..kinds import INPUT_OF, NODE, OUTPUT_OF, TENSOR, TENSOR_IN, K
from ..schema import ROOT
from . import shims

# ("output of" | "input of" | "tensor in", the module's Who: shims.Recorder.who) or None
Describe = Optional[tuple[str, Any]]


def weak(obj: Any) -> Any:
    """A weak reference, or None for objects that take none."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def dtype_and_device(tensor: Any) -> Optional[tuple[Any, Any]]:
    """(dtype, device) of a tensor, read without running user code (None for a tensor subclass with a
    `__torch_function__` of its own, whose getters would call it)."""
    if not isinstance(tensor, torch.Tensor) or torch.overrides.has_torch_function((tensor,)):
        return None
    return tensor.dtype, tensor.device


class TensorNamer:
    """Which module a tensor hook belongs to, decided while the objects are alive."""

    def __init__(
        self,
        run_codes: set,
        kind_of_hook: Callable[[int], tuple[Optional[str], Any]],
        who: Callable[[Any], Any],
    ) -> None:
        self._run_codes = run_codes  # code objects of the module-call wrapper: a frame inside a call
        self._kind_of_hook = kind_of_hook  # trace hook id -> (kind, owner's Who) of a hook we know
        self._who = who  # module -> what names it without keeping it alive (shims.Recorder.who)
        self._outputs: dict[int, tuple[Any, Any]] = {}  # id(tensor) -> (weakref, module's Who)

    def on_output(self, module: Any, result: Any) -> None:
        """Remember the outputs of a module with full backward hooks (their hooks race its pre-hooks)."""
        if len(self._outputs) > 4096:
            self._outputs.clear()
        for tensor in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(tensor, torch.Tensor):
                ref = weak(tensor)
                if ref is not None:
                    self._outputs[id(tensor)] = (ref, self._who(module))

    def describe(self, tensor: Any, frame: Optional[FrameType]) -> Describe:
        """Which module's output/input a tensor hook went on.

        The output of a module with full backward hooks is known exactly; otherwise the innermost
        traced frame tells (a hook's shim frame, or a module call).
        """
        known = self._outputs.get(id(tensor))
        if known is not None and known[0]() is tensor:
            return (OUTPUT_OF, known[1])
        while frame is not None:
            call = shims.shim_call(frame)
            if call is not None:
                hook_id, args, mod = call
                kind, owner = self._kind_of_hook(hook_id)
                mod = self._who(mod) if mod is not None else owner if owner is not None else self._who(None)
                if kind == K.forward and args and _contains(args[-1], tensor):
                    return (OUTPUT_OF, mod)
                if kind in (K.forward, K.forward_pre) and len(args) > 1 and _contains(args[1], tensor):
                    return (INPUT_OF, mod)
                return (TENSOR_IN, mod)
            if frame.f_code in self._run_codes:
                return (TENSOR_IN, self._who(frame.f_locals.get("self")))
            frame = frame.f_back
        return None

    def clear(self) -> None:
        self._outputs.clear()


def hook_place(
    scope: str,
    owner: Any,
    tensor: Any,
    desc: Describe,
    paths: dict[int, str],
    params: dict[int, tuple[str, str]],
) -> tuple[Optional[str], Optional[str]]:
    """The hook's `module` and `tensor` fields (docs/format.md)."""
    module = paths.get(owner[0]) if owner is not None else None
    if scope not in (TENSOR, NODE):
        return module, None
    if tensor is not None and id(tensor) in params:
        module, pname = params[id(tensor)]
        return module, (f"{module}.{pname}" if module else pname)
    if scope == NODE:  # named only when the node accumulates a parameter of the model
        return None, None
    if desc is not None:
        how, (key, type_name) = desc
        owner_path = paths.get(key) if key is not None else None
        if owner_path is None:
            owner_path = type_name
        return module, f"{how} {owner_path or ROOT}"
    return module, TENSOR


def _contains(container: Any, tensor: Any) -> bool:
    if container is tensor:
        return True
    if isinstance(container, (tuple, list)):
        return any(item is tensor for item in container)
    if isinstance(container, dict):
        return any(item is tensor for item in container.values())
    return False
