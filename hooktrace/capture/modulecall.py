"""The module-call wrapper: what records a module call's `enter` and `exit` while a capture is open.

One body, compiled twice per process from one template:

- **In PyTorch's own function** (the usual case). While the block is open, PyTorch's
  `_wrapped_call_impl` (which is `nn.Module.__call__`) runs this code: `install` swaps the
  function's `__code__` and puts the session's state in PyTorch's module globals under one name,
  `_hooktrace_module_call`; the ledger puts both back. Setting `nn.Module.__call__` instead makes
  CPython update the `__call__` slot of every subclass of `nn.Module` (about 370 once Dynamo is
  imported), at the block's start and again at its end: 0.4 ms each after a training step (the
  types are cold in the CPU's caches then), the largest fixed cost of a session. A code swap costs
  what any attribute does, and `nn.Module.__call__` stays PyTorch's object, so Dynamo's own test
  for it (`unpatched_nn_module_call`) holds without a patch. The code has no closure (a function's
  `__code__` can only be swapped for code with as many free variables, none here): it reads the
  session's state from that one global, unpacked into locals as a call begins, so a call that
  began inside the block ends normally after it on another thread. While Dynamo compiles
  (`torch.compiler.is_compiling()`, folded to True), it is PyTorch's own body, read from
  PyTorch's globals only: nothing a guard could find gone after the block.
- **As a function of its own** (`make_module_call`), set as `nn.Module.__call__` when that is
  not PyTorch's `_wrapped_call_impl` as this process knows it (`exec --step-on forward` counts
  steps around it; another library's wrapper; a torch whose function differs): the same body over
  a closure, which reads PyTorch's `__call__` and `is_compiling` from a namespace kept per process
  (`_FOR_DYNAMO`), not its closure: Dynamo guards on what an inlined function reads, and a
  closure cell is reached through `nn.Module.__call__` itself, so a graph compiled inside the block
  failed its guard once the block put PyTorch's `__call__` back (docs/capture.md).

Either way the wrapper calls `call_impl` (the copy of `_call_impl` that reads hooks through views)
itself, as `_wrapped_call_impl` calls `_call_impl`, so tracing adds no Python frame per module
level; tracebacks show its lines (`<hooktrace-module-call>`, held by `linecache`).
"""

from __future__ import annotations

import linecache
import threading
import time
import types
from typing import Any, Callable, Optional

import torch
import torch.nn.modules.module as nn_module

from ..kinds import FORWARD, OPTIMIZER_PHASE, RECOMPUTE
from . import shims
from .ranges import guard_module_code, module_range
from .views import _is_compiling

STATE_NAME = "_hooktrace_module_call"  # the global of PyTorch's module the swapped code reads
_FILENAME = "<hooktrace-module-call>"

# the state a call reads: the names the template's body uses, in the order of the state tuple
_STATE = (
    "counter",
    "module_ids",
    "clock",
    "ident",
    "main",
    "append",
    "graph_task",
    "stepping",
    "profiler",
    "tensor_class",
    "call_impl",
    "original_call_impl",
    "rare",
)

# What PyTorch's `_wrapped_call_impl` does: the swapped code's body while Dynamo compiles, and where
# the block has just ended (`_READ_STATE`). `_is_pytorchs` checks that PyTorch's function is this.
_PYTORCH_BODY = """\
if self._compiled_call_impl is not None:
    return self._compiled_call_impl(*args, **kwargs)
else:
    return self._call_impl(*args, **kwargs)
"""

