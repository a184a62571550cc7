"""The tracing shim: the hot path (the module-call wrapper is capture/modulecall.py).

A shim is what PyTorch calls in place of the user's hook while tracing: from the views of module,
global and optimizer hook dicts (capture/views.py), or from a tensor's or autograd node's own dict,
where it stands in place. It records one compact tuple per call and returns exactly what the hook
returned; exceptions pass through untouched.
Records are converted to `trace.Event`s only at finalisation:
    hook call:   (seq, hook_id, thread, start_ns, end_ns, outcome, id_of_module_or_None)
                 outcome: True/False (returned something other than what it was given, see SAME),
                 or the error text if it raised
    module call: (enter_seq, exit_seq, phase, id_of_module, thread, start_ns, end_ns, error_or_None)
                 one record for the `enter` and the `exit` event
Records hold only ints, strings, bools and None, so the garbage collector untracks them the first
time it sees them: a long capture does not make every later collection walk millions of records.
Records name a module by its key (`Recorder.key`): its id, one shared int object per module
(`Recorder.module_ids`), not a new 32-byte int per record. Modules are not kept alive (weak-reference
trackers and `del module` see them die inside the block, as untraced): when one dies its id may be
reused, so a later object at that id gets a key no earlier object had.
Neither the step nor a hook's phase is stored: `Recorder.step_starts` holds the first seq of each
step, and a hook's phase follows from its kind (backward kinds: `backward`; forward kinds: the phase
of the module call they ran in, which the module-call record has; the rest: `other`).

What a shim call costs, in order: one counter step, two clock reads, one thread ident, one tuple
appended to a list. The hook kinds PyTorch calls with 1-4 positional arguments (forward, backward
and tensor hooks) get a shim with positional parameters, which saves packing `*args, **kwargs` per
call, and which tests the argument count PyTorch uses for that kind first.
"""

from __future__ import annotations

import functools
import itertools
import linecache
import threading
import time
import weakref
from typing import Any, Callable, Optional, Protocol

import torch

from .. import kinds
from . import shapes as describe
from .ranges import ranged
from .returned import RETURN_IGNORED as RETURN_IGNORED  # noqa: F401 - where tests import it from
from .returned import SAME, _ignored, _same_first
from .views import _is_compiling

# Keys of objects given one after another object with the same id died: above every id.
KEY_STEP = 1 << 64
Who = tuple[Optional[int], str]  # (key, type name) of a module a record names: see Recorder.who
# thread ident -> depth of `optimizer.step()` calls open on it (capture/optim.py marks them)
STEPPING: dict[int, int] = {}

# Kinds PyTorch calls with one to four positional arguments (module first, except tensor hooks), and
# how many it passes without keyword flags (`with_kwargs` hooks get one more).
ARITY = {name: k.args for name, k in kinds.TABLE.items() if k.args is not None}
POSITIONAL_KINDS = frozenset(ARITY)

_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass on this thread."""
    return _graph_task_id() != -1


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# The shim's body. What every shim of one capture shares (`counter`, `clock`, `ident`, `main`,
# `append`, `error_text`, `_N`) are globals of a namespace made per Recorder; a shim's own closure
# holds only `fn`, `hook_id`, `module_id`, `from_args`, `same`, `kind` (few objects per wrapped hook);
# `profiler._is_profiler_enabled` is read once per call: a hook runs inside a range only while it records.
_SHIM_SOURCE = """
def factory(fn, hook_id, module_id, from_args, same, kind):
    def hooktrace_shim({params}):
        if compiling():  # Dynamo inlines this shim (compiled autograd): the hook, as plain code
            call = fn
{call}
            return result
        seq = next(counter)
        call = ranged(fn, kind) if profiler._is_profiler_enabled else fn
{received}        t0 = clock()
        try:
{call}
        except BaseException as exc:
            t1 = clock()
            tid = ident()
            if tid == main:
                tid = main
            append((seq, hook_id, tid, t0, t1, error_text(exc), {first} if from_args else module_id))
{raised}            raise
        t1 = clock()
        tid = ident()
        if tid == main:
            tid = main
        append((seq, hook_id, tid, t0, t1, result is not None and not same(result, {given}), {first} if from_args else module_id))
{returned}        return result
    return hooktrace_shim
