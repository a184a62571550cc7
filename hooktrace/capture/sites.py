"""Names and source locations of hook callables and of the code that registered them (docs/format.md)."""

from __future__ import annotations

import functools
import inspect
import os
import site
import sys
import sysconfig
from types import FrameType, FunctionType, MethodType
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


def display_path(filename: str) -> str:
    """Inside an installed package: relative to its site-packages; else relative to cwd; else absolute.
    The code of an IPython or Jupyter cell is named by its prompt, `In [3]`.

    Depends on the working directory at the time of the call (a process may `os.chdir`)."""
    cell = notebook_cell(filename)
    if cell is not None:
        return cell
    if filename.startswith("<"):
        return filename
    return _display_path(filename, os.getcwd())


def notebook_cell(filename: str) -> Optional[str]:
    """`In [3]` when `filename` is the name IPython compiled a cell under (ipykernel's
    `/tmp/ipykernel_<pid>/<hash>.py`, terminal IPython's `<ipython-input-3-…>`), else None.

    IPython's compiler maps each such name to the cell's execution count (the `In [3]` of its
    prompt and of its tracebacks' `Cell In[3], line 2`): `format_code_name` reads that map."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython is not None else None
    shell = get() if get is not None else None
    name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    if name is None:
        return None
    try:
        label = name(filename)
    except Exception:  # noqa: BLE001 - an IPython without the map, or one that changed it: a plain path
        return None
    if not (isinstance(label, tuple) and len(label) == 2 and isinstance(label[1], str)):
        return None
    number = label[1].removeprefix("In[").removesuffix("]")
    return f"In [{number}]" if number.isdigit() else None


@functools.lru_cache(maxsize=4096)
def _display_path(filename: str, cwd: str) -> str:
    path = os.path.normpath(os.path.join(cwd, filename))
    for d in _SITE_DIRS:
        if path.startswith(d):
            return path[len(d) :]
    cwd = cwd.rstrip(os.sep) + os.sep
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
    """`__qualname__`; bound methods `Class.method`; partial as `partial(<f>)`; objects: their class.

    A closure around exactly one other callable (TransformerLens' `HookPoint.add_hook.<locals>.full_hook`,
    a decorator without `__wrapped__`) is named `wrapper → inner`, so the user's function shows."""
    if type(fn) is _FUNCTION:  # the common case, without the checks below
        inner = _wrapped_by_closure(fn)
        if inner is None:
            return fn.__qualname__
        return f"{fn.__qualname__.rsplit('.', 1)[-1]} → {hook_name(inner)}"
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


def _is_wrapped_candidate(value: Any) -> bool:
    """A callable a hook wrapper may stand for: Python functions, methods, partials, callable objects
    with a Python `__call__` — not classes, modules (nn.Module instances such as TransformerLens'
    `HookPoint` itself) or builtins such as `list.append`."""
    if isinstance(value, (FunctionType, MethodType, functools.partial)):
        return True
    if isinstance(value, (type, torch.nn.Module)) or not callable(value):
        return False
    return isinstance(inspect.getattr_static(type(value), "__call__", None), FunctionType)


def _wrapped_by_closure(fn: FunctionType) -> Optional[Any]:
    """The one callable a closure holds in its cells, or None (none, several, `__wrapped__` set, or the
    closure was given a `__qualname__` of its own)."""
    cells = fn.__closure__
    if not cells or "__wrapped__" in fn.__dict__:
        return None
    if fn.__qualname__ != getattr(fn.__code__, "co_qualname", fn.__qualname__):
        return None  # renamed on purpose: its own name is the one to show
    # a function defined in the same scope as the closure is its helper (transformers'
    # `output_capturing_hook` and its `append_hidden_state`), not a function it was given to wrap
    scope = fn.__qualname__.rpartition(".")[0]
    found: list[Any] = []
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if scope and isinstance(value, FunctionType) and value.__qualname__.rpartition(".")[0] == scope:
            continue
        if value is not fn and _is_wrapped_candidate(value) and not any(value is f for f in found):
            found.append(value)
            if len(found) > 1:
                return None
    return found[0] if found else None


def _code_of(fn: Any) -> Any:
    fn = _unwrap_callable(fn)
    for _ in range(8):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif inspect.ismethod(fn):
            fn = fn.__func__
        elif type(fn) is _FUNCTION and (inner := _wrapped_by_closure(fn)) is not None:
            fn = inner
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
    """`file:line` of the callable's code, following `__wrapped__` and a closure around exactly one
    other callable (the user's function inside a library's wrapper); None for builtins."""
    if type(fn) is _FUNCTION and "__wrapped__" not in fn.__dict__ and not fn.__closure__:  # the common case
        return _where(fn.__code__)
    code = _code_of(fn)
    if code is None:
        return None
    return _where(code)


# -- forward wrappers: named by their own code ----------------------------------------------
# A `forward` set on a module instance is the user's (or a library's) own code standing in for the
# class's forward: `functools.wraps` gives it the wrapped method's `__qualname__` and `__wrapped__`,
# which would name it `Linear.forward` at torch/nn/modules/linear.py. For this kind the wrapper's
# own code wins over docs/format.md's "follow __wrapped__" (which is for decorated hooks, whose wrapped
# function is the user's): the name is its code's, then what it wraps (`my_wrapper → Linear.forward`).


