"""How Python ends a script that raised, as `hooktrace exec` shows it: the traceback without
hooktrace's own frames (runpy's, which `python SCRIPT.py` does not show, the `<hooktrace-shim-N>`
shims and the capture's wrappers between the script's frames), printed as the interpreter prints an
uncaught exception, or handed to the script's own `sys.excepthook`.

The capture's `nn.Module.__call__` stands in for PyTorch's `_wrapped_call_impl` (it calls
`_call_impl` itself): the printed traceback shows PyTorch's frame in its place, as python would.
A script's own `sys.excepthook` gets the traceback objects, which cannot hold a frame that did not
run: there, the `_wrapped_call_impl` frames are missing (README, Limitations)."""

from __future__ import annotations

import functools
import os
import runpy
import sys
import traceback
from types import TracebackType
from typing import Any, Optional

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNPY = (os.path.abspath(runpy.__file__), "<frozen runpy>")
_MODULE_CALL = "hooktrace_module_call"  # capture/shims.py: the capture's `nn.Module.__call__`


def is_ours(filename: str) -> bool:
    """A frame of hooktrace's (its package, its shims) or of runpy, which runs the script."""
    if filename.startswith("<hooktrace") or filename in _RUNPY:
        return True
    return not filename.startswith("<") and os.path.abspath(filename).startswith(_PACKAGE)


def _kept(files: list[str]) -> list[bool]:
    """Which frames (by file) python would show: never runpy's; not hooktrace's, except those after
    the last frame of anyone else's (an exception raised inside hooktrace itself keeps where)."""
    ours = [is_ours(f) for f in files]
    last = max((i for i, o in enumerate(ours) if not o), default=-1)
    if last < 0:  # the script did not start (a syntax error): python shows no frame
        return [False] * len(files)
    return [f not in _RUNPY and (i > last or not o) for i, (f, o) in enumerate(zip(files, ours))]


def _trimmed(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    chain: list[TracebackType] = []
    while tb is not None:
        chain.append(tb)
        tb = tb.tb_next
    kept = [t for t, keep in zip(chain, _kept([t.tb_frame.f_code.co_filename for t in chain])) if keep]
    for outer, inner in zip(kept, kept[1:]):
        outer.tb_next = inner
    return kept[0] if kept else None


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it chains to (cause, context, a group's members), each once."""
    seen: set[int] = set()
    todo, found = [exc], []
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        found.append(e)
        todo.extend(c for c in (e.__cause__, e.__context__) if c is not None)
        members = getattr(e, "exceptions", None)  # an exception group's (Python 3.11)
        if isinstance(members, tuple):
            todo.extend(m for m in members if isinstance(m, BaseException))
    return found


def without_our_frames(exc: BaseException) -> BaseException:
    """`exc`, its traceback and those of the exceptions it chains to without hooktrace's frames
    (in place), for a script's own `sys.excepthook`."""
    for e in _chain(exc):
        e.__traceback__ = _trimmed(e.__traceback__)
    return exc


@functools.lru_cache(maxsize=1)
def _wrapped_call_frame() -> Optional[traceback.FrameSummary]:
    """PyTorch's `_wrapped_call_impl` frame at its call of `_call_impl`, as a traceback shows it."""
    import inspect

    import torch

    try:
        code = torch.nn.Module._wrapped_call_impl.__code__
        lines, first = inspect.getsourcelines(code)
    except (AttributeError, OSError, TypeError):
        return None
    for i, line in enumerate(lines):
        col = line.find("self._call_impl(")
        if col >= 0:
            where: dict[str, Any] = dict(end_lineno=first + i, colno=col, end_colno=len(line.rstrip()))
            try:
                return traceback.FrameSummary(code.co_filename, first + i, code.co_name, **where)
            except TypeError:  # Python 3.10: no positions
                return traceback.FrameSummary(code.co_filename, first + i, code.co_name)
    return None


def _as_python(stack: traceback.StackSummary) -> traceback.StackSummary:
    frames = list(stack)
    shown = []
    stand_in = _wrapped_call_frame()
    for frame, keep in zip(frames, _kept([f.filename for f in frames])):
        if keep:
            shown.append(frame)
        elif frame.name == _MODULE_CALL and stand_in is not None:
            shown.append(stand_in)
    return traceback.StackSummary.from_list(shown)


def script_traceback(exc: BaseException) -> str:
    """The traceback as `python SCRIPT.py` prints it: hooktrace's frames left out, PyTorch's
    `_wrapped_call_impl` in place of the capture's module call."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    seen: set[int] = set()
    todo = [te]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = _as_python(t.stack)
        todo.extend(c for c in (t.__cause__, t.__context__) if c is not None)
        todo.extend(getattr(t, "exceptions", None) or ())
    return "".join(te.format())


def report_uncaught(exc: BaseException) -> None:
    """What the interpreter does with the exception a script did not catch: Python's own
    `sys.excepthook` prints `script_traceback`; a script's own hook is called with the traceback
    without hooktrace's frames, and one that raises is reported as Python reports it."""
    hook = getattr(sys, "excepthook", None)
    text = script_traceback(exc)
    if hook is None:
        print("sys.excepthook is missing", file=sys.stderr)
        sys.stderr.write(text)
    elif hook is sys.__excepthook__:
        sys.stderr.write(text)
    else:
        without_our_frames(exc)
        try:
            hook(type(exc), exc, exc.__traceback__)
        except BaseException as error:  # as Python: the hook's own error, then the original exception
            print("Error in sys.excepthook:", file=sys.stderr)
            sys.stderr.write(script_traceback(error))
            print("\nOriginal exception was:", file=sys.stderr)
            sys.stderr.write(text)
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
