"""Hooks in torch.profiler traces: a traced hook call inside a `record_function` range.

The shim (shims.py) reads `torch.autograd.profiler._is_profiler_enabled` once per call and calls
the hook through `ranged` only while a profiler records, so TensorBoard and Perfetto show each hook
as `hook <kind> <name>` around the operators it ran; with no profiler, nothing here runs.

The module-call wrapper opens `module <path> (<Class>)` the same way: PyTorch's profiler names
module calls (`nn.Module: ...`, with_stack) by the code of `nn.Module.__call__` it read at its first
such profile, and inside the block that attribute is hooktrace's wrapper.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..kinds import ROOT
from .sites import hook_name

__all__ = ["module_range", "ranged"]


def ranged(fn: Any, kind: str) -> Callable[..., Any]:
    """`fn` inside a `record_function` range `hook <kind> <name>` (the name the trace gives it)."""
    label = f"hook {kind} {hook_name(fn)}"

    def hook_in_range(*args: Any, **kwargs: Any) -> Any:
        with torch.autograd.profiler.record_function(label):
            return fn(*args, **kwargs)

    return hook_in_range


def module_range(module: Any, path: Optional[str]) -> Any:
    """The `record_function` range of one module call: `module <path> (<Class>)`."""
    cls = type(module).__name__
    where = path if path else (ROOT if path == "" else "?")
    return torch.autograd.profiler.record_function(f"module {where} ({cls})")