def _own_code(fn: Any) -> Any:
    """The code that runs when `fn` is called: a partial's `func`, a method's function, a function's
    own code object (not what `__wrapped__` points to), a callable object's class `__call__`."""
    fn = _unwrap_callable(fn)
    for _ in range(8):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif inspect.ismethod(fn):
            fn = fn.__func__
        else:
            break
    code = getattr(fn, "__code__", None)
    if code is None and not inspect.isfunction(fn):
        call = inspect.getattr_static(type(fn), "__call__", None)
        code = getattr(call, "__code__", None)
    return code


def _own_name(fn: Any) -> str:
    fn = _unwrap_callable(fn)
    if isinstance(fn, functools.partial):
        return f"partial({_own_name(fn.func)})"
    if inspect.ismethod(fn):
        return f"{type(fn.__self__).__qualname__}.{fn.__func__.__code__.co_name}"
    if isinstance(fn, FunctionType):
        return getattr(fn.__code__, "co_qualname", fn.__code__.co_name)
    return hook_name(fn)


def _wraps(fn: Any) -> Optional[Any]:
    """What a forward wrapper stands for: its `__wrapped__` (functools.wraps, update_wrapper), or the one
    callable a closure holds."""
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None and wrapped is not fn:
        return wrapped
    if type(fn) is _FUNCTION:
        return _wrapped_by_closure(fn)
    return None


def forward_wrapper_name(fn: Any) -> str:
    """`my_wrapper → Linear.forward`: the wrapper's own name, then what it wraps (when it says)."""
    own = _own_name(fn)
    inner = _wraps(fn)
    if inner is None:
        return own
    inner_name = hook_name(inner)
    return own if inner_name == own else f"{own} → {inner_name}"


def forward_wrapper_defined_at(fn: Any) -> Optional[str]:
    """`file:line` of the wrapper's own code, not of what it wraps."""
    code = _own_code(fn)
    return _where(code) if code is not None else None


def code_defined_at(code: Any) -> str:
    """`file:line` of a code object, as `defined_at` gives it."""
    return _where(code)


def _where(code: Any) -> str:
    cell = notebook_cell(code.co_filename)
    if cell is not None:
        return f"{cell}:{code.co_firstlineno}"
    return _where_in(code, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _where_in(code: Any, cwd: str) -> str:
    """Hooks made in a loop share their code object: compute its place once (per working directory)."""
    filename = code.co_filename
    shown = filename if filename.startswith("<") else _display_path(filename, cwd)
    return f"{shown}:{code.co_firstlineno}"


# Pass-through decorators (`@deprecated` around torch.ao's `prepare`, functools/contextlib wrappers):
# the user's line is the one that called them.
_WRAPPER_FILES = ("typing_extensions.py", "functools.py", "contextlib.py", "warnings.py")


_CAPTURE_DIR = os.path.join(_HOOKTRACE_DIR, "capture") + os.sep
USER, LIBRARY, PLUMBING, DRIVER = 0, 1, 2, 3


def _frame_class(filename: str) -> int:
    """USER code, LIBRARY (torch or a pass-through wrapper), PLUMBING (PyTorch's registration code,
    hooktrace's capture and shims), or DRIVER (the rest of hooktrace: the CLI and the drivers in
    `runs/`; what called them is not the user's code that led to a registration but the CLI framework)."""
    return _frame_class_in(filename, os.getcwd() if not os.path.isabs(filename) else "")


@functools.lru_cache(maxsize=4096)
def _frame_class_in(filename: str, cwd: str) -> int:
    if filename.startswith("<"):
        return PLUMBING if filename.startswith("<hooktrace") else USER
    path = os.path.normpath(os.path.join(cwd, filename))
    if path.startswith(_HOOKTRACE_DIR):
        if path.startswith(_CAPTURE_DIR):
            return PLUMBING
        return DRIVER
    if path.startswith(_PLUMBING):
        return PLUMBING
    if path.startswith(_TORCH_DIR) or os.path.basename(path) in _WRAPPER_FILES:
        return LIBRARY
    if path.startswith(_SITE_DIRS):  # an installed package (transformers, TorchLens): a library too
        return LIBRARY
    return USER


def is_plumbing_hook(fn: Any) -> bool:
    """A hook PyTorch's own plumbing put in a node's dict (BackwardHook's, a legacy module backward
    hook's `_WrappedHook`): its code, or its class's `__call__`, is in a PLUMBING file."""
    code = getattr(fn, "__code__", None)
    if code is None:
        code = getattr(vars(type(fn)).get("__call__"), "__code__", None)
    return code is not None and _frame_class(code.co_filename) == PLUMBING


def call_sites(frame: Optional[FrameType]) -> tuple[Optional[str], Optional[str]]:
    """(registered_at, registered_by) for a registration whose caller is `frame`.

    The walk stops at hooktrace's own CLI/run driver: what called it (typer, click, runpy) is not the
    user's line, so `registered_by` is then None (e.g. FSDP registering tensor hooks in a step)."""
    registered_at = registered_by = None
    cwd = os.getcwd()
    while frame is not None and registered_by is None:
        code = frame.f_code
        filename = code.co_filename
        cls = _frame_class_in(filename, cwd if not os.path.isabs(filename) else "")
        if cls == DRIVER:
            break
        where = None
        if cls != PLUMBING and registered_at is None:
            where = f"{display_path(filename)}:{frame.f_lineno}"
            registered_at = where
        if cls == USER:
            registered_by = where or f"{display_path(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return registered_at, registered_by
