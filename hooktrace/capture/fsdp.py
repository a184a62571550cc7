"""FSDP's communication hooks: kept on FSDP's own state (no hook dict, no handle), called by FSDP.

- FSDP2 (`fully_shard`): `set_all_reduce_hook` (kind `fsdp_all_reduce`), `set_custom_all_gather`
  (`fsdp_all_gather`) and `set_custom_reduce_scatter` (`fsdp_reduce_scatter`) set
  `_all_reduce_hook`, `_all_gather_comm` and `_reduce_scatter_comm` on the module's param groups.
  `FSDPParamGroup` calls them through `foreach_all_gather` / `foreach_reduce`, names it reads from
  its own module at each call (PyTorch's own tests patch them there): for the block they are
  wrappers that pass the same arguments on, the hook and a custom comm handed over as recording
  stand-ins (a comm's `allocate` and every other attribute are the comm's own). The event's module
  is the FSDP module of the param group that called (the caller's `self`). FSDP's default comms are
  no hooks. On a one-rank group FSDP2 runs no all-gather or reduce-scatter collective (it copies;
  torch 2.9 still calls the reduce-scatter there): a custom one is then never called (its
  `allocate` is, which is no event). The custom collectives are new in torch 2.9.
- FSDP1 (`FullyShardedDataParallel.register_comm_hook`, kind `fsdp_comm`): every FSDP instance under
  the root holds the hook as `_comm_hook`, and `_reduce_grad` / `_reduce_grad_no_shard` call
  `state._comm_hook(...)`. For the block those two are copies made from their source with that one
  call read through `_hooktrace_fsdp_comm(state)` (a recording stand-in while a capture is open, the
  hook itself otherwise); the copies run on the module's own globals. Source that does not match
  leaves FSDP1's hooks untraced (no copy is installed).

What FSDP holds is never replaced: the param groups' attributes and `_comm_hook` are the user's own
objects inside the block too (`state._comm_hook in LOW_PRECISION_HOOKS` still holds). The setters
are watched for the call site; hooks set before the block are found on the model's FSDP modules.
The patches are made when the capture starts if FSDP is imported, else once it is and a module
registers a hook (`fully_shard`, `FullyShardedDataParallel` do) or the capture meets a model.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import threading
import time
import types
import weakref
from itertools import compress, repeat
from typing import Any, Callable, Iterable, Optional

import torch

from ..kinds import MODULE, K
from . import ranges, shims
from . import shapes as describe
from .ledger import Ledger
from .tensors import weak
from .views import _is_compiling

_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
_FULLY_SHARD = "torch.distributed.fsdp._fully_shard._fully_shard"
_COLLECTIVES = "torch.distributed.fsdp._fully_shard._fsdp_collectives"  # FSDP's own comms live here
_RUNTIME = "torch.distributed.fsdp._runtime_utils"
_FSDP1 = "torch.distributed.fsdp.fully_sharded_data_parallel"
_COMM_NAME = "_hooktrace_fsdp_comm"
_FSDP1_CALL = re.compile(r"\bstate\._comm_hook\(")
_FSDP1_CALLERS = ("_reduce_grad", "_reduce_grad_no_shard")
# (FSDPModule setter, the FSDPParamGroup attribute it sets, the kind)
_FSDP2 = (
    ("set_all_reduce_hook", "_all_reduce_hook", K.fsdp_all_reduce),
    ("set_custom_all_gather", "_all_gather_comm", K.fsdp_all_gather),
    ("set_custom_reduce_scatter", "_reduce_scatter_comm", K.fsdp_reduce_scatter),
)


def _is_default(comm: Any) -> bool:
    """No hook: none set, or one of FSDP's own comms."""
    return comm is None or type(comm).__module__ == _COLLECTIVES


def _group_module(frame: Optional[types.FrameType]) -> Any:
    """The FSDP module of the `FSDPParamGroup` whose method is running in `frame`, or None."""
    return _module_of(frame.f_locals.get("self") if frame is not None else None)


def _module_of(group: Any) -> Any:
    """The (first) module of an `FSDPParamGroup`, or None."""
    modules = getattr(group, "modules", None)
    module = modules[0] if isinstance(modules, (tuple, list)) and modules else None
    return module if isinstance(module, torch.nn.Module) else None


def _param_groups(module: Any) -> list[Any]:
    """An FSDP2 module's param groups (one attribute before torch 2.10, a list after)."""
    try:
        state = module._get_fsdp_state()
    except Exception:  # noqa: BLE001 - not fully sharded after all
        return []
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return list(groups)


