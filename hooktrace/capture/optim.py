"""Optimizer hooks, traced through views like module hooks (capture/views.py).

PyTorch calls step hooks from the `wrapper` that `Optimizer.profile_hook_step` makes around each
optimizer class's `step` (`_patch_step_function`: `cls.step = profile_hook_step(cls.step)`), and
state-dict hooks from `Optimizer.state_dict` / `load_state_dict`. That wrapper is also held outside
the class: an LR scheduler replaces `opt.step` on the instance by its own wrapper around it
(lr_scheduler.py, `patch_track_step_called`), and libraries keep `opt.step` bound methods. So the
step wrapper is traced in place: for the block, every existing wrapper function (and the `wrapper`
that `profile_hook_step` makes, for classes first patched inside the block) runs the code of a copy
made from PyTorch's source whose hook-dict reads go through `hooktrace_view` — same function object,
same closure, same globals (the global hook dicts are read live). After the block every such
function has PyTorch's own code again; nothing else held the copy. The copied code reaches hooktrace
through `__import__` (the functions' globals are PyTorch's). `state_dict` / `load_state_dict` are
copies set on `Optimizer` for the block. No optimizer's hook dict or attribute is modified.

The copied wrapper also marks its thread as inside `optimizer.step()` (shims.STEPPING) for the
step's duration, so module calls made there get the phase `optimizer`.
"""

from __future__ import annotations

import re
import threading
from types import CodeType
from typing import Any, Optional

import torch
import torch.optim.optimizer as optim_module

from . import dicts, shims, views
from .ledger import CURRENT, Ledger

ATTRS = tuple(attr for attr, _ in dicts.OPTIMIZER_DICTS)
_READ = views.reads("self", ATTRS, r"_global_optimizer_(?:pre|post)_hooks")
_MENTION = views.mentions("self", ATTRS, r"_global_optimizer_(?:pre|post)_hooks")
# The step wrapper's copied code runs with PyTorch's globals (see the module docstring): it reaches
# hooktrace by `__import__`, never while Dynamo compiles (it cannot trace `__import__`; a dict is
# read as it is then, as `hooktrace_view` would).
_IMPORT = '__import__("hooktrace.capture.{0}", None, None, ("_",)).{1}'
_COMPILING = "torch.compiler.is_compiling()"


def _substitute(match: re.Match) -> str:
    owner, attr, glob, method = match.group("owner", "attr", "glob", "method")
    d, owner, attr = (glob, "None", glob) if glob is not None else (f"{owner}.{attr}", owner, attr)
    view = _IMPORT.format("views", "hooktrace_view")
    return f'({d} if not {d} or {_COMPILING} else {view}({d}, {owner}, "{attr}")).{method}()'


# `with torch.autograd.profiler.record_function(profile_name):` in the step wrapper also marks the step
_STEP_MARK = (
    re.compile(r"\b(torch\.autograd\.profiler\.record_function\(profile_name\))"),
    rf"(\1 if {_COMPILING} else {_IMPORT.format('optim', 'step_scope')}(profile_name))",
)
# `out = func(*args, **kwargs)`: a closure given to the step (Lightning, LBFGS) runs forward and
# backward; while it runs, module calls are not in the optimizer phase (`step_call`).
_STEP_CALL = (
    re.compile(r"\bout = func\(\*args, \*\*kwargs\)"),
    f"out = (func(*args, **kwargs) if {_COMPILING} else {_IMPORT.format('optim', 'step_call')}(func, args, kwargs))",
)
_record_function: Any = torch.autograd.profiler.record_function


class _StepScope(_record_function):
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
        result = super().__exit__(*exc)
        watch = CURRENT.on_step_end  # an outermost `optimizer.step()` returned (capture/steps.py)
        if depth <= 0 and exc[0] is None and watch is not None:
            watch()  # may end the window, or stop the script (hooktrace exec)
        return result


