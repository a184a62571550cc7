"""Hooks are traced from outside their dicts: PyTorch's own code reads them through views.

The hook dicts of modules and the global ones are never modified while tracing, so code that
looks at them (pruning, weight norm, quantization `convert`, `torch.save`, `deepcopy`, other tools)
finds exactly what it registered. Instead, the `nn.Module` methods that read a hook dict to call its
hooks (`_call_impl`, `_get_backward_hooks`, `state_dict`, `load_state_dict`, the registration
methods, ...) run as copies made from their own source, identical but for one thing: each
`<hook dict>.items()` / `.values()` reads `hooktrace_view(<hook dict>, owner, "<attr>")` instead,
which returns the dict itself when no capture is active (or while Dynamo compiles) and otherwise a
plain dict with the same keys in the same order whose values are recording shims. The shims live
only in the lists PyTorch builds from that (`BackwardHook` keeps them for the backward pass).

The copies are compiled with the file name and line numbers of PyTorch's module, so tracebacks and
`inspect` read as usual. They are installed as class attributes of `nn.Module` for the block and
removed after it; `Module.__call__` becomes the recording wrapper (shims.make_module_call), which
calls the `_call_impl` copy itself, so a traced module level costs no extra Python frame.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Optional, Protocol

import torch
import torch.nn.modules.module as nn_module

# `<receiver>.<attr>.items()` / `.values()` on a module hook dict, or `<_global_...>.items()/values()`.
_MODULE_ATTRS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
_READ = re.compile(
    r"\b(?:(?P<owner>self|module)\.(?P<attr>" + "|".join(_MODULE_ATTRS) + r")"
    r"|(?P<glob>_global_[a-z_]+?_hooks))\.(?P<method>items|values)\(\)"
)
# globals that module.py rebinds (`global X`): read live, not from the copy's namespace
_REBOUND = re.compile(r"\b(_global_is_full_backward_hook)\b")
VIEW_NAME = "_hooktrace_view"
# `_call_impl`'s copy runs only from the recording wrapper, never under Dynamo (the wrapper hands
# compiling calls to PyTorch's own code), so it calls the capture's view directly: one call less.
FAST_VIEW_NAME = "_hooktrace_view_eager"
_MODULE_NAME = "_hooktrace_nn_module"
_CLASS_NAME = "_hooktrace_module_copies"


class Viewer(Protocol):
    def view(self, d: dict, owner: Any, attr: str) -> dict: ...


_viewer: Optional[Viewer] = None
try:
    _is_compiling: Callable[[], bool] = torch.compiler.is_compiling
except AttributeError:  # torch < 2.3
    _is_compiling = getattr(getattr(torch, "_dynamo", None), "is_compiling", lambda: False)


def hooktrace_view(d: Any, owner: Any, attr: str) -> Any:
    """What PyTorch's copied code iterates instead of the hook dict `d` (see the module docstring)."""
    viewer = _viewer
    if viewer is None or not d or _is_compiling():
        return d
    return viewer.view(d, owner, attr)


def _substitute(view: str) -> Callable[[re.Match], str]:
    def substitute(match: re.Match) -> str:
        owner, attr, glob, method = match.group("owner", "attr", "glob", "method")
        if glob is not None:
            return f'{view}({glob}, None, "{glob}").{method}()'
        return f'{view}({owner}.{attr}, {owner}, "{attr}").{method}()'

    return substitute


class _Copies:
    """The rewritten copies of `nn.Module`'s hook-reading methods, made once per process."""

    def __init__(self) -> None:
        self.originals: dict[str, Any] = {}
        self.copies: dict[str, Any] = {}
        self.namespace: dict[str, Any] = {}
        pieces: list[tuple[int, list[str]]] = []
        for name, fn in vars(torch.nn.Module).items():
            if not inspect.isfunction(fn) or fn.__module__ != nn_module.__name__:
                continue
            try:
                lines, first = inspect.getsourcelines(fn)
            except (OSError, TypeError):
                continue
            text = "".join(lines)
            if not _READ.search(text):
                continue
            self.originals[name] = fn
            sub = _substitute(FAST_VIEW_NAME if name == "_call_impl" else VIEW_NAME)
            pieces.append(
                (first, [_REBOUND.sub(_MODULE_NAME + r".\1", _READ.sub(sub, line)) for line in lines])
            )
        if not pieces:
            return
        pieces.sort()
        # One class body holding every copy at its own line numbers, so that `super()` has its cell
        # (pointed at nn.Module below) and tracebacks name PyTorch's file and lines.
        out = [""] * (pieces[0][0] - 2) + [f"class {_CLASS_NAME}:"]
        for first, lines in pieces:
            out += [""] * (first - 1 - len(out))
            out += [line.rstrip("\n") for line in lines]
        namespace = self.namespace = dict(vars(nn_module))
        namespace[VIEW_NAME] = namespace[FAST_VIEW_NAME] = hooktrace_view
        namespace[_MODULE_NAME] = nn_module
        exec(compile("\n".join(out) + "\n", nn_module.__file__ or "module.py", "exec"), namespace)  # noqa: S102
        made = vars(namespace.pop(_CLASS_NAME))
        for name, original in self.originals.items():
            copy = made[name]
            if "__class__" in copy.__code__.co_freevars:  # zero-argument super() inside the copy
                cell = copy.__closure__[copy.__code__.co_freevars.index("__class__")]
                cell.cell_contents = torch.nn.Module
            copy.__qualname__ = original.__qualname__
            copy.__doc__ = original.__doc__
            copy.__dict__.update(original.__dict__)
            self.copies[name] = copy


_made: Optional[_Copies] = None


def copies() -> _Copies:
    global _made
    if _made is None:
        _made = _Copies()
    return _made


class Installed:
    """The copies (and the `__call__` wrapper) on `nn.Module` for one capture; `restore()` undoes it."""

    def __init__(self, viewer: Viewer, module_call: Callable[..., Any]) -> None:
        global _viewer
        made = copies()
        self._saved: list[tuple[str, Any]] = []
        if _viewer is not None:
            raise RuntimeError("another capture's views are installed")
        _viewer = viewer
        self._namespace = made.namespace
        try:
            self._namespace[FAST_VIEW_NAME] = viewer.view
            for name, copy in made.copies.items():
                if name == "_call_impl":  # the `__call__` wrapper calls it; `_call_impl` stays PyTorch's
                    continue
                self._set(name, copy)
            self._set("__call__", module_call)
        except BaseException:
            self.restore()
            raise

    def _set(self, name: str, value: Any) -> None:
        self._saved.append((name, vars(torch.nn.Module)[name]))
        setattr(torch.nn.Module, name, value)

    def restore(self) -> None:
        global _viewer
        _viewer = None
        self._namespace[FAST_VIEW_NAME] = hooktrace_view  # inert now: returns the dict itself
        while self._saved:
            name, original = self._saved.pop()
            setattr(torch.nn.Module, name, original)


def call_impl_copy() -> Any:
    """The copy of `Module._call_impl` that reads hooks through views (or PyTorch's own if none)."""
    return copies().copies.get("_call_impl", vars(torch.nn.Module)["_call_impl"])
