"""The tracing shim and the module-call wrapper: the hot path.

A shim stands in a hook dict in place of the user's hook while tracing. It records one compact
tuple per call and returns exactly what the hook returned; exceptions pass through untouched.
Records are converted to `trace.Event`s only at finalisation:
    hook call:   (seq, phase, module_or_None, hook_id, thread, start_ns, duration_ns, outcome)
                 outcome: True/False (returned a value or not), or the error text if it raised
    module call: (enter_seq, exit_seq, phase, module, thread, start_ns, end_ns, error_or_None)
                 one record for the `enter` and the `exit` event
The step of a record is not stored: `Recorder.step_starts` holds the first seq of each step.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Optional

import torch

FORWARD, BACKWARD, RECOMPUTE, OTHER = "forward", "backward", "recompute", "other"

_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass on this thread."""
    return _graph_task_id() != -1


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Recorder:
    """Shared state of one capture that shims write into. Appends are atomic under the GIL."""

    __slots__ = ("hooks", "calls", "seq", "step_starts", "threads")

    def __init__(self) -> None:
        self.hooks: list[tuple] = []
        self.calls: list[tuple] = []
        self.seq = itertools.count()
        self.step_starts: list[int] = []  # seq at which step 1, 2, ... began
        self.threads: dict[int, int] = {}  # one int object per thread ident, shared by its records

    def mark_step(self) -> None:
        self.step_starts.append(next(self.seq))

    @property
    def steps(self) -> int:
        return len(self.step_starts) + 1

    def __len__(self) -> int:
        return len(self.hooks) + 2 * len(self.calls)


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
    append = rec.hooks.append
    counter = rec.seq
    clock = time.perf_counter_ns
    ident = threading.get_ident
    thread = rec.threads.setdefault
    graph_task = _graph_task_id

    def hooktrace_shim(*args: Any, **kwargs: Any) -> Any:
        seq = next(counter)
        phase = fixed_phase or (FORWARD if graph_task() == -1 else RECOMPUTE)
        mod = args[0] if module_from_args and args else module
        t0 = clock()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            t1 = clock()
            tid = ident()
            append((seq, phase, mod, hook_id, thread(tid, tid), t0, t1 - t0, error_text(exc)))
            raise
        t1 = clock()
        tid = ident()
        append((seq, phase, mod, hook_id, thread(tid, tid), t0, t1 - t0, result is not None))
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
    append = rec.calls.append
    counter = rec.seq
    clock = time.perf_counter_ns
    ident = threading.get_ident
    thread = rec.threads.setdefault
    graph_task = _graph_task_id

    def hooktrace_call_impl(self: Any, *args: Any, **kwargs: Any) -> Any:
        before_call(self)
        seq = next(counter)
        phase = FORWARD if graph_task() == -1 else RECOMPUTE
        t0 = clock()
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            t1 = clock()
            tid = ident()
            append((seq, next(counter), phase, self, thread(tid, tid), t0, t1, error_text(exc)))
            raise
        t1 = clock()
        tid = ident()
        append((seq, next(counter), phase, self, thread(tid, tid), t0, t1, None))
        if self._backward_pre_hooks or self._backward_hooks or global_pre or global_post:
            on_output(self, result)
        return result

    return hooktrace_call_impl