def _outside_step(closure: Any) -> Any:
    def hooktrace_closure(*args: Any, **kwargs: Any) -> Any:
        tid = threading.get_ident()
        depth = shims.STEPPING.pop(tid, None)
        try:
            return closure(*args, **kwargs)
        finally:
            if depth is not None:
                shims.STEPPING[tid] = depth

    hooktrace_closure.__wrapped__ = closure  # type: ignore[attr-defined]
    return hooktrace_closure


def step_call(func: Any, args: Any, kwargs: Any) -> Any:
    """The step's own `func(*args, **kwargs)`; while a capture is open, a closure it was given runs
    outside the optimizer phase (its forward and backward are the step's model work, not the update)."""
    if CURRENT.viewer is not None and not views._is_compiling():
        if callable(kwargs.get("closure")):
            kwargs = {**kwargs, "closure": _outside_step(kwargs["closure"])}
        elif len(args) == 2 and callable(args[1]) and not kwargs:
            args = (args[0], _outside_step(args[1]))
    return func(*args, **kwargs)


def step_scope(name: str) -> Any:
    if (CURRENT.viewer is None and CURRENT.on_step_end is None) or views._is_compiling():
        return _record_function(name)
    return _StepScope(name)


_made: Optional[views._Copies] = None


def copies() -> views._Copies:
    global _made
    if _made is None:
        made = views._Copies(
            torch.optim.Optimizer,
            optim_module,
            _READ,
            (_STEP_MARK, _STEP_CALL),
            substitute=_substitute,
            required=frozenset({"profile_hook_step", "state_dict", "load_state_dict"}),  # not a kind: methods
            reads=frozenset(ATTRS + tuple(attr for attr, _ in dicts.GLOBAL_OPTIMIZER_DICTS)),
            mention=_MENTION,
        )
        copied = _wrapper_code(made.copies["profile_hook_step"])
        if copied is None:
            raise views.unsupported("Optimizer.profile_hook_step does not make one step wrapper")
        own = _wrapper_code(vars(torch.optim.Optimizer)["profile_hook_step"])
        # a wrapper's __code__ is swapped for the copy's: both must read the same free names
        if own is None or own.co_freevars != copied.co_freevars:
            raise views.unsupported(
                "the copied step wrapper of Optimizer.profile_hook_step reads other names"
            )
        _made = made
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


def _wrapper_code(profile_hook_step: Any) -> Optional[CodeType]:
    """The code of the `wrapper` functions that `profile_hook_step` makes."""
    fn = views._plain(profile_hook_step)
    codes = [c for c in fn.__code__.co_consts if isinstance(c, CodeType)] if fn is not None else []
    return codes[0] if len(codes) == 1 else None


def install(ledger: Ledger) -> None:
    """The optimizer copies for one capture, recorded in `ledger`: `state_dict` / `load_state_dict`
    on `Optimizer`, and the copy's code in every step wrapper (see the module docstring)."""
    made = copies()
    own = vars(torch.optim.Optimizer).get("profile_hook_step")
    copy = made.copies.get("profile_hook_step")
    own_step, copy_step = _wrapper_code(own), _wrapper_code(copy)
    start = ledger.mark()
    try:
        if own_step is not None and copy_step is not None:
            # undone last: wrappers made inside the block (classes first patched there) get PyTorch's code too
            ledger.on_restore(lambda: _own_code_back(own_step, copy_step))
        for name, value in made.copies.items():
            if name != "profile_hook_step":
                ledger.set(torch.optim.Optimizer, name, value)
        if own_step is not None and copy_step is not None:
            ledger.swap_code(views._plain(own), views._plain(copy).__code__)
            for cls in _classes():
                step = vars(cls).get("step")
                if getattr(step, "__code__", None) is own_step:
                    ledger.swap_code(step, copy_step)
    except BaseException:
        ledger.restore(to=start)
        raise


def _own_code_back(own_step: CodeType, copy_step: CodeType) -> None:
    for cls in _classes():
        step = vars(cls).get("step")
        if step is not None and getattr(step, "__code__", None) is copy_step:
            step.__code__ = own_step