"""
# The shim of a positional kind takes any number of arguments and passes exactly those on; the
# count PyTorch uses for its kind is tested first.
_POSITIONAL_CALL = """\
            if {usual}:
                result = call({usual_args})
            elif more:
                result = call(a, b, c, d, *more)
            elif d is not _N:
                result = call(a, b, c, d)
            elif c is not _N:
                result = call(a, b, c)
            elif b is not _N:
                result = call(a, b)
            else:
                result = call(a)"""
_USUAL = {
    1: ("b is _N", "a"),
    2: ("c is _N and b is not _N", "a, b"),
    3: ("d is _N and c is not _N", "a, b, c"),
    4: ("not more and d is not _N", "a, b, c, d"),
}
_GENERIC_CALL = "            result = call(*args, **kwargs)"


# Fixed templates compiled once, as namedtuple and dataclasses do, each under a file name of its own
# whose text `linecache` holds: a traceback through a user's failing hook shows the shim's real lines.
def _compile(source: str, filename: str) -> Any:
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec")


# With `--shapes` (Recorder(shapes=True)) the shims are compiled with three more lines: what the hook
# received, described before its clock starts, and what it returned, after the clock stops; one
# (seq, received, returned) tuple per call goes to `Recorder.shapes` (capture/shapes.py describes).
# Without it, the shims are the same code as ever: no test per call.
_SHAPES_LINES = {
    "received": "        received = {args}\n",
    "raised": "            note((seq, received, None))\n",
    "returned": "        note((seq, received, None if result is None else describe_returned(result)))\n",
}


def _variants(name: str, **parts: str) -> dict[bool, Any]:
    """The shim code without and with the shapes lines (`args`: how the received arguments are read)."""
    args = parts.pop("args")
    lines = {key: line.format(args=args) for key, line in _SHAPES_LINES.items()}
    return {
        shapes: _compile(
            _SHIM_SOURCE.format(**parts, **(lines if shapes else dict.fromkeys(lines, ""))),
            f"<hooktrace-shim{'-shapes' if shapes else ''}{name}>",
        )
        for shapes in (False, True)
    }


_POSITIONAL_CODES = {
    n: _variants(
        f"-{n}",
        params="a, b=_N, c=_N, d=_N, *more",
        call=_POSITIONAL_CALL.format(usual=test, usual_args=args),
        first="(module_ids.get(i := id(a)) or i)",
        given="a, b, c, d",
        args="describe_positional(kind, a, b, c, d, more)",
    )
    for n, (test, args) in _USUAL.items()
}
_GENERIC_CODE = _variants(
    "",
    params="*args, **kwargs",
    call=_GENERIC_CALL,
    first="((module_ids.get(i := id(args[0])) or i) if args else None)",
    given="*args",
    args="describe_call(kind, args, kwargs)",
)
_MISSING = describe.NOT_GIVEN


def constants() -> dict[str, Any]:
    """The names every shim reads that are the same for every capture."""
    return {
        "clock": time.perf_counter_ns,
        "ident": threading.get_ident,
        "error_text": error_text,
        "_N": _MISSING,
        "profiler": torch.autograd.profiler,
        "ranged": ranged,
        "describe_call": describe.call,
        "describe_positional": describe.positional,
        "describe_returned": describe.returned,
        "compiling": _is_compiling,
    }


class Recorder:
    """Shared state of one capture that shims write into. Appends are atomic under the GIL."""

    __slots__ = (
        "hooks",
        "shapes",
        "calls",
        "compiled",
        "in_backward",
        "modules",
        "module_ids",
        "types",
        "wrappers",
        "ids",
        "retired",
        "seq",
        "step_starts",
        "main_thread",
        "_factories",
    )

    def __init__(self, shapes: bool = False) -> None:
        self.hooks: list[tuple] = []
        # (seq, received, returned or None) per hook call, with shapes=True (capture/shapes.py)
        self.shapes: Optional[list[tuple]] = [] if shapes else None
        self.calls: list[tuple] = []
        self.compiled: list[int] = []  # enter seqs of module calls that ran compiled (torch.compile)
        # seqs of hook calls of a kind whose phase is the enclosing module call's that ran while autograd's
        # engine ran (FSDP2's all-gather in backward, where no module call is open)
        self.in_backward: list[int] = []
        self.modules: list[Any] = []  # a weak reference to every object given a key (or the object)
        self.ids: dict[int, int] = {}  # id of a live object -> its key
        self.module_ids: dict[int, int] = {}  # the same, for the modules the call wrapper looks up
        self.retired: set[int] = set()  # keys of objects that died: not given again
        self.types: dict[int, str] = {}  # key -> its object's class name (names a module gone by the end)
        self.wrappers: dict[int, int] = {}  # id of a torch.compile(m) wrapper whose call was seen -> m's key
        self.seq = itertools.count()
        self.step_starts: list[int] = []  # seq at which step 1, 2, ... began
        # Records of the thread that started the capture share this one int object (an ident is a
        # fresh 32-byte int per call); other threads' idents are stored as they come.
        self.main_thread = threading.get_ident()
        shared = {**constants(), **self.bindings()}
        self._factories: dict[Optional[int], Callable[..., Any]] = {}  # by arity; None: generic
        for arity, codes in (*_POSITIONAL_CODES.items(), (None, _GENERIC_CODE)):
            code = codes[shapes]
            namespace = dict(shared)
            exec(code, namespace)  # noqa: S102 - defines `factory` over this capture's shared state
            # taken out, so that the namespace (its globals) and it make no cycle: the records
            # (`append`) are freed with the trace, not at a later GC pass
            self._factories[arity] = namespace.pop("factory")

    def bindings(self) -> dict[str, Any]:
        """The names a shim reads that are this capture's: where its records go."""
        return {
            "counter": self.seq,
            "main": self.main_thread,
            "append": self.hooks.append,
            "module_ids": self.module_ids,
            "note": self.shapes.append if self.shapes is not None else None,
        }

    def key(self, obj: Any) -> int:
        """The int that records name `obj` by, without keeping it alive: its id, or, when an object
        that died inside the block had that id, a number above every id (KEY_STEP * n + id)."""
        i = id(obj)
        key = self.ids.get(i)
        if key is None:
            key = i
            while key in self.retired:
                key += KEY_STEP
            self.ids[i] = key
            self.types[key] = type(obj).__name__
            try:
                self.modules.append(weakref.ref(obj, functools.partial(self._died, i, key)))
            except TypeError:  # no weak reference: kept, so its id stays its own
                self.modules.append(obj)
        return key

    def _died(self, i: int, key: int, _ref: Any) -> None:
        if self.ids.get(i) == key:
            del self.ids[i]
            self.module_ids.pop(i, None)
        self.retired.add(key)

    def module_key(self, module: Any) -> int:
        """The key of `module` as its calls are recorded (one shared int object per module).

        `torch.compile(m)`'s wrapper (an OptimizedModule) is named as `m`, and its own id is never
        cached: its calls take the module-call wrapper's first-call path, which marks them compiled.
        """
        key = self.module_ids.get(id(module))
        if key is None:
            children = getattr(module, "__dict__", {}).get("_modules")
            if children and "_orig_mod" in children:
                key = self.wrappers[id(module)] = self.module_key(children["_orig_mod"])
                return key
            key = self.module_ids[id(module)] = self.key(module)
        return key

    def who(self, obj: Any) -> Who:
        """What names `obj` once it is gone: (its key, its type's name); (None, "NoneType") for None."""
        return (None if obj is None else self.key(obj), type(obj).__name__)

    def mark_step(self) -> None:
        self.step_starts.append(next(self.seq))

    @property
    def steps(self) -> int:
        return len(self.step_starts) + 1


class Shim(Protocol):
    """A recording shim: a function whose `__wrapped__` is the hook it stands for (functools' word);
    a state-dict hook's shim carries the hook's `_from_public_api` mark, which `state_dict()` reads."""

    __wrapped__: Callable[..., Any]
    _from_public_api: bool

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


def make_shim(
    rec: Recorder, fn: Callable[..., Any], hook_id: int, kind: str, module: Any, module_from_args: bool
) -> Shim:
    """A pass-through wrapper around `fn` that records one `hook` event per call.

    module_from_args: the module is the hook's first argument (global hooks, and module hooks whose
    PyTorch calling convention passes it), else the bound `module`.
    """
    factory = rec._factories[ARITY.get(kind)]
    return factory(
        fn,
        hook_id,
        None if module is None else rec.module_key(module),
        module_from_args,
        SAME.get(kind, _same_first),
        kind,
    )


SHIM_CODES = frozenset(
    factory(None, -1, None, False, _ignored, "").__code__
    for shapes in (False, True)
    for factory in Recorder(shapes)._factories.values()
)


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
