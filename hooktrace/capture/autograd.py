"""Autograd-node hooks, saved-tensor hooks and DDP communication hooks: hooks held outside Python.

- **Node hooks** (`grad_fn.register_hook` / `register_prehook`, hooks on `AccumulateGrad` nodes, on
  custom `Function` nodes): PyTorch's C++ `register_hook` looks `_register_hook(dict, hook)` up on
  `torch.autograd.Function` (found on `_HookMixin`) each time and keeps the returned dict in the
  node, where Python cannot read it back. While capturing, that function is PyTorch's plus one step:
  a shim stands in the returned dict in place of the hook (same key), as for tensor hooks, and the
  hook goes back at the end of the block. Post and pre hooks go through the same function; which of
  the two was called, and on which node, is read from the registering line's bytecode
  (`<expr>.register_prehook(...)` where `<expr>` is a name followed by attribute reads and constant
  subscripts, re-read once where reading runs no code: `acc.register_hook(h)`,
  `y.grad_fn.register_hook(h)`; a property, `__getattr__` or `__torch_function__` on the way is not
  run again, and the node is then unknown). When that line is not of that form the kind is `node`
  and the node is unknown. Node hooks that PyTorch's own plumbing
  registers (`BackwardHook` for module backward hooks, legacy backward hooks) are not user hooks and
  are not traced.
- **Saved-tensor hooks** (`torch.autograd.graph.saved_tensors_hooks`, `save_on_cpu`, checkpoint's
  own): `saved_tensors_hooks.__enter__` pushes shims of the object's `pack_hook` / `unpack_hook`
  (the object keeps its own attributes). They have no handle: one synthetic id per object and kind.
  A saved tensor's `unpack_hook` (`grad_fn._raw_saved_self.unpack_hook`) reads the user's hook
  through the shim while the block is open.
- **DDP communication hooks**: `DistributedDataParallel.register_comm_hook` keeps the user's hook in
  `_comm_hooks` and hands it to the C++ reducer through `torch.distributed._register_comm_hook`;
  the reducer gets the user's own hook (it keeps it for good), and its calls are traced through its
  code for the block (capture/comm.py).
"""

from __future__ import annotations

import dis
import functools
import inspect
import sys
import types
from types import CodeType, FrameType
from typing import Any, Callable, Optional

import torch
import torch.autograd.function as autograd_function
from torch.autograd.graph import saved_tensors_hooks

from ..kinds import K
from . import shims, sites
from .ledger import CURRENT, Ledger
from .views import _is_compiling

_push_hooks: Callable[[Any, Any], None] = torch._C._autograd._push_saved_tensors_default_hooks
_ORIGINAL_REGISTER = vars(autograd_function._HookMixin)["_register_hook"]
_ORIGINAL_ENTER = vars(saved_tensors_hooks)["__enter__"]
_SAVED_TENSOR = torch._C._autograd.SavedTensor
# `SavedTensor.unpack_hook` (read back by user code) exists from torch 2.10; torch 2.8 and 2.9's SavedTensor
# has only `register_hooks`, and nothing reads the pushed hook back: there is nothing to hide then.
_ORIGINAL_UNPACK_HOOK: Optional[Any] = vars(_SAVED_TENSOR).get("unpack_hook")


# -- the registering line ------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def _instructions(code: CodeType) -> tuple[dis.Instruction, ...]:
    return tuple(dis.get_instructions(code))


