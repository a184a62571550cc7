"""Hooks that PyTorch APIs keep outside any hook dict: end-of-backward callbacks and multi-grad hooks.

- **End-of-backward callbacks** (`Variable._execution_engine.queue_callback(cb)`, as DDP, FSDP and
  ModTracker queue them): the engine is a C type whose methods cannot be patched, so for the block
  `Variable._execution_engine` is an instance of a subclass of it (the engine's methods all act on
  the one process-wide engine, whichever instance they are called on) whose `queue_callback` queues
  a recording shim of the callback. The engine runs it when the backward pass ends, as it would run
  the callback; the shim lives only in that backward pass's list of callbacks. After the block the
  original instance is back. One HOOK per callback function and queuing line.
- **Multi-grad hooks** (`torch.autograd.graph.register_multi_grad_hook`): PyTorch registers a
  tensor hook of its own on each tensor (`inner_hook`, or `wrapped_fn` for mode "any") that calls
  the user's function, held in one closure cell, when the hook's condition is met. Those inner
  hooks are not traced; for the block the cell holds a recording shim of the user's function, and
  the user's function goes back in the cell when the block ends (every tensor dict is untouched).
  Found when an inner hook is registered in the block, or when the capture meets one a tensor held
  before it (the same paths as tensor hooks), so one call of the user's function is one event, in
  mode "any" too.
- **leaf_function multi-grad hooks** (`leaf_function(f).register_multi_grad_hook(h)`, torch 2.13):
  each call of `f` in backward-recording mode registers a multi-grad hook (PyTorch's
  `_multi_grad_callback`, which calls `h`): traced as above, as kind `leaf_multi_grad`, named by `h`.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, Optional

import torch

from ..kinds import ENGINE, TENSOR, K
from . import sites
from .ledger import CURRENT, Ledger
from .views import _is_compiling

_VARIABLE: Any = torch.autograd.Variable
_ENGINE_TYPE: type = type(_VARIABLE._execution_engine)
_QUEUE: Callable[..., Any] = _ENGINE_TYPE.queue_callback  # type: ignore[attr-defined]
_RUN_BACKWARD: Callable[..., Any] = _ENGINE_TYPE.run_backward  # type: ignore[attr-defined]


class _TracingEngine(_ENGINE_TYPE):
    """The engine while a capture is open: its `queue_callback` queues a recording shim."""

    __slots__ = ("tracer",)

    def queue_callback(self, callback: Any) -> None:
        tracer = self.tracer
        if tracer is not None and callable(callback) and not _is_compiling():
            callback = tracer.final_callback(callback, sys._getframe(1))
        return _QUEUE(self, callback)


class _WatchingEngine(_TracingEngine):
    """The engine of a capture that watches compiled autograd: its `run_backward` (every `backward()`
    and `autograd.grad`) is PyTorch's, passed through CURRENT.around_backward (capture/compiled.py).
    Only then: otherwise no backward gets a frame of hooktrace's."""

    __slots__ = ()

    def run_backward(self, *args: Any, **kwargs: Any) -> Any:
        around = CURRENT.around_backward
        if around is None:
            return _RUN_BACKWARD(self, *args, **kwargs)
        return around(_RUN_BACKWARD, self, args, kwargs)


_TracingEngine.queue_callback.__doc__ = getattr(_QUEUE, "__doc__", None)
_WatchingEngine.run_backward.__doc__ = getattr(_RUN_BACKWARD, "__doc__", None)


def callback_key(callback: Any) -> tuple[str, Optional[str]]:
    """What makes two queued callbacks one hook (with the line that queued them): name and code."""
    return sites.hook_name(callback), sites.defined_at(callback)


# -- multi-grad hooks -----------------------------------------------------------------------------
def _nested_codes(code: types.CodeType) -> list[types.CodeType]:
    out = []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out.append(const)
            out.extend(_nested_codes(const))
    return out


def _codes_of(function: Any) -> frozenset:
    code = getattr(function, "__code__", None)
    return frozenset(_nested_codes(code)) if isinstance(code, types.CodeType) else frozenset()


_REGISTER = torch.autograd.graph.register_multi_grad_hook
_REGISTER_CODE = _REGISTER.__code__
# the code of the tensor hooks register_multi_grad_hook registers (inner_hook, wrapped_fn)
_INNER_CODES = frozenset(c for c in _codes_of(_REGISTER) if "fn" in c.co_freevars)


def _leaf_callback_codes() -> frozenset:
    """The code of `_multi_grad_callback`, which leaf_function's autograd forward registers (torch
    2.13 and later; empty before)."""
    # the module, when a leaf function made it be imported (never imported here: it imports Dynamo)
    leaf = sys.modules.get("torch._higher_order_ops.invoke_leaf_function")
    if leaf is None:
        return frozenset()
    found = set()
    for value in vars(leaf).values():
        if isinstance(value, type):
            for attr in vars(value).values():
                function = attr.__func__ if isinstance(attr, staticmethod) else attr
                for code in _codes_of(function):
                    if code.co_name == "_multi_grad_callback":
                        found.add(code)
    return frozenset(found)


_LEAF_CODES: Optional[frozenset] = None


