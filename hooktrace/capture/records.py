"""Every hook a capture has seen: its record, its id in the trace, and the shims that stand for it.

Module and global hooks are never replaced in their dicts: `view()` gives PyTorch's copied code a
plain dict of shims to iterate instead (capture/views.py). Tensor hooks are called by autograd from
the tensor's own dict, so there — and only there — a shim stands in the dict, in place (same key,
same position), from registration to the end of the block.
"""

from __future__ import annotations

import itertools
import types
import weakref
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_not, itemgetter, not_
from typing import Any, Callable, Collection, Optional

from .. import ids
from ..ids import SYNTHETIC_BASE  # noqa: F401 - where tests and callers import it from
from ..kinds import GLOBAL, MODULE, SAVED_TENSORS, TENSOR, K
from . import comm, dicts, hookapis, shims, sites
from .batched import _RECORD_DEFAULTS, Batched, _ref, _run, _state, named_params
from .build import Record
from .tensors import dtype_and_device, weak

# Hook ids are PyTorch's handle ids, unique in the process. A dict copied with its module
# (`copy.deepcopy`) holds the same ids: its hooks get ids.copy_id(n, id), n = 1, 2, ... per copied
# hook. Hooks that have no RemovableHandle (saved-tensor pack/unpack per context object, forward
# wrappers per (module, callable), DDP communication hooks per registration) get ids.synthetic_ids()
# from SYNTHETIC_BASE. The two never collide with each other or with handle ids (hooktrace/ids.py).
_STATE_KINDS = frozenset(kind for _, kind in dicts.STATE_DICTS)
_new = object.__new__
_first, _second = itemgetter(0), itemgetter(1)
_FUNCTION = types.FunctionType
_OPTIMIZER_KINDS = frozenset(kind for _, kind in dicts.OPTIMIZER_DICTS)


@dataclass
class Site:
    registered_at: Optional[str]
    registered_by: Optional[str]
    during_run: bool
    prepend: Optional[bool] = None


