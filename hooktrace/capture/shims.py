"""The tracing shim and the module-call wrapper: the hot path.

A shim stands in a hook dict in place of the user's hook while tracing. It records one compact
tuple per call and returns exactly what the hook returned; exceptions pass through untouched.
Event tuples (converted to `trace.Event` only at finalisation):
    (seq, step, type, phase, module_object_or_None, hook_id_or_None, thread, start_ns, duration_ns,
     returned, error)
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Optional

import torch

HOOK, ENTER, EXIT = "hook", "enter", "exit"
FORWARD, BACKWARD, RECOMPUTE, OTHER = "forward", "backward", "recompute", "other"

_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass on this thread."""
    return _graph_task_id() != -1


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Recorder:
    """Shared state of one capture that shims write into. Appends are atomic under the GIL."""

    __slots__ = ("events", "seq", "step")

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.seq = itertools.count()
        self.step = 0


def make_shim(
    rec: Recorder,
    fn: Callable[..., Any],
    hook_id: int,
    fixed_phase: Optional[str],
    module: Any,
    module_from_args: bool,
) -> Callable[..., Any]:
    """A pass-through wrapper around `fn` that records one `hook` event per call.

    fixed_phase None means "forward, or recompute when autograd's backward is running".
    module_from_args: the module is the hook's first argument (global hooks, and module hooks whose
    PyTorch calling convention passes it), else the bound `module`.
    """
    append = rec.events.append
    counter = rec.seq
    clock = time.perf_counter_ns
    ident = threading.get_ident
    graph_task = _graph_task_id

    def hooktrace_shim(*args: Any, **kwargs: Any) -> Any:
        seq = next(counter)
        phase = fixed_phase or (FORWARD if graph_task() == -1 else RECOMPUTE)
        mod = args[0] if module_from_args and args else module
        t0 = clock()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            append(
                (seq, rec.step, HOOK, phase, mod, hook_id, ident(), t0, clock() - t0, False, error_text(exc))
            )
            raise
        append(
            (seq, rec.step, HOOK, phase, mod, hook_id, ident(), t0, clock() - t0, result is not None, None)
        )
        return result

    return hooktrace_shim


def make_call_impl(
    rec: Recorder,
    original: Callable[..., Any],
    before_call: Callable[[Any], None],
    on_output: Callable[[Any, Any], None],
    global_backward: tuple[dict, dict],
) -> Callable[..., Any]:
    """Replacement for `nn.Module._call_impl`: wraps new hooks, records `enter` and `exit`.

    `on_output(module, result)` sees the output of modules with full backward hooks, so tensor
    hooks registered on it later can be named "output of <module>".
    """
    global_pre, global_post = global_backward
    append = rec.events.append
    counter = rec.seq
    clock = time.perf_counter_ns
    ident = threading.get_ident
    graph_task = _graph_task_id

    def hooktrace_call_impl(self: Any, *args: Any, **kwargs: Any) -> Any:
        before_call(self)
        seq = next(counter)
        phase = FORWARD if graph_task() == -1 else RECOMPUTE
        step = rec.step
        t0 = clock()
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            t1 = clock()
            tid = ident()
            append((seq, step, ENTER, phase, self, None, tid, t0, t1 - t0, False, None))
            append((next(counter), step, EXIT, phase, self, None, tid, t1, 0, False, error_text(exc)))
            raise
        t1 = clock()
        tid = ident()
        append((seq, step, ENTER, phase, self, None, tid, t0, t1 - t0, False, None))
        append((next(counter), step, EXIT, phase, self, None, tid, t1, 0, False, None))
        if self._backward_pre_hooks or self._backward_hooks or global_pre or global_post:
            on_output(self, result)
        return result

    return hooktrace_call_impl