def _registering_call(frame: FrameType) -> tuple[str, Any]:
    """("node" | "node_pre", node or None) for the `register_hook`/`register_prehook` call in `frame`."""
    code_ins = _instructions(frame.f_code)
    at = next((i for i, ins in enumerate(code_ins) if ins.offset == frame.f_lasti), None)
    if at is None:
        return K.node, None
    method = None
    for i in range(at - 1, max(at - 64, -1), -1):
        ins = code_ins[i]
        if ins.opname in ("LOAD_METHOD", "LOAD_ATTR") and ins.argval in ("register_hook", "register_prehook"):
            method = i
            break
    if method is None:
        return K.node, None
    kind = K.node_pre if code_ins[method].argval == "register_prehook" else K.node
    # the receiver: a name, then attribute reads and constant subscripts
    steps: list[tuple[str, Any]] = []
    i = method - 1
    while i >= 0:
        ins = code_ins[i]
        if ins.opname == "LOAD_ATTR":
            steps.append(("attr", ins.argval))
        elif ins.opname == "BINARY_SUBSCR" and i > 0 and code_ins[i - 1].opname == "LOAD_CONST":
            steps.append(("item", code_ins[i - 1].argval))
            i -= 1
        elif ins.opname in ("LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL", "LOAD_NAME"):
            if ins.is_jump_target:
                return kind, None
            steps.append(("name", ins.argval))
            break
        else:
            return kind, None
        if ins.is_jump_target:
            return kind, None
        i -= 1
    else:
        return kind, None
    return kind, _evaluate(frame, steps[::-1])


class _Unsafe(Exception):
    """Reading this step again could run code (a property, `__getattr__`, `__torch_function__`)."""


_MISSING = object()
_C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)


def _read(obj: Any, how: str, what: Any) -> Any:
    """`obj.what` / `obj[what]`, only when that runs no Python code; else _Unsafe."""
    tp = type(obj)  # never isinstance(): it reads obj.__class__, which a class may make a property
    if issubclass(tp, torch.Tensor) and torch.overrides.has_torch_function((obj,)):
        raise _Unsafe
    if how == "item":
        if tp in (list, tuple, dict):
            return obj[what]
        raise _Unsafe
    if tp.__getattribute__ is not object.__getattribute__:
        raise _Unsafe
    static = inspect.getattr_static(obj, what, _MISSING)
    if static is _MISSING:
        if issubclass(tp, torch.nn.Module):  # what Module.__getattr__ would read, read directly
            for table in ("_parameters", "_buffers", "_modules"):
                found = obj.__dict__.get(table, {}).get(what, _MISSING)
                if found is not _MISSING:
                    return found
        raise _Unsafe
    if issubclass(type(static), _C_DESCRIPTORS):
        return getattr(obj, what)  # a C getter (a tensor's grad_fn, a node's next_functions)
    if not _has_static(type(static), "__get__"):  # a plain value, in the instance's or the class's dict
        return static
    raise _Unsafe


def _evaluate(frame: FrameType, steps: list[tuple[str, Any]]) -> Any:
    """The receiver the registering line named, read again only where that runs no code: reading a
    property, `__getattr__` or `__torch_function__` twice would change what untraced code does."""
    try:
        _, name = steps[0]
        local, glob = frame.f_locals, frame.f_globals
        if name in local:
            obj = local[name]
        elif name in glob:
            obj = glob[name]
        else:
            obj = glob["__builtins__"][name] if isinstance(glob.get("__builtins__"), dict) else None
        for how, what in steps[1:]:
            obj = _read(obj, how, what)
    except Exception:
        return None
    return obj if _is_node(obj) else None


def _has_static(tp: type, name: str) -> bool:
    """`name` is in the dict of `tp` or a class it derives from: looked up without running a
    metaclass's `__getattr__`."""
    return any(name in vars(k) for k in inspect.getmro(tp))


def _is_node(obj: Any) -> bool:
    tp = type(obj)
    return issubclass(
        type(inspect.getattr_static(obj, "next_functions", None)), _C_DESCRIPTORS
    ) and _has_static(tp, "register_prehook")


# -- patched functions (made once; a reference kept after the block passes straight through) -------
def _register_hook(backward_hooks: Any, hook: Any) -> Any:
    result = _ORIGINAL_REGISTER.__func__(backward_hooks, hook)
    current = CURRENT.callbacks
    if current is None or _is_compiling():
        return result
    frame = sys._getframe(1)
    if sites._frame_class(frame.f_code.co_filename) == 2:  # BackwardHook / legacy backward plumbing
        return result
    kind, node = _registering_call(frame)
    current.on_node_hook(result[0], result[1], kind, node, frame)
    return result


