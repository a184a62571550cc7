"""Where PyTorch keeps hooks, and interception of every `register_*` call while capturing.

Patches are recorded in the capture's ledger on entry and undone in `finally`; each patched function
calls the original and then reports the new handle to `on_register`, so PyTorch's own behaviour
(ids, dict order, extra dicts, `prepend`) is exactly what it would have been.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from typing import Any, Callable

import torch
import torch.nn.modules.module as nn_module
import torch.optim.optimizer as optim_module
from torch.utils.hooks import RemovableHandle

from .. import kinds
from ..kinds import GLOBAL, MODULE, OPTIMIZER, TENSOR
from .ledger import CURRENT, Ledger
from .views import _is_compiling

# (name, kind) of every `register_*` function, from the kinds table: methods of nn.Module, Tensor
# and Optimizer, functions of torch.nn.modules.module and torch.optim.optimizer
MODULE_METHODS = kinds.registers_of(MODULE)
GLOBAL_FUNCTIONS = kinds.registers_of(GLOBAL, [k for k in kinds.KINDS if k not in kinds.OPTIMIZER_KINDS])
OPTIMIZER_METHODS = kinds.registers_of(OPTIMIZER)
OPTIMIZER_FUNCTIONS = kinds.registers_of(GLOBAL, kinds.OPTIMIZER_KINDS)
TENSOR_METHODS = kinds.registers_of(TENSOR)


OnRegister = Callable[[RemovableHandle, str, Any, dict, Any], None]


@functools.cache
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    """The signature of one of PyTorch's register_* functions (the same few in every capture)."""
    return inspect.signature(function)


# The wrappers an interceptor patches in are made once per process (cached), for each of PyTorch's
# functions, and report to the interceptor installed (`CURRENT.interceptor`; captures do not nest); a
# reference to one kept after its capture (a `from torch.nn.modules.module import register_...` run
# inside the block) passes calls straight through. Nested registrations (a register_* calling
# another) are counted per thread.
_depth = threading.local()


@functools.cache
def _register_wrapper(original: Callable[..., Any], kind: str, is_global: bool) -> Callable[..., Any]:
    signature = _signature(original)

    @functools.wraps(original)
    def register(*args: Any, **kwargs: Any) -> Any:
        interceptor = CURRENT.interceptor
        if interceptor is None or getattr(_depth, "depth", 0) > 0 or _is_compiling():
            return original(*args, **kwargs)  # no capture, nested, or Dynamo tracing the call
        _depth.depth = 1
        try:
            handle = original(*args, **kwargs)
        finally:
            _depth.depth = 0
        if isinstance(handle, RemovableHandle):
            try:
                arguments = signature.bind(*args, **kwargs).arguments
            except TypeError:
                arguments = {}
            owner = None if is_global else args[0]
            interceptor._on_register(handle, kind, owner, arguments, sys._getframe(1))
        return handle

    return register


@functools.cache
def _handle_init_wrapper(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(handle: RemovableHandle, *args: Any, **kwargs: Any) -> None:
        original(handle, *args, **kwargs)
        interceptor = CURRENT.interceptor
        if interceptor is not None and getattr(_depth, "depth", 0) == 0:
            interceptor._on_handle(handle, sys._getframe(1))

    return __init__


@functools.cache
def _remove_wrapper(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def remove(handle: RemovableHandle) -> None:
        interceptor = CURRENT.interceptor
        if interceptor is not None:
            interceptor._on_remove(handle)
        original(handle)

    return remove


class Interceptor:
    """Installs the registration patches (a ledger undoes them); reports each registration once.

    `on_register(handle, kind, owner, arguments, frame)` is called after PyTorch registered the
    hook (owner: the module, the tensor, or None for global hooks). `on_handle(handle, frame)` is
    called for handles created outside the patched entry points (stale references to the global
    functions, code that builds handles and fills hook dicts itself). `on_remove(handle)` before
    a handle removes its hook. One interceptor is installed at a time.
    """

    def __init__(
        self,
        on_register: OnRegister,
        on_handle: Callable[[RemovableHandle, Any], None],
        on_remove: Callable[[RemovableHandle], None],
    ) -> None:
        self._on_register = on_register
        self._on_handle = on_handle
        self._on_remove = on_remove

    # -- install (the ledger's owner restores) ---------------------------------------------
    def install(self, ledger: Ledger) -> None:
        """Patch every `register_*` entry point, and `RemovableHandle`, recording each in `ledger`."""
        start = ledger.mark()
        ledger.claim("interceptor", self, "registration patches")
        patch = ledger.set
        try:
            for name, kind in MODULE_METHODS:
                if name in vars(torch.nn.Module):
                    patch(torch.nn.Module, name, _register_wrapper(vars(torch.nn.Module)[name], kind, False))
            for name, kind in TENSOR_METHODS:
                if name in vars(torch.Tensor):
                    patch(torch.Tensor, name, _register_wrapper(vars(torch.Tensor)[name], kind, False))
            for name, kind in GLOBAL_FUNCTIONS:
                original = getattr(nn_module, name, None)
                if original is None:
                    continue
                patched = _register_wrapper(original, kind, True)
                for namespace in (nn_module, torch.nn.modules, torch.nn):
                    if getattr(namespace, name, None) is original:
                        patch(namespace, name, patched)
            optimizer = torch.optim.Optimizer
            for name, kind in OPTIMIZER_METHODS:
                if name in vars(optimizer):
                    patch(optimizer, name, _register_wrapper(vars(optimizer)[name], kind, False))
            for name, kind in OPTIMIZER_FUNCTIONS:
                original = getattr(optim_module, name, None)
                if original is None:
                    continue
                patched = _register_wrapper(original, kind, True)
                for namespace in (optim_module, torch.optim):
                    if getattr(namespace, name, None) is original:
                        patch(namespace, name, patched)
            patch(RemovableHandle, "__init__", _handle_init_wrapper(vars(RemovableHandle)["__init__"]))
            patch(RemovableHandle, "remove", _remove_wrapper(vars(RemovableHandle)["remove"]))
        except BaseException:
            ledger.restore(to=start)
            raise