class _CommStandIn:
    """What FSDP2's collective gets for the block instead of a custom comm: its calls recorded, every
    other attribute (`allocate`) the comm's own."""

    __slots__ = ("_comm", "_call")

    def __init__(self, comm: Any, call: Callable[..., Any]) -> None:
        self._comm = comm
        self._call = call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


@functools.cache
def _fsdp1_copies(runtime: Any) -> Optional[dict[str, types.FunctionType]]:
    """Copies of FSDP1's two comm-hook callers with `state._comm_hook(` read through `_COMM_NAME`,
    on the module's own globals; None when the source does not have that call once in each."""
    out = {}
    for name in _FSDP1_CALLERS:
        original: Any = getattr(runtime, name, None)
        try:
            lines, first = inspect.getsourcelines(original)
        except (OSError, TypeError):
            return None
        source, n = _FSDP1_CALL.subn(f"{_COMM_NAME}(state)(", "".join(lines))
        if n != 1:
            return None
        scratch = dict(vars(runtime))
        exec(compile("\n" * (first - 1) + source, runtime.__file__, "exec"), scratch)  # noqa: S102
        made = scratch[name]
        copy = types.FunctionType(made.__code__, vars(runtime), name, made.__defaults__, made.__closure__)
        copy.__dict__.update(original.__dict__)
        copy.__qualname__, copy.__doc__ = original.__qualname__, original.__doc__
        copy.__module__ = runtime.__name__
        copy.__kwdefaults__ = made.__kwdefaults__
        out[name] = copy
    return out