class HookBook(Batched):
    def __init__(self, rec: shims.Recorder, path_of: Callable[[Any], Optional[str]]) -> None:
        self.rec = rec
        self._path_of = path_of  # learns a module's path and keeps it alive
        self.records: dict[int, Record] = {}  # trace id -> record
        self.sites: dict[int, Site] = {}  # handle id -> where it was registered
        # FSDP hooks set before the block: (kind, id(module), id(hook)) -> (weakrefs to hook and module, site)
        self.fsdp_sites: dict[tuple[str, int, int], tuple[Any, Any, Site]] = {}
        self._ids: dict[tuple[int, int], int] = {}  # (id(dict), handle id) -> trace id
        self._first_dict: dict[int, int] = {}  # handle id -> id of the first dict holding it
        self.counts: dict[int, int] = {}  # id(dict) -> how many of `_ids`' keys are of that dict
        self._copies = itertools.count(1)
        # views by (id(dict), id(owner)): a dict two modules share (`copy.copy(module)`) gets shims
        # of each, which record the module they belong to
        self._views: dict[tuple[int, int], dict[int, tuple[Any, Any]]] = {}  # -> hook id -> (hook, shim)
        # -> ([*keys, *ids of hooks], view, the hooks' trace ids in order)
        self._last_views: dict[tuple[int, int], tuple[list, dict, Optional[list[int]]]] = {}
        self.seen_dicts: dict[int, tuple[Any, Any, str]] = {}  # id(dict) -> (ref, owner's Who, scope)
        self.tensor_shims: dict[int, tuple[Any, Any, int]] = {}  # id(shim) -> (ref to shim, ref to dict, id)
        self._synthetic = ids.synthetic_ids()
        self._named: dict[int, tuple[Any, str, Optional[str]]] = {}  # id(hook) -> (hook, name, defined_at)
        self._places: dict[Any, Optional[str]] = {}  # code object -> defined_at of a plain function's
        # (module's key, id(forward)) -> (forward, shim)
        self._wrappers: dict[tuple[int, int], tuple[Any, Any]] = {}
        # id(saved_tensors_hooks object) -> (weakref or object, pack shim, unpack shim)
        self._saved: dict[int, tuple[Any, Any, Any]] = {}
        # PyTorch's inner tensor hooks of a multi-grad hook are not traced: (fn, handle id) go here
        # instead (capture/hookapis.py MultiGrad.on_inner, set while a capture is open)
        self.on_multi_grad: Optional[Callable[[Any, int], None]] = None
        self._api: dict[Any, int] = {}  # key -> trace id of a hook a PyTorch API holds (api_shim)
        self.fsdp: Any = None  # FSDP's comm hooks (capture/fsdp.py Tracer), while a capture is open
        self.api_held: list[int] = []  # trace ids of hooks a PyTorch API still held when the block ended
        # id(parameter) -> (weakref, module path, name) of the model's parameters when the capture met
        # the model (met_model): a move that makes new parameters (to or from `meta`) leaves hooks on these
        self.model_params: dict[int, tuple[Any, str, str]] = {}
        self.param_records: list[Record] = []  # the records mark_param named a parameter of

    # -- ids and records ---------------------------------------------------------------
    def trace_id(self, d: dict, hid: int) -> int:
        key = (id(d), hid)
        tid = self._ids.get(key)
        if tid is None:
            first = self._first_dict.setdefault(hid, id(d))
            tid = self._ids[key] = hid if first == id(d) else ids.copy_id(next(self._copies), hid)
            self.counts[id(d)] = self.counts.get(id(d), 0) + 1
        return tid

    def record(self, d: dict, hid: int, fn: Any, kind: str, owner: Any, scope: str) -> Record:
        tid = self.trace_id(d, hid)
        record = self.records.get(tid)
        if record is None:
            record = self.records[tid] = self._new_record(tid, hid, fn, kind, owner, scope)
        if id(d) not in self.seen_dicts:
            self.seen_dicts[id(d)] = (_ref(d), None if owner is None else self.rec.who(owner), scope)
        return record

    def _new_record(self, tid: int, hid: int, fn: Any, kind: str, owner: Any, scope: str) -> Record:
        with_kwargs, always_call = dicts.module_flags(owner, kind, hid) if scope != TENSOR else (False, False)
        if kind == K.forward_wrapper:
            name, defined_at = sites.forward_wrapper_name(fn), sites.forward_wrapper_defined_at(fn)
        elif scope not in (MODULE, GLOBAL):  # not kept here: a tensor's hook may die with it
            code = fn.__code__ if type(fn) is _FUNCTION and fn.__closure__ is None else None
            if code is not None and "__wrapped__" not in fn.__dict__:  # named by its code alone
                place = self._places.get(code)
                if place is None:
                    place = self._places[code] = sites.defined_at(fn)
                name, defined_at = fn.__qualname__, place
            else:
                name, defined_at = sites.hook_name(fn), sites.defined_at(fn)
        else:  # one function registered on many modules is named once per capture (their dicts hold it)
            named = self._named.get(id(fn))
            if named is None or named[0] is not fn:
                named = self._named[id(fn)] = (fn, sites.hook_name(fn), sites.defined_at(fn))
            name, defined_at = named[1], named[2]
        # Record(...) field by field, without its dataclass __init__ (19 fields: most keep their default)
        record = _new(Record)
        fields = record.__dict__
        fields.update(_RECORD_DEFAULTS)
        fields["id"], fields["kind"], fields["scope"] = tid, kind, scope
        fields["owner"] = None if owner is None else self.rec.who(owner)  # not the module: it may die
        fields["name"], fields["defined_at"] = name, defined_at
        fields["with_kwargs"], fields["always_call"] = with_kwargs, always_call
        site = self.sites.get(hid) if tid == hid else None  # a copy was not registered
        if site is not None:
            record.registered_at = site.registered_at
            record.registered_by = site.registered_by
            record.registered_during_run = site.during_run
            if site.prepend:
                record.prepend = True
                record.prepend_source = "registration"
        if owner is not None:
            self._path_of(owner)
        return record

    def infer_prepends(self, d: dict) -> None:
        for hid in dicts.inferred_prepends(list(d)):
            record = self.records.get(self.trace_id(d, hid))
            if record is not None and not record.prepend:
                record.prepend = True
                record.prepend_source = "inferred"

    def _shim(self, record: Record, fn: Any, owner: Any) -> Any:
        kind, scope = record.kind, record.scope
        shim = shims.make_shim(
            self.rec,
            fn,
            record.id,
            kind,
            owner if scope == MODULE else None,
            # a global hook's module is its first argument; a module hook's is the owner of its view
            scope == GLOBAL and kind not in _OPTIMIZER_KINDS,
        )
        if kind in _STATE_KINDS and hasattr(fn, "_from_public_api"):  # state_dict() reads it
            shim._from_public_api = fn._from_public_api
        shim.__wrapped__ = fn
        return shim

    # -- module and global hooks: views -------------------------------------------------
    def view(self, d: dict, owner: Any, attr: str) -> dict:
        """What PyTorch's copied code iterates instead of `d`: the same keys, each hook's shim.

        The last view of each dict is kept with the keys and the ids of the hooks it was made from
        (the cache holds those hooks, so their ids cannot be reused): an unchanged dict costs one
        C-level list build and a comparison, whatever objects it holds.
        """
        state = _state(d)  # callers pass non-empty dicts only
        last = self._last_views.get((id(d), id(owner)))
        if last is not None and last[0] == state:
            return last[1]
        return self._make_view(d, owner, state, lambda: dicts.kind_of(attr, owner))

    def unchanged_ids(self, d: dict, owner: Any) -> Optional[list[int]]:
        """The trace ids of `d`'s hooks, in order, when `d` holds what its last view was made from
        (the same keys and hook objects: each has its record, and its prepend was inferred from this
        order when the view was made); else None."""
        last = self._last_views.get((id(d), id(owner)))
        if last is None or last[2] is None or last[0] != _state(d):
            return None
        return last[2]

    def prewarm(self, d: dict, owner: Any, kind: str) -> None:
        """Make the view of a dict the capture starts with, so its first read inside the block is a hit.

        The shims of hooks that were there before the block are made before the block, as records
        are: a traced step costs the same whether it is the first or the tenth of a capture.
        """
        if d:
            self._make_view(d, owner, _state(d), lambda: kind)

    def _make_view(self, d: dict, owner: Any, state: list, kind_of: Callable[[], str]) -> dict:
        cache = self._views.get((id(d), id(owner)))
        if cache is None:
            cache = self._views[(id(d), id(owner))] = {}
        out = {}
        # one read (a C-level copy, which no other thread interrupts): the loop runs Python code, during
        # which another thread may register or remove hooks
        for hid, fn in [*d.items()]:
            entry = cache.get(hid)
            if entry is None or entry[0] is not fn:
                kind = kind_of()
                record = self.record(d, hid, fn, kind, owner, dicts.scope_of(owner))
                entry = cache[hid] = (fn, self._shim(record, fn, owner))
            out[hid] = entry[1]
        self.infer_prepends(d)  # also when no record is new: the same hooks may stand in another order
        known, key = self._ids, id(d)
        try:
            tids: Optional[list[int]] = [known[(key, hid)] for hid in out]
        except KeyError:  # the block ended on another thread meanwhile (the book was cleared)
            tids = None
        self._last_views[(id(d), id(owner))] = (state, out, tids)
        return out

    # -- tensor and autograd-node hooks: shims in place ---------------------------------
    def wrap_tensor_hook(
        self, d: dict, hid: int, kind: str, tensor: Any, scope: str = TENSOR
    ) -> Optional[Record]:
        fn = d.get(hid)
        if fn is None:  # removed meanwhile, on another thread
            return None
        if hookapis.is_inner_hook(fn):  # a multi-grad hook's: its user's function is traced instead
            if self.on_multi_grad is not None:
                self.on_multi_grad(fn, hid)
            return None
        entry = self.tensor_shims.get(id(fn))
        if entry is not None and entry[0]() is fn:  # already ours
            return self.records[entry[2]]
        record = self.record(d, hid, fn, kind, None, scope)
        if record.tensor_ref is None:
            record.tensor_ref = weak(tensor)
            if self.model_params:
                self.mark_param(record, tensor)
        shim = self._shim(record, fn, None)
        key = id(shim)
        table = self.tensor_shims
        # the shim dies with its tensor's dict, and leaves the table then
        table[key] = (weakref.ref(shim, lambda _r: table.pop(key, None)), _ref(d), record.id)
        if d.get(hid) is fn:
            d[hid] = shim
            if record.removed:  # its handle removed it on another thread between the read and the write
                d.pop(hid, None)
        return record

    def mark_param(self, record: Record, tensor: Any) -> None:
        """Note which of the model's parameters `tensor` is (a move may replace it, `ending.walk`)."""
        known = self.model_params.get(id(tensor))
        if known is not None and record.param_of is None and known[0]() is tensor:
            record.param_of = (known[1], known[2], dtype_and_device(tensor))
            self.param_records.append(record)

    def met_model(self, named: list[tuple[str, Any]]) -> None:
        """The model's modules (path, module): its parameters now, and which of them hooks are on."""
        known = self.model_params
        held = named_params(named)  # (path, (name, parameter))
        pairs = [*map(_second, held)]
        params = [*map(_second, pairs)]
        real = [*map(is_not, params, repeat(None))]
        try:
            refs = [*map(weakref.ref, compress(params, real))]
        except TypeError:  # a parameter that takes no weak reference: each on its own
            for path, (name, param) in held:
                if param is not None and id(param) not in known:
                    ref = weak(param)
                    if ref is not None:
                        known[id(param)] = (ref, path, name)
        else:  # the first path and name of each parameter
            where = zip(refs, compress(map(_first, held), real), compress(map(_first, pairs), real))
            _run(map(known.setdefault, map(id, compress(params, real)), where))
        for record in list(self.records.values()):
            tensor = record.tensor_ref() if record.tensor_ref is not None else None
            if tensor is not None:
                self.mark_param(record, tensor)

    # -- hooks without a RemovableHandle -----------------------------------------------
    def _synthetic_record(self, fn: Any, kind: str, owner: Any, scope: str, site: Optional[Site]) -> Record:
        tid = next(self._synthetic)
        record = self.records[tid] = self._new_record(tid, tid, fn, kind, owner, scope)
        if site is not None:
            record.registered_at = site.registered_at
            record.registered_by = site.registered_by
            record.registered_during_run = site.during_run
        return record

    def forward_wrapper(self, module: Any, forward: Any) -> Any:
        """The shim that `_call_impl`'s copy calls instead of a `forward` set on the module instance."""
        key = (self.rec.key(module), id(forward))
        entry = self._wrappers.get(key)
        if entry is None or entry[0] is not forward:
            record = self._synthetic_record(forward, K.forward_wrapper, module, MODULE, None)
            shim = shims.make_shim(self.rec, forward, record.id, K.forward_wrapper, module, False)
            entry = self._wrappers[key] = (forward, shim)
        return entry[1]

    def saved_tensors_shims(self, ctx: Any, site: Site) -> tuple[Any, Any]:
        """(pack shim, unpack shim) for one `saved_tensors_hooks` object, the same at each `__enter__`.

        The book keeps them only while the object lives (its entry leaves with it): the shims hold
        the hooks, whose closures hold what the user's code gave them (checkpoint's frame, its
        inputs, the graph). After that only the saved tensors that got them hold them, as they
        hold the hooks untraced. An object that takes no weak reference gets new shims each time.
        """
        key = id(ctx)
        entry = self._saved.get(key)
        if entry is not None and entry[0]() is ctx:
            return entry[1], entry[2]
        made = []
        for kind, fn in ((K.pack, ctx.pack_hook), (K.unpack, ctx.unpack_hook)):
            record = self._synthetic_record(fn, kind, None, SAVED_TENSORS, site)
            shim = shims.make_shim(self.rec, fn, record.id, kind, None, False)
            shim.__wrapped__ = fn  # what a saved tensor reports as its hook (capture/autograd.py)
            made.append(shim)
        table = self._saved
        try:
            ref = weakref.ref(
                ctx, lambda r: table.pop(key, None) if table.get(key, (None,))[0] is r else None
            )
        except TypeError:
            return made[0], made[1]
        table[key] = (ref, made[0], made[1])
        return made[0], made[1]

    def comm_shim(self, ddp: Any, hook: Any, site: Optional[Site], call: Any) -> Any:
        """The recording shim that the DDP reducer calls instead of `hook`."""
        record = self._synthetic_record(hook, K.comm, ddp, MODULE, site)
        record.defined_at = comm.defined_at(hook)  # its own code, not the trampoline standing for it
        return shims.make_shim(self.rec, call, record.id, K.comm, ddp, False)

    def api_shim(
        self,
        fn: Any,
        kind: str,
        owner: Any,
        scope: str,
        site: Optional[Site],
        name_from: Any = None,
        key: Any = None,
    ) -> Any:
        """The recording shim of a hook a PyTorch API holds outside any dict (capture/hookapis.py),
        named after `name_from` (else `fn`); one record per `key` (per call when None)."""
        tid = self.api_record(fn if name_from is None else name_from, kind, owner, scope, site, key)
        shim = shims.make_shim(self.rec, fn, tid, kind, owner if scope == MODULE else None, False)
        shim.__wrapped__ = fn
        return shim

    def api_record(
        self, fn: Any, kind: str, owner: Any, scope: str, site: Optional[Site], key: Any = None
    ) -> int:
        """The trace id of a hook a PyTorch API holds outside any dict: one record per `key` (None: a new one)."""
        tid = self._api.get(key) if key is not None else None
        if tid is None or tid not in self.records:
            tid = self._synthetic_record(fn, kind, owner, scope, site).id
            if key is not None:
                self._api[key] = tid
        return tid

    def untraceable(self, fn: Any, kind: str, owner: Any, name: str) -> None:
        """A hook that runs where hooktrace cannot see it (a built-in C++ comm hook): shown, named `name`."""
        self._synthetic_record(fn, kind, owner, MODULE, None).name = name

    def unwrap(self, d: dict) -> None:
        """Put the original tensor hooks back, in place (same keys, same order)."""
        table = self.tensor_shims
        for hid, value in list(d.items()):
            entry = table.get(id(value))
            current = d.get(hid)  # None when another thread removed it meanwhile
            if entry is not None and entry[0]() is value and current is value:
                d[hid] = current.__wrapped__
                record = self.records.get(entry[2])
                if record is not None and record.removed:  # removed on another thread meanwhile
                    d.pop(hid, None)

    def live_dict_ids(self) -> set[int]:
        """Trace ids of hooks whose dict (the node, tensor or module that holds it) is still alive."""
        out = set()
        for (dict_id, _hid), tid in [*self._ids.items()]:
            entry = self.seen_dicts.get(dict_id)
            if entry is not None and entry[0]() is not None:
                out.add(tid)
        return out

    def deleted(self, unchanged: Collection[int] = ()) -> set[int]:
        """Trace ids of hooks no longer in their dict, which is still alive, and never removed through
        their handle: code deleted them from the dict itself. `unchanged`: ids of dicts seen holding
        every hook the capture saw in them (not read again)."""
        out = set()
        items = [*self._ids.items()]  # one C-level copy: other threads register
        if unchanged:
            items = [
                *compress(items, map(not_, map(unchanged.__contains__, map(_first, map(_first, items)))))
            ]
        for (dict_id, hid), tid in items:
            entry = self.seen_dicts.get(dict_id)
            d = entry[0]() if entry is not None else None
            record = self.records.get(tid)
            if d is not None and hid not in d and record is not None and not record.removed:
                out.add(tid)
        return out

    def kind_and_owner(self, tid: int) -> tuple[Optional[str], Any]:
        record = self.records.get(tid)
        return (record.kind, record.owner) if record is not None else (None, None)

    def clear(self) -> None:
        self.records.clear()
        self._named.clear()
        self._places.clear()
        self.sites.clear()
        self._ids.clear()
        self._first_dict.clear()
        self.counts.clear()
        self._views.clear()
        self._last_views.clear()
        self.seen_dicts.clear()
        self.tensor_shims.clear()
        self._wrappers.clear()
        self._saved.clear()
        self._api.clear()
        self.model_params.clear()
        self.api_held.clear()
        self.param_records.clear()