_BODY = f"""\
seq = next(counter)
key = module_ids.get(id(self))
if key is None:  # a module's first call, or a call of `torch.compile(m)`'s wrapper (named `m`)
    key = rare.rec.module_key(self)
    if id(self) not in module_ids:
        rare.compiled_calls.append(seq)
        rare.on_compiled()
    else:
        rare.on_new_module(self)
for arg in args:  # plain tensors whose own hook dicts we may not know yet (hooks need grad)
    if type(arg) is tensor_class and arg._backward_hooks:  # type(): `__class__` may be anything
        rare.on_input(self, arg)
phase = {FORWARD!r} if graph_task() == -1 else {RECOMPUTE!r}
if stepping and ident() in stepping:
    phase = {OPTIMIZER_PHASE!r}
compiled = self._compiled_call_impl
scope = rare.module_range(self, rare.paths.get(key)) if profiler._is_profiler_enabled else None
if scope is not None:
    scope.__enter__()
t0 = clock()
try:
    if compiled is not None:
        rare.compiled_calls.append(seq)
        rare.on_compiled()
        result = rare.run_compiled(self, compiled, args, kwargs)
    elif type(self)._call_impl is original_call_impl:
        result = call_impl(self, *args, **kwargs)
    else:
        result = self._call_impl(*args, **kwargs)
except BaseException as exc:
    t1 = clock()
    if scope is not None:
        scope.__exit__(None, None, None)
    tid = ident()
    if tid == main:
        tid = main
    append((seq, next(counter), phase, key, tid, t0, t1, rare.error_text(exc)))
    raise
t1 = clock()
if scope is not None:
    scope.__exit__(None, None, None)
tid = ident()
if tid == main:
    tid = main
append((seq, next(counter), phase, key, tid, t0, t1, None))
return result
"""


def _indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in text.splitlines())


# torch < 2.13: is_compiling() is True only inside Dynamo's traced frames, not all through a compile
_IN_COMPILE = (
    ""
    if _is_compiling is torch.compiler.is_compiling
    else "    if rare.in_compile():\n" + _indent(_PYTORCH_BODY, 8)
)


_SWAPPED = (
    "def hooktrace_module_call(self, *args, **kwargs):\n"
    "    if torch.compiler.is_compiling():  # Dynamo inlines this: PyTorch's own body\n"
    + _indent(_PYTORCH_BODY, 8)
    + "    try:\n"
    + f"        {', '.join(_STATE)} = {STATE_NAME}\n"
    + "    except NameError:  # the block ended as this call began (another thread)\n"
    + _indent(_PYTORCH_BODY, 8)
    + _IN_COMPILE
    + _indent(_BODY, 4)
)
_OWN = (
    f"def factory({', '.join(_STATE)}, live):\n"
    "    def hooktrace_module_call(self, *args, **kwargs):\n"
    "        if _is_compiling():  # globals: see _FOR_DYNAMO\n"
    '            return _FOR_DYNAMO["call"](self, *args, **kwargs)\n'
    "        if not live:  # kept past its capture (a class's own `__call__`): whatever nn.Module has now\n"
    "            return module_class.__call__(self, *args, **kwargs)\n"
    + _indent(_BODY, 8)
    + "    return hooktrace_module_call\n"
)
_SOURCE = _SWAPPED + "\n\n" + _OWN
linecache.cache[_FILENAME] = (len(_SOURCE), None, _SOURCE.splitlines(True), _FILENAME)

# `nn.Module.__call__` as the wrapper found it, handed to Dynamo from a global: a guard on a closure
# cell of the wrapper fails once the block ends, and the graph was compiled again (docs/capture.md)
_FOR_DYNAMO: dict[str, Callable[..., Any]] = {}
_namespace: dict[str, Any] = {
    "_is_compiling": _is_compiling,
    "_FOR_DYNAMO": _FOR_DYNAMO,
    "module_class": torch.nn.Module,
}
exec(compile(_SOURCE, _FILENAME, "exec", dont_inherit=True), _namespace)  # noqa: S102 - the two functions above, compiled once
SWAPPED_CODE: types.CodeType = _namespace.pop("hooktrace_module_call").__code__
_factory: Callable[..., Any] = _namespace.pop("factory")
CODES = frozenset({SWAPPED_CODE, _factory.__code__})  # and what they nest: Dynamo skips their frames


