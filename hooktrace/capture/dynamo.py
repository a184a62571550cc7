"""Dynamo never compiles hooktrace's own frames: it sees what it would see untraced.

Under `torch.compile`, Dynamo's frame callback stays set while a compiled function runs: after a
graph break, the Python code that runs eagerly (the module call that broke the graph, the hooks it
calls) has each of its frames offered to Dynamo, which compiles user code and skips PyTorch's own
files (`torch/nn/modules/module.py`, and the copies made from it under the same name). hooktrace's
frames — the module-call wrapper, the shims, the views — are neither, so Dynamo compiled them as
frames of their own: graphs and frames that an untraced run does not have (3 graphs for 2, 21
frames for 2), and compiled code in which `torch.compiler.is_compiling()` was folded to True, so
that the views handed PyTorch the hook dicts themselves and hooks that ran as Python (full backward
hooks, after the break) were not traced.

Each code object of hooktrace is marked as Dynamo marks its own helpers (`skip_code`): the frame
runs as plain Python. The frames that call user code (the shims call the hook, the module-call
wrapper calls `forward` and the hooks, comm.dispatch calls the user's comm hook) let Dynamo
see the frames they call, as the untraced code would; the others (views, records, call sites) hide
theirs too (`os.path`, `inspect`), which an untraced run never runs. Inlining is not affected: while
Dynamo traces a compiled frame it still inlines the wrapper, which hands it PyTorch's own
`_wrapped_call_impl`. This uses PyTorch's C extension directly, so a capture does not import
`torch._dynamo` (seconds) for a model that is never compiled.

Two more things Dynamo reads are kept as untraced: `same_short_cut` names the call wrapper as
Dynamo's `unpatched_nn_module_call` (its test for a module it may call without inlining
`_call_impl`), and `signature_is` reads the parameters of the Dynamo functions capture/compiled.py
patches, once per process. `footprint` and `module_of` read what an inlined hook added to a graph
and which module a Dynamo variable stands for (capture/compiled.py `Forward`), never failing a compile.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Optional

import torch

try:
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
except ImportError:  # a torch without Dynamo, or one without frame strategies
    set_code_exec_strategy = None  # type: ignore[assignment]

# the frames of hooktrace that call user code (hooks, forward): Dynamo sees what they call
CALLS_USER_CODE = frozenset(
    {
        "hooktrace_shim",
        "hooktrace_module_call",
        "dispatch",
        "run_compiled",
        "hooktrace_compiled_forward",
        "hooktrace_compiled_backward",
        "hooktrace_graph_run",
        "record_run",
    }
)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the hooktrace package folder
_done: set[types.CodeType] = set()
_scanned: dict[str, Any] = {}  # module name -> the module object walked (a reload is walked again)
_scanned_at = [-1]  # len(sys.modules) when they were last looked at


def _ours(code: types.CodeType) -> bool:
    return code.co_filename.startswith((_HERE, "<hooktrace"))


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    """`code` and every code object nested in it (inner functions, comprehensions, lambdas)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)


def _codes_of(value: Any, in_our_class: bool = False) -> Iterator[types.CodeType]:
    """Code objects of `value` that are hooktrace's: its own file, or generated for one of its classes."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        for accessor in (value.fget, value.fset, value.fdel):
            if accessor is not None:
                yield from _codes_of(accessor, in_our_class)
        return
    code = value if isinstance(value, types.CodeType) else getattr(value, "__code__", None)
    if isinstance(code, types.CodeType):
        # dataclass methods are generated (`<string>`) for our classes; a decorator's code that only
        # carries our function's name (contextlib's `helper`) is not ours
        if _ours(code) or (in_our_class and code.co_filename == "<string>"):
            yield from _nested(code)
    wrapped = getattr(value, "__wrapped__", None)  # functools.cache, functools.wraps
    if wrapped is not None and wrapped is not value:
        yield from _codes_of(wrapped)


def _module_codes(name: str, module: Any) -> Iterator[types.CodeType]:
    """The code objects one of hooktrace's modules defines (functions, methods, nested code)."""
    for value in list(vars(module).values()):
        if isinstance(value, type):
            if value.__module__ == name:
                for attr in list(vars(value).values()):
                    yield from _codes_of(attr, in_our_class=True)
        elif isinstance(value, dict):  # compiled templates kept by key (the shims')
            for item in list(value.values()):
                yield from _codes_of(item)
        else:
            yield from _codes_of(value)


def _our_modules() -> list[tuple[str, Any]]:
    return [
        (name, module)
        for name, module in list(sys.modules.items())
        if module is not None and (name == "hooktrace" or name.startswith("hooktrace."))
    ]


def own_codes(extra: Iterable[types.CodeType] = ()) -> set[types.CodeType]:
    """Every code object defined in hooktrace's loaded modules (functions, methods, nested code)."""
    found: set[types.CodeType] = set()
    for code in extra:
        found.update(_nested(code))
    for name, module in _our_modules():
        found.update(_module_codes(name, module))
    return found


