"""The tracing shim and the module-call wrapper: the hot path.

A shim stands in a hook dict in place of the user's hook while tracing. It records one compact
tuple per call and returns exactly what the hook returned; exceptions pass through untouched.
Records are converted to `trace.Event`s only at finalisation:
    hook call:   (seq, hook_id, thread, start_ns, end_ns, outcome, id_of_module_or_None)
                 outcome: True/False (returned a value or not), or the error text if it raised
    module call: (enter_seq, exit_seq, phase, id_of_module, thread, start_ns, end_ns, error_or_None)
                 one record for the `enter` and the `exit` event
Records hold only ints, strings, bools and None, so the garbage collector untracks them the first
time it sees them: a long capture does not make every later collection walk millions of records.
The modules themselves are kept alive (their ids stay unique) in `Recorder.modules`, and each id
is one shared int object (`Recorder.module_ids`), not a new 32-byte int per record.
Neither the step nor a hook's phase is stored: `Recorder.step_starts` holds the first seq of each
step, and a hook's phase follows from its kind (backward kinds: `backward`; forward kinds: the phase
of the module call they ran in, which the module-call record has; the rest: `other`).

What a shim call costs, in order: one counter step, two clock reads, one thread ident, one tuple
appended to a list. The hook kinds PyTorch calls with 1-4 positional arguments (forward, backward
and tensor hooks) get a shim with positional parameters, which saves packing `*args, **kwargs` per
call, and which tests the argument count PyTorch uses for that kind first.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Optional

import torch

FORWARD, BACKWARD, RECOMPUTE, OTHER = "forward", "backward", "recompute", "other"

# Kinds PyTorch calls with one to four positional arguments (module first, except tensor hooks), and
# how many it passes without keyword flags (`with_kwargs` hooks get one more).
ARITY = {
    "grad": 1,
    "post_accumulate_grad": 1,
    "forward_pre": 2,
    "backward_pre": 2,
    "forward": 3,
    "backward": 3,
    "backward_legacy": 3,
}
POSITIONAL_KINDS = frozenset(ARITY)

_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass on this thread."""
    return _graph_task_id() != -1


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# The shim's body. What every shim of one capture shares (`counter`, `clock`, `ident`, `main`,
# `append`, `error_text`, `_N`) are globals of a namespace made per Recorder; a shim's own closure
# holds only `fn`, `hook_id`, `module_id`, `from_args` (fewer objects per wrapped hook).
_SHIM_SOURCE = """
def factory(fn, hook_id, module_id, from_args):
    def hooktrace_shim({params}):
        seq = next(counter)
        t0 = clock()
        try:
{call}
        except BaseException as exc:
            t1 = clock()
            tid = ident()
            if tid == main:
                tid = main
            append((seq, hook_id, tid, t0, t1, error_text(exc), {first} if from_args else module_id))
            raise
        t1 = clock()
        tid = ident()
        if tid == main:
            tid = main
        append((seq, hook_id, tid, t0, t1, result is not None, {first} if from_args else module_id))
        return result
    return hooktrace_shim
"""
# The shim of a positional kind takes any number of arguments and passes exactly those on; the
# count PyTorch uses for its kind is tested first.
_POSITIONAL_CALL = """\
            if {usual}:
                result = fn({usual_args})
            elif more:
                result = fn(a, b, c, d, *more)
            elif d is not _N:
                result = fn(a, b, c, d)
            elif c is not _N:
                result = fn(a, b, c)
            elif b is not _N:
                result = fn(a, b)
            else:
                result = fn(a)"""
_USUAL = {
    1: ("b is _N", "a"),
    2: ("c is _N and b is not _N", "a, b"),
    3: ("d is _N and c is not _N", "a, b, c"),
    4: ("not more and d is not _N", "a, b, c, d"),
}
_GENERIC_CALL = "            result = fn(*args, **kwargs)"

# fixed templates compiled once, as namedtuple and dataclasses do
_POSITIONAL_CODES = {
    n: compile(
        _SHIM_SOURCE.format(
            params="a, b=_N, c=_N, d=_N, *more",
            call=_POSITIONAL_CALL.format(usual=test, usual_args=args),
            first="(module_ids.get(i := id(a)) or i)",
        ),
        __file__,
        "exec",
    )
    for n, (test, args) in _USUAL.items()
}
_GENERIC_CODE = compile(
    _SHIM_SOURCE.format(
        params="*args, **kwargs",
        call=_GENERIC_CALL,
        first="((module_ids.get(i := id(args[0])) or i) if args else None)",
    ),
    __file__,
    "exec",
)
_MISSING = object()