def _enter(self: Any) -> None:
    current = CURRENT.callbacks
    if current is None or _is_compiling():
        return _ORIGINAL_ENTER(self)
    pack, unpack = current.saved_tensors_shims(self, sys._getframe(1))
    _push_hooks(pack, unpack)
    return None


def _unpack_hook_of(saved: Any) -> Any:
    """`SavedTensor.unpack_hook`: the hook the user pushed, not the shim that autograd holds."""
    hook = _ORIGINAL_UNPACK_HOOK.__get__(saved, type(saved))  # type: ignore[union-attr]
    if getattr(hook, "__code__", None) in shims.SHIM_CODES:
        return hook.__wrapped__
    return hook


_UNPACK_HOOK = (
    property(_unpack_hook_of, doc=_ORIGINAL_UNPACK_HOOK.__doc__)
    if _ORIGINAL_UNPACK_HOOK is not None
    else None
)

_enter.__wrapped__ = _ORIGINAL_ENTER  # type: ignore[attr-defined]
_enter.__qualname__ = _ORIGINAL_ENTER.__qualname__
_enter.__doc__ = _ORIGINAL_ENTER.__doc__


def ddp_and_caller(frame: Any) -> tuple[Optional[torch.nn.Module], Any]:
    """For a `Reducer._register_comm_hook` call made from `frame`: the DDP module whose method made
    it (None when called otherwise) and the frame that called that method (where it was registered)."""
    ddp = frame.f_locals.get("self")
    if not isinstance(ddp, torch.nn.Module):
        return None, frame
    return ddp, frame.f_back if frame.f_back is not None else frame  # the caller of register_comm_hook


def _comm_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _register_comm_hook(reducer: Any, state: Any, hook: Any) -> Any:
        current = CURRENT.callbacks
        if current is None or _is_compiling() or not callable(hook):
            return original(reducer, state, hook)
        ddp, frame = ddp_and_caller(sys._getframe(1))
        result = original(reducer, state, hook)  # the user's own hook: nothing of ours stays in the reducer
        current.comm_hook(ddp, hook, frame)
        return result

    return _register_comm_hook


@functools.cache
def _comm_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    return _comm_patch(original)


def watch_node_hooks(callbacks: Any, ledger: Ledger) -> None:
    """The node-hook patch alone, while no capture is open (registrations watched before it opens,
    capture/steps.py): `callbacks.on_node_hook(dict, handle, kind, node, frame)` is called for each
    node hook registered, as a capture's is. `ledger` records it, and its owner puts it back."""
    ledger.claim("callbacks", callbacks, "autograd patches")
    ledger.set(autograd_function._HookMixin, "_register_hook", staticmethod(_register_hook))


def install(callbacks: Any, ledger: Ledger) -> None:
    """The patches for one capture, recorded in `ledger`: node-hook registration, saved-tensor
    hooks, DDP comm hook registration; they report to `callbacks` (the session)."""
    start = ledger.mark()
    ledger.claim("callbacks", callbacks, "autograd patches")
    try:
        ledger.set(autograd_function._HookMixin, "_register_hook", staticmethod(_register_hook))
        ledger.set(saved_tensors_hooks, "__enter__", _enter)
        if _UNPACK_HOOK is not None:
            ledger.set(_SAVED_TENSOR, "unpack_hook", _UNPACK_HOOK)
        dist = getattr(torch, "distributed", None)
        original = getattr(dist, "_register_comm_hook", None) if dist is not None else None
        if dist is not None and original is not None:
            ledger.set(dist, "_register_comm_hook", _comm_wrapper(original))
    except BaseException:
        ledger.restore(to=start)
        raise