def _leaf_codes() -> frozenset:
    global _LEAF_CODES
    if _LEAF_CODES is None:
        found = _leaf_callback_codes()
        if not found:
            return found  # looked up again once leaf functions are imported
        _LEAF_CODES = found
    return _LEAF_CODES


def _is_leaf_callback(fn: Any) -> bool:
    """`fn` is leaf_function's `_multi_grad_callback`, under `torch._dynamo.disable`'s wrapper."""
    for _ in range(4):
        if getattr(fn, "__code__", None) in _leaf_codes():
            return True
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            return False
    return False


def inner_cell(fn: Any) -> Optional[Any]:
    """The closure cell holding the user's function, when `fn` is a tensor hook that
    register_multi_grad_hook registered; else None."""
    code = getattr(fn, "__code__", None) if type(fn) is types.FunctionType else None
    if code is None or code not in _INNER_CODES:
        return None
    return fn.__closure__[code.co_freevars.index("fn")]


def inner_codes() -> frozenset:
    """The code objects of register_multi_grad_hook's inner tensor hooks (`inner_cell`)."""
    return _INNER_CODES


def is_inner_hook(fn: Any) -> bool:
    return inner_cell(fn) is not None


def _registering_frame() -> Optional[types.FrameType]:
    """The frame of the register_multi_grad_hook call on this thread's stack, or None."""
    frame: Optional[types.FrameType] = sys._getframe(1)
    for _ in range(64):
        if frame is None:
            return None
        if frame.f_code is _REGISTER_CODE:
            return frame
        frame = frame.f_back
    return None


def _set_cell(cell: Any, value: Any) -> None:
    cell.cell_contents = value


class MultiGrad:
    """The multi-grad hooks one capture traces: their cells hold recording shims until `ledger` is
    restored. `shim(fn, kind, name_from, frame, hid)` makes the shim (the session's); `name_from`
    is the callable the hook is named after."""

    def __init__(self, shim: Callable[..., Any], ledger: Ledger) -> None:
        self._shim = shim
        self._ledger = ledger
        self._cells: dict[int, Any] = {}  # id(cell) -> cell, while it holds our shim

    def on_inner(self, fn: Any, hid: int) -> None:
        """`fn`, one of PyTorch's inner hooks (`inner_cell(fn)` is not None), was met in a tensor dict."""
        cell = inner_cell(fn)
        if cell is None or id(cell) in self._cells:
            return
        try:
            user = cell.cell_contents
        except ValueError:  # an empty cell: nothing to call yet
            return
        register = _registering_frame()
        caller = register.f_back if register is not None else None
        kind, name_from = K.multi_grad, user
        if _leaf_codes() and _is_leaf_callback(user):
            kind = K.leaf_multi_grad
            # the autograd forward that registered it holds the user's hook as `hook_real`
            hook = caller.f_locals.get("hook_real") if caller is not None else None
            name_from = hook if hook is not None else user
        shim = self._shim(user, kind, name_from, caller, hid)
        if shim is None:
            return
        self._cells[id(cell)] = cell
        _set_cell(cell, shim)
        cells = self._cells

        def undo() -> None:
            cells.pop(id(cell), None)
            try:
                if cell.cell_contents is shim:  # PyTorch's `fn = cast(..., fn)` keeps what is there
                    _set_cell(cell, user)
            except ValueError:
                pass

        self._ledger.on_restore(undo)


class Tracer:
    """What the patches of this module report to: one capture's book, under its lock, while it is open.

    book: its `records.HookBook`. site_of(frame): the `records.Site` of a registration made from
    `frame`. lock: the capture's lock. active(): the block is open."""

    def __init__(
        self, book: Any, site_of: Callable[[Any], Any], lock: Any, active: Callable[[], bool]
    ) -> None:
        self._book = book
        self._site_of = site_of
        self._lock = lock
        self._active = active

    def final_callback(self, callback: Any, frame: Any) -> Any:
        """An end-of-backward callback queued from `frame`: what the engine queues instead."""
        site = self._site_of(frame)
        with self._lock:
            if not self._active():
                return callback
            key = (K.final_callback, *callback_key(callback), site.registered_at)
            return self._book.api_shim(callback, K.final_callback, None, ENGINE, site, key=key)

    def multi_grad(self, fn: Any, kind: str, name_from: Any, frame: Any, hid: int) -> Any:
        """The shim of a multi-grad hook's function (the capture's lock is held: tensor dicts are read)."""
        site = self._site_of(frame) if frame is not None else self._book.sites.get(hid)
        return self._book.api_shim(fn, kind, None, TENSOR, site, name_from=name_from)


def install(tracer: Tracer, ledger: Ledger, watch_backward: bool = False) -> None:
    """The patches for one capture, recorded in `ledger`: the engine's end-of-backward callbacks and the
    multi-grad hooks' cells report to `tracer`; with `watch_backward`, each backward pass goes through
    CURRENT.around_backward."""
    engine = _WatchingEngine() if watch_backward else _TracingEngine()
    engine.tracer = tracer
    ledger.set(_VARIABLE, "_execution_engine", engine)
    ledger.on_restore(lambda: setattr(engine, "tracer", None))  # a reference kept after the block
    book = tracer._book
    book.on_multi_grad = MultiGrad(tracer.multi_grad, ledger).on_inner  # the capture's own book
    ledger.on_restore(lambda: setattr(book, "on_multi_grad", None))