class Recorder:
    """Shared state of one capture that shims write into. Appends are atomic under the GIL."""

    __slots__ = ("hooks", "calls", "modules", "module_ids", "seq", "step_starts", "main_thread", "_factories")

    def __init__(self) -> None:
        self.hooks: list[tuple] = []
        self.calls: list[tuple] = []
        self.modules: list[Any] = []  # every module called: records name them by id
        self.module_ids: dict[int, int] = {}  # id -> that same int, one object per module
        self.seq = itertools.count()
        self.step_starts: list[int] = []  # seq at which step 1, 2, ... began
        # Records of the thread that started the capture share this one int object (an ident is a
        # fresh 32-byte int per call); other threads' idents are stored as they come.
        self.main_thread = threading.get_ident()
        shared = {
            "counter": self.seq,
            "clock": time.perf_counter_ns,
            "ident": threading.get_ident,
            "main": self.main_thread,
            "append": self.hooks.append,
            "module_ids": self.module_ids,
            "error_text": error_text,
            "_N": _MISSING,
        }
        self._factories: dict[Optional[int], Callable[..., Any]] = {}  # by arity; None: generic
        for arity, code in (*_POSITIONAL_CODES.items(), (None, _GENERIC_CODE)):
            namespace = dict(shared)
            exec(code, namespace)  # noqa: S102 - defines `factory` over this capture's shared state
            self._factories[arity] = namespace["factory"]

    def module_key(self, module: Any) -> int:
        """The int that records name `module` by (its id, one shared object); keeps it alive."""
        key = self.module_ids.get(id(module))
        if key is None:
            key = self.module_ids[id(module)] = id(module)
            self.modules.append(module)
        return key

    def mark_step(self) -> None:
        self.step_starts.append(next(self.seq))

    @property
    def steps(self) -> int:
        return len(self.step_starts) + 1

    def __len__(self) -> int:
        return len(self.hooks) + 2 * len(self.calls)


def make_shim(
    rec: Recorder, fn: Callable[..., Any], hook_id: int, kind: str, module: Any, module_from_args: bool
) -> Callable[..., Any]:
    """A pass-through wrapper around `fn` that records one `hook` event per call.

    module_from_args: the module is the hook's first argument (global hooks, and module hooks whose
    PyTorch calling convention passes it), else the bound `module`.
    """
    factory = rec._factories[ARITY.get(kind)]
    return factory(fn, hook_id, None if module is None else id(module), module_from_args)


SHIM_CODES = frozenset(factory(None, -1, None, False).__code__ for factory in Recorder()._factories.values())


def shim_call(frame: Any) -> Optional[tuple[int, tuple, Any]]:
    """(hook id, arguments, module) of a shim's frame, or None if the frame is not a shim's.

    The module is the first argument for hooks PyTorch passes it to, else None (the hook's owner).
    """
    if frame.f_code not in SHIM_CODES:
        return None
    local = frame.f_locals
    if "args" in local:
        args = tuple(local["args"])
    else:
        args = tuple(local[name] for name in "abcd" if local[name] is not _MISSING) + tuple(local["more"])
    module = (args[0] if args else None) if local["from_args"] else None
    return local["hook_id"], args, module


def make_call_impl(
    rec: Recorder,
    original: Callable[..., Any],
    before_call: Callable[[Any], None],
    on_output: Callable[[Any, Any], None],
    global_dicts: tuple[dict, dict, dict, dict],
    known: set,
) -> Callable[..., Any]:
    """Replacement for `nn.Module._call_impl`: wraps new hooks, records `enter` and `exit`.

    `before_call(module)` wraps hooks that appeared in the module's or the global call dicts
    (`global_dicts`: forward pre, forward, backward pre, backward); it runs only when one of them
    holds something that is not in `known` (the capture's module and global shims), a C-level set
    check per non-empty dict. `on_output(module, result)` sees the output of modules with full
    backward hooks, so tensor hooks registered on it later can be named "output of <module>".
    """
    g_fwd_pre, g_fwd, g_bwd_pre, g_bwd = global_dicts
    append = rec.calls.append
    modules = rec.modules
    module_ids = rec.module_ids
    counter = rec.seq
    clock = time.perf_counter_ns
    ident = threading.get_ident
    main = rec.main_thread
    graph_task = _graph_task_id
    wrapped = known.issuperset

    def hooktrace_call_impl(self: Any, *args: Any, **kwargs: Any) -> Any:
        md = self.__dict__
        fw_pre = md.get("_forward_pre_hooks")
        fw = md.get("_forward_hooks")
        bw_pre = md.get("_backward_pre_hooks")
        bw = md.get("_backward_hooks")
        try:
            new_hooks = (
                (fw_pre and not wrapped(fw_pre.values()))
                or (fw and not wrapped(fw.values()))
                or (bw_pre and not wrapped(bw_pre.values()))
                or (bw and not wrapped(bw.values()))
                or (g_fwd_pre and not wrapped(g_fwd_pre.values()))
                or (g_fwd and not wrapped(g_fwd.values()))
                or (g_bwd_pre and not wrapped(g_bwd_pre.values()))
                or (g_bwd and not wrapped(g_bwd.values()))
            )
        except Exception:  # a hook object that cannot be hashed or compared: the slow look decides
            new_hooks = True
        if new_hooks:
            before_call(self)
        key = module_ids.get(id(self))  # rec.module_key(self), inlined on the hot path
        if key is None:
            key = module_ids[id(self)] = id(self)
            modules.append(self)
        seq = next(counter)
        phase = FORWARD if graph_task() == -1 else RECOMPUTE
        t0 = clock()
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            t1 = clock()
            tid = ident()
            if tid == main:
                tid = main
            append((seq, next(counter), phase, key, tid, t0, t1, error_text(exc)))
            raise
        t1 = clock()
        tid = ident()
        if tid == main:
            tid = main
        append((seq, next(counter), phase, key, tid, t0, t1, None))
        if bw_pre or bw or g_bwd_pre or g_bwd:  # as `_call_impl` read them before forward
            on_output(self, result)
        return result

    return hooktrace_call_impl
