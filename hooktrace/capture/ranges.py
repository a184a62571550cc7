"""Hooks in torch.profiler traces: a traced hook call inside a `record_function` range.

The shim (shims.py) reads `torch.autograd.profiler._is_profiler_enabled` once per call and calls
the hook through `ranged` only while a profiler records, so TensorBoard and Perfetto show each hook
as `hook <kind> <name>` around the operators it ran; with no profiler, nothing here runs.

The module-call wrapper opens `module <path> (<Class>)` the same way: PyTorch's profiler names
module calls (`nn.Module: ...`, with_stack) by the code of `nn.Module.__call__` it read at its first
such profile, and inside the block that code is hooktrace's wrapper (capture/modulecall.py). PyTorch
reads that code once per process, when the first `with_stack` profile starts: one that starts inside the block would
keep the wrapper's code for good (no `nn.Module:` range after the block, two ranges per call in a
later block), so while the block is open the profiler starts with PyTorch's own `__call__` in place
(`guard_module_code`) until a `with_stack` profile has started.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import torch

from ..kinds import ROOT
from .sites import hook_name

__all__ = ["graph_label", "guard_module_code", "module_range", "ranged"]


def ranged(fn: Any, kind: str) -> Callable[..., Any]:
    """`fn` inside a `record_function` range `hook <kind> <name>` (the name the trace gives it)."""
    label = f"hook {kind} {hook_name(fn)}"

    def hook_in_range(*args: Any, **kwargs: Any) -> Any:
        with torch.autograd.profiler.record_function(label):
            return fn(*args, **kwargs)

    return hook_in_range


def module_range(module: Any, path: Optional[str]) -> Any:
    """The `record_function` range of one module call: `module <path> (<Class>)`."""
    children = vars(module).get("_modules")
    inner = children.get("_orig_mod") if children else None  # torch.compile(m)'s wrapper: named as m
    cls = type(module if inner is None else inner).__name__
    where = path if path else (ROOT if path == "" else "?")
    return torch.autograd.profiler.record_function(f"module {where} ({cls})")


def graph_label(number: int, backward: bool, names: list[str]) -> str:
    """The range of one run of a compiled graph holding hooks (capture/compiled.py), naming them."""
    what = "compiled autograd graph" if backward else "torch.compile graph"
    return f"{what} {number} (hooks in program order): {', '.join(names)}"


_CODE_READ = [False]  # a with_stack profile started in this process while a block was open


def guard_module_code(ledger: Any, original_call: Any) -> None:
    """While the block is open, torch.autograd.profiler's `_enable_profiler` (where a `with_stack`
    profile makes PyTorch read `nn.Module.__call__`'s code, once per process) runs with PyTorch's
    own `__call__` and its own code in place, until a `with_stack` profile has started. Made before
    the wrapper is put in place (`original_call` and its code are PyTorch's); recorded in `ledger`."""
    profiler = torch.autograd.profiler
    enable = vars(profiler).get("_enable_profiler")
    if _CODE_READ[0] or enable is None:
        return
    module_class: Any = torch.nn.Module
    original_code = getattr(original_call, "__code__", None)

    def hooktrace_enable_profiler(*args: Any, **kwargs: Any) -> Any:
        if _CODE_READ[0]:
            return enable(*args, **kwargs)
        owner = sys._getframe(1).f_locals.get("self")  # torch.autograd.profiler.profile
        if getattr(owner, "with_stack", False):
            _CODE_READ[0] = True
        current, code = vars(module_class)["__call__"], getattr(original_call, "__code__", None)
        if current is not original_call:  # the wrapper stands there (modulecall.install)
            module_class.__call__ = original_call
        if code is not original_code:  # the wrapper's code is in it (modulecall.install)
            original_call.__code__ = original_code
        try:
            return enable(*args, **kwargs)
        finally:
            if code is not original_code:
                original_call.__code__ = code
            if current is not original_call:
                module_class.__call__ = current

    ledger.set(profiler, "_enable_profiler", hooktrace_enable_profiler)