def skip_frame_calling_user_code(code: types.CodeType) -> None:
    """Mark code made at run time (a comm hook's trampoline) as a frame Dynamo skips, its callees seen."""
    if set_code_exec_strategy is not None:
        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))


def skip_own_frames(extra: Iterable[types.CodeType] = ()) -> int:
    """Mark hooktrace's code objects (and `extra`) as frames Dynamo skips; returns how many were new.

    Per process, not per capture: each of hooktrace's modules is walked once (again only if it was
    reloaded), and a later capture walks only the modules imported since, looking only when
    `sys.modules` changed size (walking every module took about 5 ms at every `trace()`, reading
    `sys.modules` 0.2 ms); `extra` code already marked is not walked again.
    """
    if set_code_exec_strategy is None:
        return 0
    new: set[types.CodeType] = set()
    for code in extra:
        if code not in _done:
            new.update(_nested(code))
    if len(sys.modules) != _scanned_at[0]:  # something was imported (or removed) since the last walk
        _scanned_at[0] = len(sys.modules)
        for name, module in _our_modules():
            if _scanned.get(name) is not module:
                new.update(_module_codes(name, module))
                _scanned[name] = module
    new -= _done
    calls_user = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
    own_only = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for code in new:
        set_code_exec_strategy(code, calls_user if code.co_name in CALLS_USER_CODE else own_only)
    _done.update(new)
    return len(new)


def same_short_cut(ledger: Any) -> None:
    """Dynamo calls a hookless module's `forward` only if `__call__` is `unpatched_nn_module_call`,
    else inlines `_call_impl`, whose empty hook dicts become guards (2.14): a hook added later then
    recompiled the graph, where untraced it never runs (#117758). The call wrapper is that name
    while the capture is open (in its `ledger`)."""
    from torch._dynamo.variables import nn_module as variables

    wrapper = vars(torch.nn.Module)["__call__"]
    if getattr(variables, "unpatched_nn_module_call", wrapper) is not wrapper:
        ledger.set(variables, "unpatched_nn_module_call", wrapper)


def signature_is(fn: Any, names: list[str]) -> bool:
    """`fn` (a function of Dynamo's that capture/compiled.py patches or calls) has these parameters."""
    return _parameters(fn) == names


# id(function) -> (weak reference, its parameters' names): Dynamo's functions are read once per process,
# not at every session (inspect.signature: about 50 µs each)
_PARAMETERS: dict[int, tuple[Any, Optional[list[str]]]] = {}


def _parameters(fn: Any) -> Optional[list[str]]:
    # a bound method (a classmethod read from its class) is made anew at each read: known by its
    # function, whose signature less the first parameter is the bound method's
    held = fn.__func__ if inspect.ismethod(fn) else fn
    key = id(held) if held is fn else -id(held)
    known = _PARAMETERS.get(key)
    if known is not None and known[0]() is held:
        return known[1]
    try:
        names: Optional[list[str]] = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = None
    try:
        _PARAMETERS[key] = (weakref.ref(held, lambda _r: _PARAMETERS.pop(key, None)), names)
    except TypeError:  # no weak reference: read each time
        pass
    return names


def footprint(output: Any) -> Optional[tuple[int, tuple[tuple[int, int], ...], int]]:
    """What an OutputGraph holds that an inlined hook can add to: its FX nodes, the Python objects
    Dynamo will mutate after the graph runs (each with its length: a list appended to again), the
    attribute stores it will replay; None when this Dynamo keeps them otherwise."""
    try:
        effects = output.side_effects
        modified = tuple(
            (id(var), len(getattr(var, "items", ())))
            for var in list(effects.id_to_variable.values())
            if effects.is_modified(var)
        )
        stores = sum(len(d) for d in effects.store_attr_mutations.values())
        return len(output.graph.nodes), modified, stores + len(effects.tensor_hooks)
    except Exception:  # noqa: BLE001 - reading Dynamo's state must never fail its compile
        return None


MODULE_VARIABLES = frozenset(
    {
        "NNModuleVariable",
        "UnspecializedNNModuleVariable",
        "UnspecializedBuiltinNNModuleVariable",
        "FSDPManagedNNModuleVariable",
    }
)


def module_of(parent: Any, var: Any) -> Any:
    """The module a VariableTracker stands for (a specialized or unspecialized module), or None.
    Only module variables are read: other trackers' attributes may ask Dynamo for constants."""
    if type(var).__name__ not in MODULE_VARIABLES:
        return None
    value = vars(var).get("value")
    if isinstance(value, torch.nn.Module):
        return value
    key = getattr(var, "module_key", None)
    if isinstance(key, str):
        try:
            return parent.output.get_submodule(key)
        except (AttributeError, KeyError):
            return None
    return None
