"""`hooktrace.trace(model)`: install the capture, trace every hook, restore everything on exit."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import platform
import sys
import time
import weakref
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from types import FrameType
from typing import Any, Optional

import torch
from torch.utils.hooks import RemovableHandle

from ..analysis.surprises import find_surprises
from ..schema import ROOT, Event, Hook, Meta, Module, Trace, gc_paused
from . import registry, shims, sites
from .registry import CALL_DICTS, GLOBAL_DICTS, MODULE_DICTS, STATE_DICTS, TENSOR_DICTS

# The phase of a hook event by kind; None: the phase of the module call it ran in (other kinds: "other").
_PHASE_OF_KIND = {
    "forward_pre": None,
    "forward": None,
    "backward_pre": shims.BACKWARD,
    "backward": shims.BACKWARD,
    "backward_legacy": shims.BACKWARD,
    "grad": shims.BACKWARD,
    "post_accumulate_grad": shims.BACKWARD,
}
# PyTorch calls these module hooks with the module as first argument.
_MODULE_FIRST = {
    "forward_pre",
    "forward",
    "backward_pre",
    "backward",
    "backward_legacy",
    "state_dict_pre",
    "state_dict",
    "load_state_dict_post",
}

# Hooks that fire outside any module call (state_dict(), submodule/parameter/buffer registration) are
# wrapped as soon as they are registered; the others when their module is next called.
_WRAP_AT_REGISTRATION = {kind for _, kind in STATE_DICTS} | {
    "module_registration",
    "parameter_registration",
    "buffer_registration",
}

_HOOK_FIELDS = tuple(f.name for f in dataclasses.fields(Hook))
_STATE_KINDS = frozenset(kind for _, kind in STATE_DICTS)

_ACTIVE: Optional[TraceSession] = None


@dataclass
class _Record(Hook):
    """A hook while capturing: the trace's Hook plus the live objects it came from."""

    owner: Any = None  # module object (module scope) or None
    tensor_ref: Any = None  # weakref to the tensor (tensor scope)
    tensor_desc: Optional[tuple[str, Any]] = None  # ("output of"|"input of"|"tensor in", module) or None
    removed: bool = False


@dataclass
class _Final:
    """What the final pass over the model and the global dicts found."""

    paths: dict[int, str] = dataclasses.field(default_factory=dict)  # id(module) -> path
    modules: list[Module] = dataclasses.field(default_factory=list)
    params: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)  # id -> (path, name)
    order: list[int] = dataclasses.field(default_factory=list)  # hook ids in dict order
    seen: set[int] = dataclasses.field(default_factory=set)  # ids of the dicts settled


@dataclass
class _Pending:
    """What a finished capture leaves for building its trace: ints, strings and records only."""

    modules: list[Module]
    records: list[_Record]  # in the trace's hook order, module/tensor filled in, live refs dropped
    paths: dict[int, str]  # id of a module at capture time -> its path
    hook_calls: list[tuple]  # Recorder.hooks; a shim object kept and called after the block
    n_hook_calls: int  # would still append to it: only the first n_hook_calls belong to the trace
    module_calls: list[tuple]  # Recorder.calls
    step_starts: list[int]


@dataclass
class _Site:
    registered_at: Optional[str]
    registered_by: Optional[str]
    during_run: bool
    prepend: Optional[bool] = None


