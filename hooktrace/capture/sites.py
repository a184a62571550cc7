"""Names and source locations of hook callables and of the code that registered them (SPEC §4)."""

from __future__ import annotations

import functools
import inspect
import os
import site
import sys
import sysconfig
from types import FrameType, FunctionType
from typing import Any, Optional

import torch

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_HOOKTRACE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# PyTorch's own registration plumbing: never the interesting "registered_at" frame.
_PLUMBING = tuple(
    os.path.join(_TORCH_DIR, p)
    for p in ("nn/modules/module.py", "_tensor.py", "utils/hooks.py", "overrides.py")
)


def _site_dirs() -> tuple[str, ...]:
    dirs: set[str] = set()
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # virtualenvs with an old site.py
        pass
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        dirs.add(user)
    for key in ("purelib", "platlib"):
        dirs.add(sysconfig.get_paths()[key])
    dirs.update(p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages")))
    dirs.add(os.path.dirname(_TORCH_DIR.rstrip(os.sep)))
    # longest first, so nested site folders win
    return tuple(sorted((os.path.abspath(d) + os.sep for d in dirs if d), key=len, reverse=True))


_SITE_DIRS = _site_dirs()


@functools.lru_cache(maxsize=4096)
def display_path(filename: str) -> str:
    """Inside an installed package: relative to its site-packages; else relative to cwd; else absolute."""
    if filename.startswith("<"):
        return filename
    path = os.path.abspath(filename)
    for d in _SITE_DIRS:
        if path.startswith(d):
            return path[len(d) :]
    cwd = os.getcwd() + os.sep
    if path.startswith(cwd):
        return path[len(cwd) :]
    return path


_FUNCTION = FunctionType


def _unwrap_callable(fn: Any) -> Any:
    """Peel PyTorch's `_WrappedHook` (load_state_dict pre-hooks, legacy backward hooks)."""
    for _ in range(8):
        inner = getattr(type(fn), "__name__", "") == "_WrappedHook" and getattr(fn, "hook", None)
        if not inner:
            return fn
        fn = inner
    return fn


def hook_name(fn: Any) -> str:
    """`__qualname__`; bound methods `Class.method`; partial as `partial(<f>)`; objects: their class."""
    if type(fn) is _FUNCTION:  # the common case, without the checks below
        return fn.__qualname__
    fn = _unwrap_callable(fn)
    if isinstance(fn, functools.partial):
        return f"partial({hook_name(fn.func)})"
    if inspect.ismethod(fn):
        return f"{type(fn.__self__).__qualname__}.{fn.__func__.__name__}"
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(qualname, str) and (inspect.isfunction(fn) or inspect.isbuiltin(fn) or inspect.isclass(fn)):
        return qualname
    if isinstance(qualname, str) and not callable(type(fn).__dict__.get("__call__")):
        return qualname
    return type(fn).__qualname__


def _code_of(fn: Any) -> Any:
    fn = _unwrap_callable(fn)
    for _ in range(8):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif inspect.ismethod(fn):
            fn = fn.__func__
        else:
            break
    try:
        fn = inspect.unwrap(fn)
    except ValueError:
        pass
    code = getattr(fn, "__code__", None)
    if code is None and not inspect.isfunction(fn):
        call = vars(type(fn)).get("__call__") or type(fn).__call__
        code = getattr(call, "__code__", None)
    return code


def defined_at(fn: Any) -> Optional[str]:
    """`file:line` of the callable's code, following `__wrapped__`; None for builtins."""
    if type(fn) is _FUNCTION and "__wrapped__" not in fn.__dict__:  # the common case
        return _where(fn.__code__)
    code = _code_of(fn)
    if code is None:
        return None
    return _where(code)


@functools.lru_cache(maxsize=4096)
def _where(code: Any) -> str:
    """Hooks made in a loop share their code object: compute its place once."""
    return f"{display_path(code.co_filename)}:{code.co_firstlineno}"


# Pass-through decorators (`@deprecated` around torch.ao's `prepare`, functools/contextlib wrappers):
# the user's line is the one that called them.
_WRAPPER_FILES = ("typing_extensions.py", "functools.py", "contextlib.py", "warnings.py")


@functools.lru_cache(maxsize=4096)
def _frame_class(filename: str) -> int:
    """0 = user code, 1 = torch or a pass-through wrapper, 2 = plumbing or hooktrace itself."""
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(_HOOKTRACE_DIR) or path.startswith(_PLUMBING):
        return 2
    if path.startswith(_TORCH_DIR) or os.path.basename(path) in _WRAPPER_FILES:
        return 1
    return 0


def call_sites(frame: Optional[FrameType]) -> tuple[Optional[str], Optional[str]]:
    """(registered_at, registered_by) for a registration whose caller is `frame`."""
    registered_at = registered_by = None
    while frame is not None and registered_by is None:
        code = frame.f_code
        cls = _frame_class(code.co_filename)
        where = None
        if cls != 2 and registered_at is None:
            where = f"{display_path(code.co_filename)}:{frame.f_lineno}"
            registered_at = where
        if cls == 0:
            registered_by = where or f"{display_path(code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return registered_at, registered_by
