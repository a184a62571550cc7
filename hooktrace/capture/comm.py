"""DDP communication hooks: traced through their code, so the reducer only ever holds the user's hook.

The C++ reducer keeps the comm hook it is given for good (no Python API reads, replaces or removes
it), so a shim handed to it at registration would stay after the block. Instead the reducer gets the
user's own hook, and for the block the code object of the Python function that runs when it is
called (the function itself, a method's function, a partial's `func`, a callable object's class
`__call__`) is swapped for a trampoline with the same number of free variables. The trampoline
calls `dispatch`, which records the call through a shim around a copy of the original function
(same code, globals, defaults and closure), and the original code goes back when the block ends:
after it, the reducer calls the user's hook and nothing of hooktrace runs.

Hooks registered before the block are found in `DistributedDataParallel._comm_hooks` (where
`register_comm_hook` keeps them) and traced the same way. A built-in (C++) comm hook
(`_register_builtin_comm_hook`) runs inside the reducer: it cannot be traced, and `builtin_hook`
tells its name (from DDP's logging data) so the trace can say so.
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
from collections.abc import Iterable
from typing import Any, Callable, Optional

from . import sites
from .dynamo import skip_frame_calling_user_code
from .ledger import Ledger

_PLACEHOLDER = 918_273_645_546_372_819  # the constant the trampoline's code holds the copy in
_lock = threading.RLock()  # defined_at reads the swaps while trace_hook makes a shim


class _Entry:
    """One comm hook of one DDP module being traced: which calls are its, and its shim."""

    __slots__ = ("bound_self", "shim")

    def __init__(self, bound_self: Any, shim: Callable[..., Any]) -> None:
        self.bound_self = bound_self  # a method's or callable object's self: its calls come with it first
        self.shim = shim


class _Swap:
    """A function whose code is the trampoline for the block."""

    __slots__ = ("function", "code", "copy", "entries")

    def __init__(self, function: types.FunctionType, copy: types.FunctionType) -> None:
        self.function = function
        self.code = function.__code__
        self.copy = copy
        self.entries: list[_Entry] = []


_swaps: dict[int, _Swap] = {}  # id(copy) -> swap, while the block is open


def _target(hook: Any) -> tuple[Optional[types.FunctionType], Any]:
    """(the Python function whose code runs when `hook` is called, the self it gets first or None)."""
    for _ in range(8):
        if isinstance(hook, functools.partial):
            hook = hook.func
        else:
            break
    if isinstance(hook, types.FunctionType):
        return hook, None
    if isinstance(hook, types.MethodType) and isinstance(hook.__func__, types.FunctionType):
        return hook.__func__, hook.__self__
    call = inspect.getattr_static(type(hook), "__call__", None)
    if isinstance(call, types.FunctionType) and not isinstance(hook, type):
        return call, hook
    return None, None


def _trampoline(function: types.FunctionType, copy: types.FunctionType) -> types.CodeType:
    """Code that calls `dispatch(copy, args, kwargs)`, with as many free variables as `function`."""
    n = len(function.__code__.co_freevars)
    names = [f"_hooktrace_cell{i}" for i in range(n)]
    lines = ["def _outer():"]
    lines += [f"    {name} = None" for name in names]
    lines.append("    def hooktrace_comm_hook(*args, **kwargs):")
    if names:  # read only when never: makes them free variables, as many as the closure has cells
        lines.append(f"        _ = ({', '.join(names)},) if args is None else None")
    lines.append("        from hooktrace.capture.comm import dispatch")
    lines.append(f"        return dispatch({_PLACEHOLDER}, args, kwargs)")
    lines.append("    return hooktrace_comm_hook")
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(lines) + "\n", "<hooktrace-comm>", "exec"), namespace)  # noqa: S102
    code = namespace["_outer"]().__code__
    consts = tuple(copy if c == _PLACEHOLDER and type(c) is int else c for c in code.co_consts)
    code = code.replace(co_consts=consts, co_name=function.__code__.co_name)
    skip_frame_calling_user_code(code)
    return code


def dispatch(copy: types.FunctionType, args: tuple, kwargs: dict) -> Any:
    """What a swapped comm hook runs: the shim of the matching registration, else the original."""
    swap = _swaps.get(id(copy))
    if swap is not None and not kwargs:
        for entry in swap.entries:
            if entry.bound_self is None or (args and args[0] is entry.bound_self):
                return entry.shim(*args)
    return copy(*args, **kwargs)


def trace_hook(
    hook: Any, make_shim: Callable[[Callable[..., Any]], Callable[..., Any]], ledger: Ledger
) -> bool:
    """Trace `hook`'s calls until `ledger` is restored: `make_shim(original)` gives the recording shim.

    False when it cannot be traced (a builtin, a coroutine or generator function).
    """
    function, bound_self = _target(hook)
    if function is None or function.__code__.co_flags & (inspect.CO_COROUTINE | inspect.CO_GENERATOR):
        return False
    with _lock:
        swap = next((s for s in _swaps.values() if s.function is function), None)
        if swap is None:
            copy = types.FunctionType(
                function.__code__,
                function.__globals__,
                function.__name__,
                function.__defaults__,
                function.__closure__,
            )
            copy.__kwdefaults__ = function.__kwdefaults__
            copy.__qualname__ = function.__qualname__
            swap = _Swap(function, copy)
            key = id(copy)
            ledger.on_restore(lambda: _forget(key))  # after the function has its own code back
            ledger.swap_code(function, _trampoline(function, copy))
            _swaps[key] = swap
        # the shim calls the original code with the arguments the function got (a method's self and a
        # partial's arguments included)
        swap.entries.append(_Entry(bound_self, make_shim(swap.copy)))
    return True


def defined_at(hook: Any) -> Optional[str]:
    """`file:line` of `hook` as `sites.defined_at` tells it, its function's own code read even while
    the trampoline stands in for it (a hook registered before or inside the block is swapped first)."""
    where = sites.defined_at(hook)
    function, _ = _target(hook)
    if function is None or where is None or not where.startswith("<hooktrace-comm>"):
        return where
    with _lock:
        swap = next((s for s in _swaps.values() if s.function is function), None)
    return sites.code_defined_at(swap.code) if swap is not None else where


def _forget(key: int) -> None:
    with _lock:
        _swaps.pop(key, None)


def ddp_modules_in(modules: Iterable[Any]) -> list[Any]:
    """The DistributedDataParallel modules among `modules`."""
    ddp_class = _ddp_class()
    return [] if ddp_class is None else [m for m in modules if isinstance(m, ddp_class)]


def _ddp_class() -> Any:
    import sys

    parallel = sys.modules.get("torch.nn.parallel.distributed")
    return getattr(parallel, "DistributedDataParallel", None) if parallel is not None else None


def builtin_hook(ddp: Any) -> Optional[str]:
    """The name of a built-in (C++) comm hook on `ddp`, when DDP's logging data has one and no Python
    hook was registered; else None."""
    if getattr(ddp, "_comm_hooks", None):
        return None
    try:
        name = ddp._get_ddp_logging_data().get("comm_hook")
    except Exception:  # noqa: BLE001 - logging data is optional; no name then
        return None
    return name if isinstance(name, str) and name and name != "N/A" else None