class TraceSession:
    """Context manager returned by `hooktrace.trace()`. After the block: `.trace`, `to_dict()`, `save()`."""

    def __init__(self, model: Any = None, *, target: Optional[str] = None) -> None:
        self._model = model
        self._meta = Meta(target=target)
        self._meta_overrides: dict[str, Any] = {}
        self._trace: Optional[Trace] = None
        self._pending: Optional[_Pending] = None  # what the trace is built from, at first use
        self._rec = shims.Recorder()
        self._records: dict[int, _Record] = {}
        self._sites: dict[int, _Site] = {}  # registrations seen, by handle id
        # id(shim) -> (weakref to shim, ref to its dict, hook id); entries leave with their shim, so an
        # id in here is always a live shim (a tensor's dict dies with the tensor).
        self._shims: dict[int, tuple[Any, Any, int]] = {}
        self._tensor_dicts: list[tuple[Any, str, Any]] = []  # (ref to dict, kind, tensor weakref or None)
        self._paths: dict[int, str] = {}
        self._keep: dict[int, Any] = {}  # modules seen, kept alive so their ids stay unique until the end
        self._call_shims: set[Any] = set()  # module and global shims: `_call_impl` checks dicts against it
        self._global_call_dicts: list[tuple[dict, str]] = []
        self._interceptor: Optional[registry.Interceptor] = None
        self._original_call_impl: Any = None
        self._run_codes: set[Any] = set()
        self._outputs: dict[int, tuple[Any, Any]] = {}  # id(tensor) -> (weakref, module) for named outputs
        self._active = False

    # -- public API ----------------------------------------------------------------------
    def __enter__(self) -> TraceSession:
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError(
                "hooktrace.trace() is already active; nested or concurrent tracing is not supported. "
                "Finish the outer `with hooktrace.trace(...)` block first."
            )
        if self._trace is not None or self._pending is not None:
            raise RuntimeError("this hooktrace.trace() session has already run; create a new one")
        _ACTIVE = self
        self._active = True
        self._start_ns = time.perf_counter_ns()
        self._meta.created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        try:
            with gc_paused():
                self._install()
                if self._model is not None:
                    self._inventory_model(self._model)
        except BaseException:
            self._finish()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._finish()

    def attach(self, model: Any) -> None:
        """Name module paths after `model` and wrap the hooks it already holds."""
        self._model = model
        if self._active:
            with gc_paused():
                self._inventory_model(model)

    def mark_step(self) -> None:
        """Start the next step: later events carry `step + 1`."""
        self._rec.mark_step()

    def set_meta(self, **fields: Any) -> None:
        """Override meta fields (device, target, steps, rank, world_size)."""
        self._meta_overrides.update(fields)
        if self._trace is not None:
            for key, value in fields.items():
                setattr(self._trace.meta, key, value)

    @property
    def trace(self) -> Trace:
        """The trace, built at first use from what the block left (see `_snapshot`)."""
        if self._trace is None:
            pending = self._pending
            if pending is None:
                raise RuntimeError("the trace is available after the `with hooktrace.trace(...)` block ends")
            with gc_paused():
                self._trace = self._build_trace(pending)
            self._pending = None
        return self._trace

    def to_dict(self) -> dict[str, Any]:
        return self.trace.to_dict()

    def save(self, path: str) -> None:
        self.trace.save(path)

    # -- install / restore ---------------------------------------------------------------
    def _install(self) -> None:
        self._interceptor = registry.Interceptor(self._on_register, self._on_handle, self._on_remove)
        self._interceptor.install()
        self._original_call_impl = vars(torch.nn.Module)["_call_impl"]
        empty: dict = {}  # a torch without one of these dicts
        found = (registry.global_dict(attr) for attr, _ in GLOBAL_DICTS[:4])
        global_dicts = tuple(empty if d is None else d for d in found)
        call_impl = shims.make_call_impl(
            self._rec,
            self._original_call_impl,
            self._before_call,
            self._on_output,
            global_dicts,
            self._call_shims,
        )
        torch.nn.Module._call_impl = call_impl
        self._run_codes = {call_impl.__code__}
        call_attrs = {attr for attr, _ in GLOBAL_DICTS[:4]}  # the hooks `_call_impl` runs
        for attr, kind in GLOBAL_DICTS:
            d = registry.global_dict(attr)
            if d is None:
                continue
            if attr in call_attrs:
                self._global_call_dicts.append((d, kind))
            self._wrap_dict(d, kind, None, "global")

    def _finish(self) -> None:
        with gc_paused():
            self._finish_now()

    def _finish_now(self) -> None:
        global _ACTIVE
        final: Optional[_Final] = None
        try:
            if self._original_call_impl is not None:
                torch.nn.Module._call_impl = self._original_call_impl
                self._original_call_impl = None
            if self._interceptor is not None:
                self._interceptor.restore()
            if self._active:
                final = self._final_pass()
        finally:
            self._restore_dicts(walk_model=final is None)
            _ACTIVE = None
            self._active = False
        try:
            self._pending = self._snapshot(final or self._final_pass())
        finally:
            self._release()

    def _final_pass(self) -> _Final:
        """One walk over the model and the global dicts at the end of the capture.

        Hooks that never fired still belong in the trace, and the final dict order proves prepends:
        every hook dict gets a record for each hook it holds and its original objects back, in place
        (same ids, same order); the walk also gives module paths, parameter names and the hooks in
        the order PyTorch fires them (global dicts, then each module's, then the parameters').
        """
        final = _Final()
        for attr, kind in GLOBAL_DICTS:
            d = registry.global_dict(attr)
            if d:  # empty dicts: nothing to record or restore
                self._settle(d, kind, None, "global", final)
        model = self._model
        if isinstance(model, torch.nn.Module):
            params: list[tuple[Any, str]] = []
            for path, module in model.named_modules():
                final.paths[id(module)] = path
                final.modules.append(Module(path, type(module).__name__))
                md = module.__dict__
                for attr, kind in MODULE_DICTS:
                    d = md.get(attr)
                    if d:  # empty dicts: nothing to record or restore
                        self._settle(d, kind, module, "module", final)
                for pname, param in md.get("_parameters", {}).items():
                    if param is not None and id(param) not in final.params:
                        final.params[id(param)] = (path, pname)
                        params.append((param, pname))
            for param, _ in params:  # after every module's dicts, as `model.parameters()` would come
                for attr, kind in TENSOR_DICTS:
                    d = getattr(param, attr, None)
                    if d:  # empty dicts: nothing to record or restore
                        self._settle(d, kind, None, "tensor", final, tensor=param)
        for dict_ref, kind, tensor_ref in self._tensor_dicts:
            d = dict_ref()
            if d:  # empty dicts: nothing to record or restore
                self._settle(d, kind, None, "tensor", final, tensor=tensor_ref() if tensor_ref else None)
        for _shim_ref, dict_ref, _hid in list(self._shims.values()):  # dicts outside the model now
            d = dict_ref()
            if d is not None and id(d) not in final.seen:
                self._infer_prepends(d)
        return final

    def _settle(self, d: dict, kind: str, owner: Any, scope: str, final: _Final, tensor: Any = None) -> None:
        """Record every hook in `d`, infer prepends from its order, put the original objects back."""
        if id(d) in final.seen:
            return
        final.seen.add(id(d))
        if kind == "backward" and scope != "tensor":
            kind = registry.backward_kind(owner)
        shims_table = self._shims
        for hid, value in list(d.items()):
            entry = shims_table.get(id(value))
            if entry is not None and entry[0]() is value:
                d[hid] = value.__wrapped__
            elif hid not in self._records:
                record = self._new_record(hid, value, kind, owner, scope)
                if tensor is not None:
                    record.tensor_ref = _weak(tensor)
            final.order.append(hid)
        self._infer_prepends(d)

    def _restore_dicts(self, walk_model: bool) -> None:
        """Every dict we touched gets its original objects back, in place: same ids, same order.

        After `_final_pass` only dicts outside the model (a module removed from it, a tensor's) can
        still hold shims; without it (the capture failed on its way in or out) look everywhere.
        """
        dicts: dict[int, dict] = {}
        for _shim_ref, dict_ref, _hid in list(self._shims.values()):
            d = dict_ref()
            if d is not None:
                dicts[id(d)] = d
        if walk_model:
            for d in self._all_known_dicts():
                dicts[id(d)] = d
        for d in dicts.values():
            for hid, value in list(d.items()):
                entry = self._shims.get(id(value))
                if entry is not None and entry[0]() is value:
                    d[hid] = value.__wrapped__

    def _all_known_dicts(self) -> list[dict]:
        found = [d for attr, _ in GLOBAL_DICTS if (d := registry.global_dict(attr)) is not None]
        if self._model is not None and isinstance(self._model, torch.nn.Module):
            for module in self._model.modules():
                found.extend(d for attr, _ in MODULE_DICTS if (d := module.__dict__.get(attr)))
            for param in self._model.parameters():
                found.extend(d for attr, _ in TENSOR_DICTS if (d := getattr(param, attr, None)))
        found.extend(d for ref, _, _ in self._tensor_dicts if (d := ref()) is not None)
        return found

    # -- registration callbacks ----------------------------------------------------------
    def _during_run(self, frame: Optional[FrameType]) -> bool:
        if shims.in_backward():
            return True
        codes = self._run_codes
        while frame is not None:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
        return False

    def _site(self, frame: Optional[FrameType]) -> _Site:
        at, by = sites.call_sites(frame)
        return _Site(at, by, self._during_run(frame))

    def _on_handle(self, handle: RemovableHandle, frame: FrameType) -> None:
        # Handles made by PyTorch's plumbing (BackwardHook's node hooks) are not hooks users see.
        if sites._frame_class(frame.f_code.co_filename) == 2:
            return
        self._sites[handle.id] = self._site(frame)

    def _on_remove(self, handle: RemovableHandle) -> None:
        record = self._records.get(handle.id)
        if record is None or record.removed:
            return
        hooks_dict = handle.hooks_dict_ref()
        if hooks_dict is None or handle.id not in hooks_dict:
            return
        record.removed = True
        if self._during_run(sys._getframe(1)):
            record.removed_during_run = True

    def _on_register(
        self, handle: RemovableHandle, kind: str, owner: Any, arguments: dict, frame: Any
    ) -> None:
        site = self._site(frame)
        site.prepend = bool(arguments.get("prepend", False))
        self._sites[handle.id] = site
        d = handle.hooks_dict_ref()
        if d is None or handle.id not in d:
            return
        if kind in ("grad", "post_accumulate_grad"):
            self._tensor_dicts.append((_ref(d), kind, _weak(owner)))
            record = self._wrap_one(d, handle.id, d[handle.id], kind, None, "tensor")
            record.tensor_ref = _weak(owner)
            record.tensor_desc = self._describe_tensor(owner, frame)
            return
        scope = "global" if owner is None else "module"
        if owner is not None:
            self._path_of(owner)
        if kind == "backward":
            kind = registry.backward_kind(owner)
        if kind in _WRAP_AT_REGISTRATION or site.during_run:
            # during a run the module being called may already be past our look at its dicts, and
            # `_call_impl` reads its forward hooks again after forward: wrap now
            self._wrap_one(d, handle.id, d[handle.id], kind, owner, scope)
        elif handle.id not in self._records:
            # otherwise wrapped lazily, when the module is next called; the record exists from now
            # on, so a hook removed before it could fire is still in the trace
            self._new_record(handle.id, d[handle.id], kind, owner, scope)

    def _on_output(self, module: Any, result: Any) -> None:
        if len(self._outputs) > 4096:
            self._outputs.clear()
        for tensor in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(tensor, torch.Tensor):
                ref = _weak(tensor)
                if ref is not None:
                    self._outputs[id(tensor)] = (ref, module)

    def _describe_tensor(self, tensor: Any, frame: Optional[FrameType]) -> Optional[tuple[str, Any]]:
        """Which module's output/input a tensor hook went on.

        The output of a module with full backward hooks is known exactly (that is the tensor whose
        hooks race its backward pre-hooks); otherwise the innermost traced frame tells.
        """
        known = self._outputs.get(id(tensor))
        if known is not None and known[0]() is tensor:
            return ("output of", known[1])
        while frame is not None:
            call = shims.shim_call(frame)
            if call is not None:
                hook_id, args, mod = call
                record = self._records.get(hook_id)
                kind = record.kind if record else None
                if mod is None and record is not None:
                    mod = record.owner
                if kind == "forward" and args and _contains(args[-1], tensor):
                    return ("output of", mod)
                if kind in ("forward", "forward_pre") and len(args) > 1 and _contains(args[1], tensor):
                    return ("input of", mod)
                return ("tensor in", mod)
            if frame.f_code in self._run_codes:
                return ("tensor in", frame.f_locals.get("self"))
            frame = frame.f_back
        return None

    # -- wrapping ------------------------------------------------------------------------
    def _before_call(self, module: Any) -> None:
        """Wrap hooks that appeared since the last look: runs when a module call finds something in
        its call dicts (or the global ones) that is not one of this capture's shims."""
        known = self._shims
        md = module.__dict__
        for attr, kind in CALL_DICTS:
            d = md.get(attr)
            if d:
                for value in d.values():
                    if id(value) not in known:
                        self._path_of(module)
                        self._wrap_dict(d, kind, module, "module")
                        break
        for d, kind in self._global_call_dicts:
            if d:
                for value in d.values():
                    if id(value) not in known:
                        self._wrap_dict(d, kind, None, "global")
                        break

    def _wrap_dict(self, d: dict, kind: str, owner: Any, scope: str, tensor: Any = None) -> None:
        if kind == "backward" and scope != "tensor":
            kind = registry.backward_kind(owner)
        for hid, value in list(d.items()):
            if id(value) not in self._shims:
                record = self._wrap_one(d, hid, value, kind, owner, scope)
                if tensor is not None and record.tensor_ref is None:
                    record.tensor_ref = _weak(tensor)
        self._infer_prepends(d)

    def _infer_prepends(self, d: dict) -> None:
        for hid in registry.inferred_prepends(list(d)):
            record = self._records.get(hid)
            if record is not None and not record.prepend:
                record.prepend = True
                record.prepend_source = "inferred"

    def _wrap_one(self, d: dict, hid: int, value: Any, kind: str, owner: Any, scope: str) -> _Record:
        record = self._records.get(hid)
        if record is None:
            record = self._new_record(hid, value, kind, owner, scope)
        shim = shims.make_shim(
            self._rec,
            value,
            hid,
            kind,
            owner,
            scope == "global" or (kind in _MODULE_FIRST and scope == "module"),
        )
        if kind in _STATE_KINDS and hasattr(value, "_from_public_api"):  # state_dict() reads it
            shim._from_public_api = value._from_public_api
        shim.__wrapped__ = value
        key = id(shim)
        shims_table = self._shims
        if scope == "tensor":  # the shim dies with its tensor's dict, and leaves the table then
            shims_table[key] = (weakref.ref(shim, lambda _r: shims_table.pop(key, None)), _ref(d), hid)
        else:  # module and global shims live as long as the capture
            shims_table[key] = (weakref.ref(shim), _ref(d), hid)
            self._call_shims.add(shim)
        d[hid] = shim
        return record

    def _new_record(self, hid: int, fn: Any, kind: str, owner: Any, scope: str) -> _Record:
        site = self._sites.get(hid)
        with_kwargs, always_call = (
            registry.module_flags(owner, kind, hid) if scope != "tensor" else (False, False)
        )
        record = _Record(
            id=hid,
            kind=kind,
            scope=scope,
            owner=owner,
            name=sites.hook_name(fn),
            defined_at=sites.defined_at(fn),
            with_kwargs=with_kwargs,
            always_call=always_call,
        )
        if site is not None:
            record.registered_at = site.registered_at
            record.registered_by = site.registered_by
            record.registered_during_run = site.during_run
            if site.prepend:
                record.prepend = True
                record.prepend_source = "registration"
        if owner is not None:
            self._keep[id(owner)] = owner
        self._records[hid] = record
        return record

    # -- inventory -----------------------------------------------------------------------
    def _path_of(self, module: Any) -> Optional[str]:
        key = id(module)
        path = self._paths.get(key)
        if path is None and self._model is not None:
            self._refresh_paths()
            path = self._paths.get(key)
        self._keep.setdefault(key, module)
        return path

    def _refresh_paths(self) -> None:
        model = self._model
        if isinstance(model, torch.nn.Module):
            for path, module in model.named_modules():
                self._paths[id(module)] = path
                self._keep.setdefault(id(module), module)

    def _inventory_model(self, model: Any) -> None:
        """Wrap every hook the model and the global dicts hold now, in one walk over the model."""
        if not isinstance(model, torch.nn.Module):
            return
        params: dict[int, Any] = {}
        for path, module in model.named_modules():
            key = id(module)
            self._paths[key] = path
            self._keep.setdefault(key, module)
            self._rec.module_key(module)  # known now, so the module's first call does not add it
            md = module.__dict__
            for attr, kind in MODULE_DICTS:
                d = md.get(attr)
                if d:
                    self._wrap_dict(d, kind, module, "module")
            for param in md.get("_parameters", {}).values():
                if param is not None:
                    params.setdefault(id(param), param)
        for param in params.values():
            for attr, kind in TENSOR_DICTS:
                d = getattr(param, attr, None)
                if d:
                    self._wrap_dict(d, kind, None, "tensor", tensor=param)
        for attr, kind in GLOBAL_DICTS:
            d = registry.global_dict(attr)
            if d:
                self._wrap_dict(d, kind, None, "global")

    # -- finalisation --------------------------------------------------------------------
    def _snapshot(self, final: _Final) -> _Pending:
        """What the trace is built from, with no reference left to a module, tensor or hook.

        Only what needs the live objects happens here, at the end of the block (module paths and
        tensor names of the hooks, the device); events, hooks and surprises are made when the trace
        is first used, so leaving the block costs little more than putting the hook dicts back.
        """
        paths = {**self._paths, **final.paths}
        records = self._ordered_records(final.order)
        for r in records:
            r.module, r.tensor = self._hook_place(r, paths, final.params)
            r.owner = r.tensor_ref = r.tensor_desc = None
        meta = self._meta
        meta.torch = torch.__version__
        meta.python = platform.python_version()
        meta.steps = self._rec.steps
        meta.device = _device_of(self._model)
        rec = self._rec
        # `_release` gives the session a new Recorder; these lists stay with the pending trace
        return _Pending(final.modules, records, paths, rec.hooks, len(rec.hooks), rec.calls, rec.step_starts)

    def _build_trace(self, pending: _Pending) -> Trace:
        hooks = [_to_hook(r) for r in pending.records]
        events = self._events(pending, {h.id: h for h in hooks})
        meta = self._meta
        for key, value in self._meta_overrides.items():
            setattr(meta, key, value)
        trace = Trace(meta=meta, modules=pending.modules, hooks=hooks, events=events)
        trace.surprises = find_surprises(trace)
        return trace

    def _events(self, pending: _Pending, hooks: dict[int, Hook]) -> list[Event]:
        """Compact records -> SPEC events, in `seq` order, renumbered 0.. without gaps.

        A forward-kind hook takes the phase of the innermost module call open on its thread (it runs
        inside that call's `_call_impl`): `recompute` when that call started during backward.
        """
        start = self._start_ns
        paths = pending.paths
        info = {
            hid: (h.kind, _PHASE_OF_KIND.get(h.kind, shims.OTHER), h.module if h.scope == "tensor" else None)
            for hid, h in hooks.items()
        }
        raw: list[tuple] = []
        append = raw.append
        for seq, hid, tid, t0, t1, outcome, module_id in islice(pending.hook_calls, pending.n_hook_calls):
            kind, phase, tensor_module = info[hid]
            path = paths.get(module_id) if module_id is not None else tensor_module
            error = outcome if outcome.__class__ is str else None
            append((seq, "hook", phase, path, hid, kind, tid, t0 - start, t1 - t0, outcome is True, error))
        for enter, leave, phase, module_id, tid, t0, t1, error in pending.module_calls:
            path = paths.get(module_id)
            append((enter, "enter", phase, path, None, None, tid, t0 - start, t1 - t0, False, None))
            append((leave, "exit", phase, path, None, None, tid, t1 - start, 0, False, error))
        raw.sort(key=itemgetter(0))

        starts = [*pending.step_starts, float("inf")]  # the seq at which step 1, 2, ... began
        step = 0
        open_calls: dict[int, list[str]] = {}  # thread -> phases of the module calls open on it
        new = tuple.__new__  # Event's fields in order, without NamedTuple's Python-level __new__
        events: list[Event] = []
        add = events.append
        for i, (seq, type_, phase, path, hid, kind, tid, t, duration, returned, error) in enumerate(raw):
            while seq >= starts[step]:
                step += 1
            if type_ == "hook":
                if phase is None:
                    stack = open_calls.get(tid)
                    phase = stack[-1] if stack else shims.FORWARD
            elif type_ == "enter":
                open_calls.setdefault(tid, []).append(phase)
            else:
                stack = open_calls.get(tid)
                if stack:
                    stack.pop()
            add(new(Event, (i, step, type_, phase, path, hid, kind, tid, t, duration, returned, error)))
        return events

    def _ordered_records(self, order: list[int]) -> list[_Record]:
        """Hooks in the order PyTorch will fire them (the final pass's order), then the rest by id."""
        records = self._records
        ordered = []
        for hid in dict.fromkeys(order + sorted(records)):
            record = records.get(hid)
            if record is not None:
                ordered.append(record)
        return ordered

    @staticmethod
    def _hook_place(
        r: _Record, paths: dict[int, str], params: dict[int, tuple[str, str]]
    ) -> tuple[Optional[str], Optional[str]]:
        """The hook's `module` and `tensor` fields (SPEC §4)."""
        module = paths.get(id(r.owner)) if r.owner is not None else None
        if r.scope != "tensor":
            return module, None
        t = r.tensor_ref() if r.tensor_ref is not None else None
        if t is not None and id(t) in params:
            module, pname = params[id(t)]
            return module, (f"{module}.{pname}" if module else pname)
        if r.tensor_desc is not None:
            how, owner = r.tensor_desc
            owner_path = paths.get(id(owner)) if owner is not None else None
            if owner_path is None:
                owner_path = type(owner).__name__
            return module, f"{how} {owner_path or ROOT}"
        return module, "tensor"

    def _release(self) -> None:
        """The trace keeps no references to tensors, modules or hooks after the block."""
        self._shims.clear()
        self._records.clear()
        self._sites.clear()
        self._tensor_dicts.clear()
        self._keep.clear()
        self._call_shims.clear()
        self._paths.clear()
        self._global_call_dicts.clear()
        self._outputs.clear()
        self._rec = shims.Recorder()  # the old one's record lists now belong to the pending trace
        self._model = None
        self._interceptor = None


def _to_hook(r: _Record) -> Hook:
    """The record's Hook fields as they are (a _Record is a Hook), without the dataclass __init__."""
    hook = object.__new__(Hook)
    values = r.__dict__
    hook.__dict__.update({name: values[name] for name in _HOOK_FIELDS})
    return hook


def _ref(d: dict) -> Any:
    """A weak reference when the dict allows one (OrderedDict does), else a strong one."""
    try:
        return weakref.ref(d)
    except TypeError:
        return lambda: d


def _weak(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _device_of(model: Any) -> str:
    if isinstance(model, torch.nn.Module):
        for tensor in model.parameters():
            return str(tensor.device)
        for tensor in model.buffers():
            return str(tensor.device)
    return "cpu"


def _contains(container: Any, tensor: Any) -> bool:
    if container is tensor:
        return True
    if isinstance(container, (tuple, list)):
        return any(item is tensor for item in container)
    if isinstance(container, dict):
        return any(item is tensor for item in container.values())
    return False
