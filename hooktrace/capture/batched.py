"""The hook book's reads and writes over many dicts at once: the views a session adopts from what
the process kept (capture/kept.py), and the end's check that the module dicts hold what their last
views saw (capture/ending.py). C-level passes (`map`, `zip`, `chain`) over all the dicts and their
hooks together, where a Python loop per dict or per hook cost most of a session's start and end.
"""

from __future__ import annotations

import dataclasses
import types
import weakref
from collections import deque
from functools import partial
from itertools import chain, compress, repeat
from operator import add, attrgetter, contains, gt, is_, itemgetter, methodcaller, mul, not_
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

from ..kinds import MODULE, TENSOR
from . import hookapis, shims, sites
from .build import Record
from .returned import SAME, _same_first

_new = object.__new__
# every field of a Record in its order, the default where there is one (id, kind and scope are set)
_RECORD_DEFAULTS = {
    f.name: None if f.default is dataclasses.MISSING else f.default for f in dataclasses.fields(Record)
}
# what a tensor hook's record has that is not its own (its id, kind, name, place, tensor)
_TENSOR_RECORD = {
    **_RECORD_DEFAULTS,
    "scope": TENSOR,
    "owner": None,
    "with_kwargs": False,
    "always_call": False,
}
_FUNCTION = types.FunctionType
_qualname, _code, _closure = attrgetter("__qualname__"), attrgetter("__code__"), attrgetter("__closure__")
_wrapped, _removed, _tensor_ref = attrgetter("__wrapped__"), attrgetter("removed"), attrgetter("tensor_ref")
_call = methodcaller("__call__")
_dtype_and_device = attrgetter("dtype", "device")
_run: Callable[[Any], None] = deque(maxlen=0).extend  # runs an iterator to its end
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)
_parameters_of, _modules_of, _items = (
    methodcaller("get", "_parameters"),
    methodcaller("get", "_modules"),
    methodcaller("items"),
)
_name = attrgetter("__name__")
# the type's own values(): an OrderedDict's in its order (dict.values would read the hash table's)
_values = methodcaller("values")


def named_params(named: list[tuple[str, Any]]) -> list[tuple[str, tuple[str, Any]]]:
    """(path, (name, parameter)) of every module's `_parameters`, modules in the order of `named`
    ((path, module) pairs), as each module's dict gives them: C-level passes, no loop per parameter."""
    helds = [*map(_parameters_of, map(vars, map(_second, named)))]
    return [
        *chain.from_iterable(
            map(zip, map(repeat, compress(map(_first, named), helds)), map(_items, filter(None, helds)))
        )
    ]


def module_keys(rec: shims.Recorder, modules: list[Any]) -> list[int]:
    """`[rec.module_key(m) for m in modules]`. Modules the recorder has not met (a session's start) are
    keyed together, by C-level passes, as `Recorder.key` keys each (their ids, a weak reference
    that retires the key when the module dies); torch.compile's wrapper, a module met before, one
    twice or without weak references: each on its own."""
    ids = [*map(id, modules)]
    if (
        len({*ids}) == len(ids)
        and rec.module_ids.keys().isdisjoint(ids)
        and rec.ids.keys().isdisjoint(ids)
        and rec.retired.isdisjoint(ids)
    ):
        try:
            children = [*map(_modules_of, map(vars, modules))]
            if not any(map(contains, filter(None, children), repeat("_orig_mod"))):
                refs = [*map(weakref.ref, modules, map(partial, repeat(rec._died), ids, ids))]
                rec.ids.update(zip(ids, ids))
                rec.types.update(zip(ids, map(_name, map(type, modules))))
                rec.modules += refs
                rec.module_ids.update(zip(ids, ids))
                return ids
        except TypeError:  # a module with no __dict__ or no weak references
            pass
    return [*map(rec.module_key, modules)]


def _ref(d: dict) -> Callable[[], Optional[dict]]:
    """A weak reference when the dict allows one (OrderedDict does), else a strong one."""
    try:
        return weakref.ref(d)
    except TypeError:
        return lambda: d


def _state(d: dict) -> list:
    """The dict's keys, then the ids of its hooks: what a view was made from."""
    try:
        return [*d, *map(id, d.values())]
    except RuntimeError:  # another thread changed the dict between the two reads: read it once
        items = [*d.items()]
        return [*(k for k, _ in items), *(id(v) for _, v in items)]