class Rare:
    """What a module call reads only on its first call, a compiled call, an error, a profile or a
    tensor input with hooks: one object, so that the state a call unpacks stays short."""

    __slots__ = (
        "rec",
        "compiled_calls",
        "on_compiled",
        "on_new_module",
        "on_input",
        "paths",
        "run_compiled",
        "error_text",
        "module_range",
        "in_compile",
    )

    def __init__(
        self,
        rec: shims.Recorder,
        on_compiled: Callable[[], None],
        on_new_module: Callable[[Any], None],
        on_input: Callable[[Any, Any], None],
        paths: dict[int, str],
    ) -> None:
        self.rec = rec
        self.compiled_calls = rec.compiled
        self.on_compiled = on_compiled
        self.on_new_module = on_new_module
        self.on_input = on_input
        self.paths = paths
        self.run_compiled: Callable[[Any, Any, tuple, dict], Any] = _run_plain  # the session's: below
        self.error_text = shims.error_text
        self.module_range = module_range
        self.in_compile = _is_compiling


def make_module_call(
    rec: shims.Recorder,
    original_call: Callable[..., Any],
    call_impl: Callable[..., Any],
    original_call_impl: Callable[..., Any],
    on_input: Callable[[Any, Any], None],
    on_new_module: Callable[[Any], None],
    paths: Optional[dict[int, str]] = None,
    on_compiled: Callable[[], None] = lambda: None,
) -> Callable[..., Any]:
    """The wrapper of one capture, as a function of its own; `install` puts it in place.

    A call that runs compiled (`torch.compile(m)`'s wrapper, named as `m`, or `m.compile()`) is one
    recorded call whose seq goes to `rec.compiled`: its hooks run inside the graph. Modules whose
    class overrides `_call_impl` get theirs. `on_input(module, tensor)` sees positional tensor
    inputs that carry hooks registered before the block (an input's own hooks fire in backward and
    are traced like any tensor hook); `on_new_module(module)` sees each module's first call (its
    parameters may hold hooks registered before the block). The output of modules with backward
    hooks is told to the capture by the `_call_impl` copy itself (views.hooktrace_output).
    While a profiler records, the call is a `record_function` range `module <path> (<Class>)`
    (`paths`: key -> path): PyTorch's own `nn.Module:` ranges know only its `__call__` (ranges.py).
    The state the swapped code reads is the function's `hooktrace_state`.
    """
    if _FOR_DYNAMO.get("call") is not original_call:  # PyTorch's, at every session but the first
        _FOR_DYNAMO["call"] = original_call
    rare = Rare(rec, on_compiled, on_new_module, on_input, paths if paths is not None else {})
    state = (
        rec.seq,
        rec.module_ids,
        time.perf_counter_ns,
        threading.get_ident,
        rec.main_thread,
        rec.calls.append,
        shims._graph_task_id,
        shims.STEPPING,
        torch.autograd.profiler,
        torch.Tensor,
        call_impl,
        original_call_impl,
        rare,
    )
    live = [True]  # emptied when the capture ends: `end(wrapper)`
    wrapper = _factory(*state, live)

    def run_compiled(module: Any, compiled: Any, args: tuple, kwargs: dict) -> Any:
        """A call of `torch.compile(f)` where f is `module`'s PyTorch `_call_impl` or `__call__`, made
        with the `_call_impl` copy or this wrapper in its place.

        `module.compile()` compiles the bound `_call_impl`, and `torch.compile(m)` made before the
        block, of a model class of the user's, wraps the bound `__call__`. Dynamo sets its callback and
        calls that method, whose frame it skips (PyTorch's file): the module's own hooks run as Python
        from there. The copy (the same file name) and this wrapper (marked skipped, capture/dynamo.py)
        are skipped alike, so Dynamo sees the same frames, and those hooks are traced.
        """
        cell = _fn_cell(compiled)
        before = cell.cell_contents if cell is not None else None
        func = getattr(before, "__func__", None)
        if getattr(before, "__self__", None) is not module or func is None:
            return compiled(*args, **kwargs)
        if func is original_call_impl:
            cell.cell_contents = call_impl.__get__(module)
        elif func is original_call:
            cell.cell_contents = wrapper.__get__(module)
        else:
            return compiled(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        finally:
            cell.cell_contents = before

    rare.run_compiled = run_compiled
    wrapper.hooktrace_live = live
    wrapper.hooktrace_state = state
    wrapper.hooktrace_rare = rare
    # PyTorch (Dynamo) tells its own call wrapper by name; tracebacks still name this code
    wrapper.__name__ = original_call.__name__
    wrapper.__qualname__ = original_call.__qualname__
    wrapper.__wrapped__ = original_call
    wrapper.run_compiled = run_compiled
    return wrapper


def _fn_cell(compiled: Any) -> Any:
    """The cell holding the function `torch.compile` wraps (`fn` of its `compile_wrapper`), or None."""
    code = getattr(compiled, "__code__", None)
    if code is None or "fn" not in code.co_freevars or compiled.__closure__ is None:
        return None
    return compiled.__closure__[code.co_freevars.index("fn")]


def _reference_code() -> types.CodeType:
    namespace: dict[str, Any] = {}
    exec(  # noqa: S102 - PyTorch's `_wrapped_call_impl` as this module expects it
        compile(
            "def _wrapped_call_impl(self, *args, **kwargs):\n" + _indent(_PYTORCH_BODY, 4), "<ref>", "exec"
        ),
        namespace,
    )
    return namespace["_wrapped_call_impl"].__code__


_REFERENCE = _reference_code()


def swappable(fn: Any) -> bool:
    """`fn` is PyTorch's `_wrapped_call_impl` with its own code, the body the swapped code keeps."""
    code = getattr(fn, "__code__", None)
    return (
        isinstance(fn, types.FunctionType)
        and fn.__globals__ is vars(nn_module)
        and code is not None
        and code.co_name == "_wrapped_call_impl"
        and not code.co_freevars
        and code.co_code == _REFERENCE.co_code
        and code.co_names == _REFERENCE.co_names
        and code.co_varnames == _REFERENCE.co_varnames
        and code.co_flags & 0xFFFF == _REFERENCE.co_flags & 0xFFFF  # not the __future__ flags
        and code.co_argcount == _REFERENCE.co_argcount
        and "torch" in fn.__globals__
        and fn.__globals__["torch"] is torch
    )


def install(wrapper: Callable[..., Any], ledger: Any) -> None:
    """Put the capture's module-call wrapper in place, recorded in `ledger`: its code in PyTorch's
    `__call__` when that can be (`swappable`), else the wrapper itself as `nn.Module.__call__`."""
    own = vars(torch.nn.Module)["__call__"]
    guard_module_code(ledger, own)  # the profiler's module names
    if swappable(own):
        # the state first, then the code (and back in reverse): a call that runs the code finds it
        ledger.set_item(vars(nn_module), STATE_NAME, wrapper.hooktrace_state)  # type: ignore[attr-defined]
        ledger.swap_code(own, SWAPPED_CODE)
    else:
        ledger.set(torch.nn.Module, "__call__", wrapper)


def end(wrapper: Any) -> None:
    """The capture is over: a copy of `wrapper` kept somewhere (a class's own `__call__`) is PyTorch's.

    Its state lets go of the capture's callbacks (the session's methods) and of `run_compiled`,
    which refers back to it: without that cycle the session, and the trace it holds, are freed
    when the caller lets go of them, not at a later full GC pass. A call still inside the wrapper
    on another thread finds callables that do nothing (and a compiled call run plainly)."""
    wrapper.hooktrace_live.clear()
    rare = wrapper.hooktrace_rare
    rare.on_input = rare.on_new_module = rare.on_compiled = _inert
    rare.run_compiled = _run_plain
    wrapper.__dict__.pop("run_compiled", None)


def _inert(*_args: Any) -> None:
    return None


def _run_plain(_module: Any, compiled: Any, args: tuple, kwargs: dict) -> Any:
    return compiled(*args, **kwargs)
