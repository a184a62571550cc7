"""Optimizer hooks, traced through views like module hooks (capture/views.py).

PyTorch calls step hooks from `Optimizer.profile_hook_step`'s `wrapper`, which `_patch_step_function`
installs once per optimizer class (`cls.step = profile_hook_step(cls.step)`, `hooked = True`), and
state-dict hooks from `Optimizer.state_dict` / `load_state_dict`. While a capture is open those run
as copies made from PyTorch's source whose hook-dict reads go through `hooktrace_view`: every
already-patched class's `step` is the copied wrapper around the same inner `step`, and
`Optimizer.profile_hook_step` is the copy, so a class first patched inside the block gets it too.
After the block every class's `step` is PyTorch's own wrapper again (a new one, around the same
inner `step`, for classes first patched inside the block). No optimizer's hook dict is modified.

The copied wrapper also marks its thread as inside `optimizer.step()` (shims.STEPPING) for the
step's duration, so module calls made there get the phase `optimizer`.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Optional

import torch
import torch.optim.optimizer as optim_module

from . import dicts, shims, views

ATTRS = tuple(attr for attr, _ in dicts.OPTIMIZER_DICTS)
_READ = views.reads("self", ATTRS, r"_global_optimizer_(?:pre|post)_hooks")
# `with torch.autograd.profiler.record_function(profile_name):` in the step wrapper also marks the step
_STEP_MARK = (
    re.compile(r"\btorch\.autograd\.profiler\.record_function\(profile_name\)"),
    "_hooktrace_step_scope(profile_name)",
)
_record_function: Any = torch.autograd.profiler.record_function


class _StepScope(_record_function):  # type: ignore[misc, valid-type]
    """PyTorch's `record_function` that also marks this thread as inside `optimizer.step()`."""

    def __enter__(self) -> Any:
        result = super().__enter__()
        tid = threading.get_ident()
        shims.STEPPING[tid] = shims.STEPPING.get(tid, 0) + 1
        return result

    def __exit__(self, *exc: Any) -> Any:
        tid = threading.get_ident()
        depth = shims.STEPPING.get(tid, 0) - 1
        if depth > 0:
            shims.STEPPING[tid] = depth
        else:
            shims.STEPPING.pop(tid, None)
        return super().__exit__(*exc)


def step_scope(name: str) -> Any:
    if views._viewer is None or views._is_compiling():
        return _record_function(name)
    return _StepScope(name)


_made: Optional[views._Copies] = None


def copies() -> views._Copies:
    global _made
    if _made is None:
        _made = views._Copies(
            torch.optim.Optimizer,
            optim_module,
            _READ,
            (_STEP_MARK,),
            {"_hooktrace_step_scope": step_scope},
        )
    return _made


def _classes() -> list[type]:
    """`Optimizer` and every subclass defined so far."""
    out: list[type] = []
    todo = [torch.optim.Optimizer]
    while todo:
        cls = todo.pop()
        if cls not in out:
            out.append(cls)
            todo.extend(cls.__subclasses__())
    return out


def _step_code(profile_hook_step: Any) -> Any:
    wrapper = views._plain(profile_hook_step)(lambda *a, **k: None)
    return wrapper.__code__


class Installed:
    """The optimizer copies for one capture; `restore()` puts PyTorch's own back everywhere."""

    def __init__(self) -> None:
        made = copies()
        self._saved: list[tuple[type, str, Any]] = []
        self._copy_step = made.copies.get("profile_hook_step")
        try:
            for name, copy in made.copies.items():
                self._set(torch.optim.Optimizer, name, copy)
            if self._copy_step is not None:
                make = views._plain(self._copy_step)
                for cls in _classes():
                    step = vars(cls).get("step")
                    if step is not None and getattr(step, "hooked", None) and hasattr(step, "__wrapped__"):
                        viewed = make(step.__wrapped__)
                        viewed.hooked = True
                        self._set(cls, "step", viewed)
        except BaseException:
            self.restore()
            raise

    def _set(self, cls: type, name: str, value: Any) -> None:
        self._saved.append((cls, name, vars(cls)[name]))
        setattr(cls, name, value)

    def restore(self) -> None:
        while self._saved:
            cls, name, original = self._saved.pop()
            setattr(cls, name, original)
        if self._copy_step is None:
            return
        # classes first patched inside the block hold the copied wrapper: give them PyTorch's own
        copied = _step_code(self._copy_step)
        own = torch.optim.Optimizer.profile_hook_step
        for cls in _classes():
            step = vars(cls).get("step")
            if getattr(step, "__code__", None) is copied:
                fresh = own(step.__wrapped__)
                fresh.hooked = True
                cls.step = fresh