class Tracer:
    """FSDP's communication hooks for one capture: records in its `records.HookBook`, events in the
    book's recorder. site_of(frame): the registration site of a call from `frame`; lock: the
    capture's lock; active(): the block is open."""

    def __init__(
        self, book: Any, site_of: Callable[[Any], Any], lock: Any, active: Callable[[], bool]
    ) -> None:
        self._book = book
        self._site_of = site_of
        self._lock = lock
        self._active = active
        self._ledger: Optional[Ledger] = None
        self._patched: set[str] = set()
        self.pending = True  # some of FSDP is not patched yet
        # (kind, module key, id(hook)) -> (hook, its trace id, a weak reference to the module or None)
        self._ids: dict[tuple[str, Any, int], tuple[Any, int, Any]] = {}

    # -- hooks and their calls --------------------------------------------------------------
    def hook_id(self, kind: str, module: Any, hook: Any, frame: Optional[types.FrameType] = None) -> int:
        """The trace id of `hook` that FSDP `module` holds (registered from `frame`, when known)."""
        key = (kind, None if module is None else self._book.rec.key(module), id(hook))
        site = self._site_of(frame) if frame is not None else self._site_before(kind, module, hook)
        with self._lock:
            entry = self._ids.get(key)
            if entry is not None and entry[0] is hook and entry[1] in self._book.records:
                return entry[1]
            tid = self._book.api_record(hook, kind, module, MODULE, site)
            self._ids[key] = (hook, tid, None if module is None else weak(module))
            return tid

    def _site_before(self, kind: str, module: Any, hook: Any) -> Any:
        """Where `hook` was set for `module` before the block, if a registration watch saw it."""
        known = self._book.fsdp_sites.get((kind, id(module), id(hook)))
        if known is not None and known[0]() is hook and known[1]() is module:
            return known[2]
        return None

    def recorded(self, hook: Any, kind: str, module: Any) -> Callable[..., Any]:
        """`hook`, calling which records one event of `kind` on `module` (a stand-in for one call of FSDP's)."""
        tid = self.hook_id(kind, module, hook)
        rec = self._book.rec
        module_id = None if module is None else rec.module_key(module)
        marks = rec.in_backward if kind == K.fsdp_all_gather else None  # in forward and in backward

        def call(*args: Any, **kwargs: Any) -> Any:
            seq = next(rec.seq)
            if marks is not None and shims.in_backward():
                marks.append(seq)
            received = describe.call(kind, args, kwargs) if rec.shapes is not None else None
            run = ranges.ranged(hook, kind) if torch.autograd.profiler._is_profiler_enabled else hook
            t0 = time.perf_counter_ns()
            try:
                result = run(*args, **kwargs)
            except BaseException as exc:
                t1 = time.perf_counter_ns()
                rec.hooks.append((seq, tid, threading.get_ident(), t0, t1, shims.error_text(exc), module_id))
                if rec.shapes is not None:
                    rec.shapes.append((seq, received, None))
                raise
            rec.hooks.append((seq, tid, threading.get_ident(), t0, time.perf_counter_ns(), False, module_id))
            if rec.shapes is not None:
                rec.shapes.append((seq, received, describe.returned(result) if result is not None else None))
            return result

        return call

    def _tracing(self) -> bool:
        return self._active() and not _is_compiling()

    def held(self, modules: Iterable[Any]) -> None:
        """Record the hooks the FSDP modules among `modules` hold (set before the block)."""
        self.patch()
        fsdp2 = sys.modules.get(_FULLY_SHARD)
        fsdp1 = sys.modules.get(_FSDP1)
        modules = [*modules]
        if not modules or (fsdp2 is None and fsdp1 is None):
            return
        classes = (
            *([fsdp2.FSDPModule] if fsdp2 else ()),
            *([fsdp1.FullyShardedDataParallel] if fsdp1 else ()),
        )
        # only the FSDP ones are looked at in Python (isinstance over all of them in C)
        for module in compress(modules, map(isinstance, modules, repeat(classes))):
            if fsdp2 is not None and isinstance(module, fsdp2.FSDPModule):
                for group in _param_groups(module):
                    for _setter, attr, kind in _FSDP2:
                        hook = getattr(group, attr, None)
                        if not _is_default(hook):
                            self.hook_id(kind, _module_of(group) or module, hook)
            elif fsdp1 is not None and isinstance(module, fsdp1.FullyShardedDataParallel):
                hook = getattr(module, "_comm_hook", None)
                if hook is not None:
                    self.hook_id(K.fsdp_comm, module, hook)

    def end(self) -> None:
        """The block ends: the hooks FSDP still holds are registered hooks (`hooktrace hooks` lists
        them, `book.api_held`); nothing of them is kept after."""
        for (kind, _key, _i), (hook, tid, ref) in list(self._ids.items()):
            module = ref() if ref is not None else None
            if module is None:
                continue
            if kind == K.fsdp_comm:
                held = getattr(module, "_comm_hook", None) is hook
            else:
                attr = next(a for _s, a, k in _FSDP2 if k == kind)
                held = any(getattr(g, attr, None) is hook for g in _param_groups(module))
            if held:
                self._book.api_held.append(tid)
        self._ids.clear()

    # -- patches ----------------------------------------------------------------------------
    def install(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.patch()

    def patch(self) -> None:
        """Patch what of FSDP is imported now and not patched yet (once per capture)."""
        ledger = self._ledger
        if ledger is None or not self._active():
            return
        group, fully = sys.modules.get(_GROUP), sys.modules.get(_FULLY_SHARD)
        if "fsdp2" not in self._patched and group is not None and fully is not None:
            self._patched.add("fsdp2")
            for name, comm in (
                ("foreach_all_gather", "all_gather_comm"),
                ("foreach_reduce", "reduce_scatter_comm"),
            ):
                ledger.set(group, name, self._foreach(getattr(group, name), comm))
            _watch_fsdp2_setters(ledger, fully.FSDPModule, self._set)
        runtime, fsdp1 = sys.modules.get(_RUNTIME), sys.modules.get(_FSDP1)
        if "fsdp1" not in self._patched and runtime is not None and fsdp1 is not None:
            self._patched.add("fsdp1")
            copies = _fsdp1_copies(runtime)
            cls = fsdp1.FullyShardedDataParallel
            if copies is not None and "register_comm_hook" in vars(cls):
                ledger.set(runtime, _COMM_NAME, self._fsdp1_comm)
                for name, copy in copies.items():
                    ledger.set(runtime, name, copy)
                _watch_fsdp1_register(ledger, cls, self._set)
        self.pending = len(self._patched) < 2

    def _foreach(self, original: Callable[..., Any], comm_name: str) -> Callable[..., Any]:
        """FSDP2's `foreach_all_gather` / `foreach_reduce`, with the custom comm named `comm_name` (and
        `all_reduce_hook`, where it is an argument) passed on as recording stand-ins."""
        signature = _signature(original)
        kind = K.fsdp_all_gather if comm_name == "all_gather_comm" else K.fsdp_reduce_scatter

        @functools.wraps(original)
        def foreach(*args: Any, **kwargs: Any) -> Any:
            if not self._tracing():
                return original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            given = bound.arguments
            comm, hook = given.get(comm_name), given.get("all_reduce_hook")
            if _is_default(comm) and hook is None:
                return original(*args, **kwargs)
            module = _group_module(sys._getframe(1))
            if not _is_default(comm):
                given[comm_name] = _CommStandIn(comm, self.recorded(comm, kind, module))
            if hook is not None:
                given["all_reduce_hook"] = self.recorded(hook, K.fsdp_all_reduce, module)
            return original(*bound.args, **bound.kwargs)

        return foreach

    def _set(self, kind: str, module: Any, hook: Any, frame: types.FrameType) -> None:
        """FSDP was given `hook` for `module` (a setter called from `frame`)."""
        if self._tracing():
            self.hook_id(kind, module, hook, frame)

    def _fsdp1_comm(self, state: Any) -> Any:
        """What FSDP1's copied code calls for `state._comm_hook(...)`."""
        hook = state._comm_hook
        if hook is None or not self._tracing():
            return hook
        return self.recorded(hook, K.fsdp_comm, state if isinstance(state, torch.nn.Module) else None)


# what a setter wrapper tells: (kind, FSDP module, hook, the caller's frame), after FSDP's own setter ran
SetCallback = Callable[[str, Any, Any, types.FrameType], None]


def _watch_fsdp2_setters(ledger: Ledger, cls: Any, on_set: SetCallback) -> None:
    """Wrap FSDP2's setters on `cls` (FSDPModule): FSDP's own, then `on_set` for a hook (not a default)."""
    for name, _attr, kind in _FSDP2:
        original = vars(cls).get(name)
        if original is not None:  # torch 2.8 has no custom collectives
            ledger.set(cls, name, _watched_setter(original, kind, on_set))


def _watched_setter(original: Callable[..., Any], kind: str, on_set: SetCallback) -> Callable[..., Any]:
    @functools.wraps(original)
    def setter(module: Any, hook: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(module, hook, *args, **kwargs)
        if not _is_default(hook):
            on_set(kind, module, hook, sys._getframe(1))
        return result

    return setter


def _watch_fsdp1_register(ledger: Ledger, cls: Any, on_set: SetCallback) -> None:
    """Wrap FSDP1's `register_comm_hook` on `cls`: FSDP's own, then `on_set` for each FSDP module
    under the root that now holds the hook."""
    original = vars(cls)["register_comm_hook"]

    @functools.wraps(original)
    def register_comm_hook(root: Any, state: Any, hook: Any) -> Any:
        result = original(root, state, hook)
        frame = sys._getframe(1)
        for module in root.fsdp_modules(root):
            if getattr(module, "_comm_hook", None) is hook:
                on_set(K.fsdp_comm, module, hook, frame)
        return result

    ledger.set(cls, "register_comm_hook", register_comm_hook)


def watch_before(ledger: Ledger, done: set[str], on_set: SetCallback) -> bool:
    """Before a capture (`hooktrace exec`'s registration watch): wrap FSDP's setters imported now and
    not in `done` (which gets "fsdp2" / "fsdp1"), so where each hook was set is known to the capture
    (`HookBook.fsdp_sites`). True while some of FSDP is not watched yet."""
    fully, fsdp1 = sys.modules.get(_FULLY_SHARD), sys.modules.get(_FSDP1)
    if "fsdp2" not in done and fully is not None:
        done.add("fsdp2")
        _watch_fsdp2_setters(ledger, fully.FSDPModule, on_set)
    if "fsdp1" not in done and fsdp1 is not None:
        done.add("fsdp1")
        if "register_comm_hook" in vars(fsdp1.FullyShardedDataParallel):
            _watch_fsdp1_register(ledger, fsdp1.FullyShardedDataParallel, on_set)
    return len(done) < 2


def on_module_hook(book: Any) -> None:
    """A module hook was registered (under the capture's lock): FSDP, when it was imported after the
    capture started (`hooktrace exec` opens it before the script's imports), is patched now, before
    `fully_shard` or `FullyShardedDataParallel` returns."""
    tracer = book.fsdp
    if tracer is not None and tracer.pending:
        tracer.patch()


def install(
    book: Any, site_of: Callable[[Any], Any], lock: Any, active: Callable[[], bool], ledger: Ledger
) -> None:
    """FSDP's hooks for one capture: patched now if FSDP is imported, else when it is imported and a
    module registers a hook (`on_module_hook`) or the capture meets a model (`book.fsdp.held`)."""
    tracer = Tracer(book, site_of, lock, active)
    book.fsdp = tracer
    ledger.on_restore(lambda: setattr(book, "fsdp", None))
    tracer.install(ledger)
    ledger.on_restore(tracer.end)


# id(function) -> (weak reference, its signature): FSDP's functions are read once per process, not at
# every session (inspect.signature: about 50 us each)
_SIGNATURES: dict[int, tuple[Any, inspect.Signature]] = {}


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    known = _SIGNATURES.get(id(fn))
    if known is not None and known[0]() is fn:
        return known[1]
    signature = inspect.signature(fn)
    try:
        key = id(fn)
        _SIGNATURES[key] = (weakref.ref(fn, lambda _r: _SIGNATURES.pop(key, None)), signature)
    except TypeError:  # no weak reference: read each time
        pass
    return signature