class Batched:
    """What HookBook (capture/records.py) does over many dicts at once, and what kept.py asks of it."""

    rec: shims.Recorder
    records: dict[int, Record]
    sites: dict[int, Any]
    counts: dict[int, int]
    seen_dicts: dict[int, tuple[Any, Any, str]]
    _path_of: Callable[[Any], Optional[str]]
    _ids: dict[tuple[int, int], int]
    _first_dict: dict[int, int]
    _views: dict[tuple[int, int], dict[int, tuple[Any, Any]]]
    _last_views: dict[tuple[int, int], tuple[list, dict, Optional[list[int]]]]
    tensor_shims: dict[int, tuple[Any, Any, int]]
    _places: dict[Any, Optional[str]]
    model_params: dict[int, tuple[Any, str, str]]
    param_records: list[Record]

    def mark_param(self, record: Record, tensor: Any) -> None:  # HookBook's
        raise NotImplementedError

    def infer_prepends(self, d: dict) -> None:  # HookBook's
        raise NotImplementedError

    def unwrap_all(self, ds: Sequence[dict]) -> Optional[list[int]]:
        """`unwrap` each tensor dict, in order, and give the trace ids of their hooks (as `_settle`
        records them after it), when every hook in them is a live shim of this capture standing for
        a hook it has a record of with its tensor, none removed, none a multi-grad hook's: C-level
        checks, then the writes. Else None, and nothing done."""
        try:
            hids = [*chain.from_iterable(ds)]
            values = [*chain.from_iterable(map(_values, ds))]
        except RuntimeError:  # another thread changed a dict meanwhile
            return None
        entries: list[Any] = [*map(self.tensor_shims.get, map(id, values))]
        if len(values) != len(hids) or None in entries:
            return None
        if not all(map(is_, map(_call, map(_first, entries)), values)):
            return None
        fns = [*map(_wrapped, values)]
        functions = compress(fns, map(is_, map(type, fns), repeat(_FUNCTION)))
        counts = [*map(len, ds)]
        tids: list[Any] = [
            *map(self._ids.get, zip(chain.from_iterable(map(repeat, map(id, ds), counts)), hids))
        ]
        records = [*map(self.records.get, map(_third, entries))]
        if (
            not hookapis.inner_codes().isdisjoint(map(_code, functions))
            or None in tids
            or any(map(is_, records, repeat(None)))  # (`in` would run a record's __eq__)
            or any(map(_removed, records))
            or any(map(is_, map(self.records.get, tids), repeat(None)))
            or any(map(is_, map(_tensor_ref, map(self.records.__getitem__, tids)), repeat(None)))
        ):
            return None
        for d, hid, value, fn in zip(chain.from_iterable(map(repeat, ds, counts)), hids, values, fns):
            if d.get(hid) is value:
                d[hid] = fn
        for d in compress(ds, map(gt, counts, repeat(1))):  # one hook stands before no other
            self.infer_prepends(d)
        return tids

    def _mark_params(self, records: list[Record], tensors: list[Any]) -> None:
        """`mark_param(record, tensor)` of each new record: by C-level passes when every tensor is one
        of the model's parameters, a plain tensor (no `__torch_function__`: its dtype and device are
        read without user code, as `dtype_and_device` reads them)."""
        known: list[Any] = [*map(self.model_params.get, map(id, tensors))]
        if (
            None in known
            or not all(map(is_, map(_call, map(_first, known)), tensors))
            or not all(map(isinstance, tensors, repeat(torch.Tensor)))
            or any(map(torch.overrides.has_torch_function, zip(tensors)))
        ):
            _run(map(self.mark_param, records, tensors))
            return
        placed = map(_dtype_and_device, tensors)
        _run(map(setattr, records, repeat("param_of"), zip(map(_second, known), map(_third, known), placed)))
        self.param_records += records

    def wrap_tensor_dicts(self, run: list[tuple[dict, str, Any]]) -> bool:
        """`wrap_tensor_hook` of each hook of each tensor dict (d, kind, tensor) of the run, then
        `infer_prepends(d)`, as roots.record_held does dict by dict: all at once, by C-level passes,
        when every hook is a plain function (no closure, no `__wrapped__`, not a multi-grad hook's)
        the capture has not met, in dicts met once, of kinds one shim factory serves. Else False,
        and nothing done."""
        ds, kinds, tensors = zip(*run)
        counts = [*map(len, ds)]
        dict_ids = [*map(id, ds)]
        try:
            hids = [*chain.from_iterable(ds)]
            fns = [*chain.from_iterable(map(_values, ds))]
            hook_kinds = [*chain.from_iterable(map(repeat, kinds, counts))]
            arities = {*map(shims.ARITY.get, hook_kinds)}
            if (
                len(run) < 2
                or len(fns) != len(hids)
                or len({*dict_ids}) != len(ds)
                or len({*hids}) != len(hids)
                or len(arities) != 1
                or not all(map(is_, map(type, fns), repeat(_FUNCTION)))
                or not all(map(is_, map(_closure, fns), repeat(None)))
                or any(map(contains, map(vars, fns), repeat("__wrapped__")))
                or not hookapis.inner_codes().isdisjoint(map(_code, fns))
                or not self.tensor_shims.keys().isdisjoint(map(id, fns))
                or not self.fresh_ids(hids)
            ):
                return False
            tensor_refs = [*map(weakref.ref, tensors)]
            dict_refs = [*map(weakref.ref, ds)]
        except (TypeError, RuntimeError):  # no weak reference, or a dict changed meanwhile
            return False
        codes = [*map(_code, fns)]
        places = self._places
        for code, fn in dict(zip(reversed(codes), reversed(fns))).items():  # each code's first hook
            if code not in places:
                places[code] = sites.defined_at(fn)
        made = [*map(_new, repeat(Record, len(hids)))]
        _run(map(dict.update, map(vars, made), repeat(_TENSOR_RECORD)))
        for field, values in (("id", hids), ("kind", hook_kinds), ("name", map(_qualname, fns))):
            _run(map(setattr, made, repeat(field), values))
        _run(map(setattr, made, repeat("defined_at"), map(places.__getitem__, codes)))
        dict_of_hook = [*chain.from_iterable(map(repeat, dict_ids, counts))]
        self._first_dict.update(zip(hids, dict_of_hook))
        self._ids.update(zip(zip(dict_of_hook, hids), hids))
        self.counts.update(zip(dict_ids, map(add, map(self.counts.get, dict_ids, repeat(0)), counts)))
        self.records.update(zip(hids, made))
        new = [*map(not_, map(self.seen_dicts.__contains__, dict_ids))]
        self.seen_dicts.update(
            zip(compress(dict_ids, new), zip(compress(dict_refs, new), repeat(None), repeat(TENSOR)))
        )
        _run(map(setattr, made, repeat("tensor_ref"), chain.from_iterable(map(repeat, tensor_refs, counts))))
        if self.model_params:
            self._mark_params(made, [*chain.from_iterable(map(repeat, tensors, counts))])
        factory = self.rec._factories[arities.pop()]
        same = map(SAME.get, hook_kinds, repeat(_same_first))
        made_shims = [*map(factory, fns, hids, repeat(None), repeat(False), same, hook_kinds)]
        _run(map(setattr, made_shims, repeat("__wrapped__"), fns))
        table = self.tensor_shims
        keys = [*map(id, made_shims)]
        # each shim dies with its tensor's dict, and leaves the table then
        shim_refs = map(weakref.ref, made_shims, map(partial, repeat(table.pop), keys))
        table.update(zip(keys, zip(shim_refs, chain.from_iterable(map(repeat, dict_refs, counts)), hids)))
        ds_of_hook = chain.from_iterable(map(repeat, ds, counts))
        for d, hid, fn, shim, record in zip(ds_of_hook, hids, fns, made_shims, made):
            if d.get(hid) is fn:
                d[hid] = shim
                if record.removed:  # its handle removed it on another thread between the read and the write
                    d.pop(hid, None)
        for d in compress(ds, map(gt, counts, repeat(1))):  # one hook stands before no other
            self.infer_prepends(d)
        return True

    def has_view(self, d: dict, owner: Any) -> bool:
        return (id(d), id(owner)) in self._last_views

    state_of = staticmethod(_state)

    def fresh_ids(self, hids: list[int]) -> bool:
        """No dict seen so far holds these hook ids, no registration site is known for them and none
        has a record yet: their trace ids are their handle ids, and records come from templates."""
        return (
            self._first_dict.keys().isdisjoint(hids)
            and self.sites.keys().isdisjoint(hids)
            and self.records.keys().isdisjoint(hids)
        )

    def templates(self, d: dict, hids: list[int]) -> Optional[list[dict]]:
        """The records of `d`'s hooks as they stand (no live object in them), or None when one of
        them has a registration site or a copy's id, or was removed meanwhile."""
        out = []
        for hid in hids:
            record = self.records.get(self._ids.get((id(d), hid), -1))
            if record is None or record.id != hid or hid in self.sites or record.removed:
                return None
            out.append({**record.__dict__, "owner": None})
        return out

    @staticmethod
    def naming(template: dict, fn: Any) -> dict:
        return {**template, "name": sites.hook_name(fn), "defined_at": sites.defined_at(fn)}

    def has_any_view(self, ds: Sequence[dict], owners: Sequence[Any]) -> bool:
        return not self._last_views.keys().isdisjoint(zip(map(id, ds), map(id, owners)))

    def adopt_views(
        self,
        ds: Sequence[dict],
        owners: Sequence[Any],
        states: list[list],
        views: list[dict],
        hid_lists: list[list[int]],
        templates: Iterable[dict],
    ) -> None:
        """`adopt_view` of each dict, in order, with records from `templates` (those of all the dicts'
        hooks, in order): C-level passes over the dicts and their hooks, no Python loop."""
        keys = [*zip(map(id, ds), map(id, owners))]
        _run(map(self._views.pop, keys, repeat(None)))
        self._last_views.update(zip(keys, zip(states, views, hid_lists)))
        owner_keys: list[Any] = [*map(self.rec.ids.get, map(id, owners))]  # `rec.key` of each, all keyed
        whos = (
            [*zip(owner_keys, map(_name, map(type, owners)))]
            if None not in owner_keys
            else [*map(self.rec.who, owners)]
        )
        _run(map(self._path_of, dict(zip(map(id, owners), owners)).values()))  # each module once
        dkeys = [*map(id, ds)]
        counts = [*map(len, hid_lists)]
        hids = [*chain.from_iterable(hid_lists)]
        dict_of_hook = [*chain.from_iterable(map(repeat, dkeys, counts))]
        made = [*map(_new, repeat(Record, len(hids)))]
        _run(map(dict.update, map(vars, made), templates))
        _run(map(setattr, made, repeat("owner"), chain.from_iterable(map(repeat, whos, counts))))
        self.records.update(zip(hids, made))
        self._ids.update(zip(zip(dict_of_hook, hids), hids))
        self._first_dict.update(zip(hids, dict_of_hook))
        known = self.counts
        known.update(zip(dkeys, map(add, map(known.get, dkeys, repeat(0)), counts)))
        seen = self.seen_dicts
        new = [*map(not_, map(seen.__contains__, dkeys))]
        if any(new):
            refs = map(_ref, compress(ds, new))
            seen.update(zip(compress(dkeys, new), zip(refs, compress(whos, new), repeat(MODULE))))

    def adopt_view(
        self, d: dict, owner: Any, state: list, view: dict, hids: list[int], records: Optional[list[dict]]
    ) -> None:
        """The view of `d` is `view` (hook id -> shim, in the dict's order; `hids`, its keys, are the
        hooks' trace ids); `records`: the hooks' records as templates (None: the book made them). A
        view made again in the session (the dict changed) makes shims of its own for every hook."""
        key = (id(d), id(owner))
        self._views.pop(key, None)
        self._last_views[key] = (state, view, hids)
        if records is None:
            return
        who = self.rec.who(owner)
        self._path_of(owner)
        dkey = id(d)
        new, by_id, ids, first = _new, self.records, self._ids, self._first_dict
        for hid, template in zip(hids, records):
            record = by_id[hid] = new(Record)
            fields = record.__dict__
            fields.update(template)
            fields["owner"] = who
            ids[(dkey, hid)] = hid
            first[hid] = dkey
        self.counts[dkey] = self.counts.get(dkey, 0) + len(hids)
        if dkey not in self.seen_dicts:
            self.seen_dicts[dkey] = (_ref(d), who, MODULE)

    def all_unchanged_ids(self, ds: Sequence[dict], owners: Sequence[Any]) -> Optional[list[list[int]]]:
        """`unchanged_ids` of each dict when none of them is None, else None: C-level passes over the
        dicts (their keys and hooks' ids, together, against their last views')."""
        lasts: list[Any] = [*map(self._last_views.get, zip(map(id, ds), map(id, owners)))]
        if None in lasts:
            return None
        tids = [*map(_third, lasts)]
        states = [*map(_first, lasts)]
        if None in tids or [*map(len, states)] != [*map(mul, map(len, ds), repeat(2))]:
            return None
        try:  # each dict's keys, then its hooks' ids (`_state`), one dict after another
            now = [*chain.from_iterable(map(chain, ds, map(map, repeat(id), map(_values, ds))))]
        except RuntimeError:  # another thread changed a dict meanwhile: each is read on its own
            return None
        return tids if [*chain.from_iterable(states)] == now else None
