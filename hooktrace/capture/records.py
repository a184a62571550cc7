"""Every hook a capture has seen: its record, its id in the trace, and the shims that stand for it.

Module and global hooks are never replaced in their dicts: `view()` gives PyTorch's copied code a
plain dict of shims to iterate instead (capture/views.py). Tensor hooks are called by autograd from
the tensor's own dict, so there — and only there — a shim stands in the dict, in place (same key,
same position), from registration to the end of the block.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import dicts, shims, sites
from .build import Record
from .tensors import weak

# Hook ids are PyTorch's handle ids, unique in the process. A dict copied with its module
# (`copy.deepcopy`) holds the same ids: its hooks get COPY_BASE * n + id, n = 1, 2, ... per copy.
COPY_BASE = 10**12
# PyTorch calls these module hooks with the module as first argument.
_MODULE_FIRST = frozenset(
    {
        "forward_pre",
        "forward",
        "backward_pre",
        "backward",
        "backward_legacy",
        "state_dict_pre",
        "state_dict",
        "load_state_dict_post",
    }
)
_STATE_KINDS = frozenset(kind for _, kind in dicts.STATE_DICTS)


@dataclass
class Site:
    registered_at: Optional[str]
    registered_by: Optional[str]
    during_run: bool
    prepend: Optional[bool] = None


def _ref(d: dict) -> Callable[[], Optional[dict]]:
    """A weak reference when the dict allows one (OrderedDict does), else a strong one."""
    try:
        return weakref.ref(d)
    except TypeError:
        return lambda: d


class HookBook:
    def __init__(self, rec: shims.Recorder, path_of: Callable[[Any], Optional[str]]) -> None:
        self.rec = rec
        self._path_of = path_of  # learns a module's path and keeps it alive
        self.records: dict[int, Record] = {}  # trace id -> record
        self.sites: dict[int, Site] = {}  # handle id -> where it was registered
        self._ids: dict[tuple[int, int], int] = {}  # (id(dict), handle id) -> trace id
        self._first_dict: dict[int, int] = {}  # handle id -> id of the first dict holding it
        self._copies = itertools.count(1)
        self._views: dict[int, dict[int, tuple[Any, Any]]] = {}  # id(dict) -> {handle id: (hook, shim)}
        self.seen_dicts: dict[int, tuple[Any, Any, str]] = {}  # id(dict) -> (ref, owner, kind)
        self.tensor_shims: dict[int, tuple[Any, Any, int]] = {}  # id(shim) -> (ref to shim, ref to dict, id)

    # -- ids and records ---------------------------------------------------------------
    def trace_id(self, d: dict, hid: int) -> int:
        key = (id(d), hid)
        tid = self._ids.get(key)
        if tid is None:
            first = self._first_dict.setdefault(hid, id(d))
            tid = self._ids[key] = hid if first == id(d) else COPY_BASE * next(self._copies) + hid
        return tid

    def record(self, d: dict, hid: int, fn: Any, kind: str, owner: Any, scope: str) -> Record:
        tid = self.trace_id(d, hid)
        record = self.records.get(tid)
        if record is None:
            record = self.records[tid] = self._new_record(tid, hid, fn, kind, owner, scope)
        if id(d) not in self.seen_dicts:
            self.seen_dicts[id(d)] = (_ref(d), owner, scope)
        return record

    def _new_record(self, tid: int, hid: int, fn: Any, kind: str, owner: Any, scope: str) -> Record:
        with_kwargs, always_call = (
            dicts.module_flags(owner, kind, hid) if scope != "tensor" else (False, False)
        )
        record = Record(
            id=tid,
            kind=kind,
            scope=scope,
            owner=owner,
            name=sites.hook_name(fn),
            defined_at=sites.defined_at(fn),
            with_kwargs=with_kwargs,
            always_call=always_call,
        )
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
            owner,
            scope == "global" or (kind in _MODULE_FIRST and scope == "module"),
        )
        if kind in _STATE_KINDS and hasattr(fn, "_from_public_api"):  # state_dict() reads it
            shim._from_public_api = fn._from_public_api
        shim.__wrapped__ = fn
        return shim

    # -- module and global hooks: views -------------------------------------------------
    def view(self, d: dict, owner: Any, attr: str) -> dict:
        """What PyTorch's copied code iterates instead of `d`: the same keys, each hook's shim."""
        if not d:
            return d
        cache = self._views.get(id(d))
        if cache is None:
            cache = self._views[id(d)] = {}
        out = {}
        fresh = False
        for hid, fn in d.items():
            entry = cache.get(hid)
            if entry is None or entry[0] is not fn:
                kind = dicts.kind_of(attr, owner)
                record = self.record(d, hid, fn, kind, owner, "global" if owner is None else "module")
                entry = cache[hid] = (fn, self._shim(record, fn, owner))
                fresh = True
            out[hid] = entry[1]
        if fresh:
            self.infer_prepends(d)
        return out

    # -- tensor hooks: shims in place ---------------------------------------------------
    def wrap_tensor_hook(self, d: dict, hid: int, kind: str, tensor: Any) -> Record:
        fn = d[hid]
        entry = self.tensor_shims.get(id(fn))
        if entry is not None and entry[0]() is fn:  # already ours
            return self.records[entry[2]]
        record = self.record(d, hid, fn, kind, None, "tensor")
        if record.tensor_ref is None:
            record.tensor_ref = weak(tensor)
        shim = self._shim(record, fn, None)
        key = id(shim)
        table = self.tensor_shims
        # the shim dies with its tensor's dict, and leaves the table then
        table[key] = (weakref.ref(shim, lambda _r: table.pop(key, None)), _ref(d), record.id)
        d[hid] = shim
        return record

    def unwrap(self, d: dict) -> None:
        """Put the original tensor hooks back, in place (same keys, same order)."""
        table = self.tensor_shims
        for hid, value in list(d.items()):
            entry = table.get(id(value))
            if entry is not None and entry[0]() is value:
                d[hid] = value.__wrapped__

    def kind_and_owner(self, tid: int) -> tuple[Optional[str], Any]:
        record = self.records.get(tid)
        return (record.kind, record.owner) if record is not None else (None, None)

    def clear(self) -> None:
        self.records.clear()
        self.sites.clear()
        self._ids.clear()
        self._first_dict.clear()
        self._views.clear()
        self.seen_dicts.clear()
        self.tensor_shims.clear()
