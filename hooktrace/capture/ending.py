"""The end of a capture: one walk over every hook dict, then the snapshot the trace is built from.

The capture (capture/core.py) orchestrates; this is what it holds at the end, read once.
"""

from __future__ import annotations

import dataclasses
import platform
from collections import deque
from functools import partial
from itertools import chain, compress, repeat
from operator import and_, attrgetter, eq, is_, is_not, itemgetter, methodcaller, not_
from typing import Any, Callable, Optional

import torch

from ..kinds import MODULE, NODE, TENSOR
from ..schema import Meta, Module
from . import batched, build, dicts, hookapis, roots, shims
from .records import HookBook
from .tensors import dtype_and_device, hook_place, weak

# read over many dicts, records and modules by C-level calls (map), not a Python loop over them
_call = methodcaller("__call__")  # a weak reference's (or records._ref's strong stand-in's) object
_first, _second = itemgetter(0), itemgetter(1)
_not_none = partial(is_not, None)
_name = attrgetter("__name__")
_tensor_ref, _node_of, _owner = attrgetter("tensor_ref"), attrgetter("node_of"), attrgetter("owner")
_scope = attrgetter("scope")
# a record's fields (not kinds): set on plain records by C-level passes, as hook_place would
_MODULE_FIELD = "module"  # not a kind
_CLEARED_FIELDS = ("tensor", "owner", "tensor_ref", "tensor_desc")  # not a kind
_OWN_SCOPE = {TENSOR: False, NODE: False}  # scopes whose hooks are placed by their tensor: not plain
_run: Callable[[Any], None] = deque(maxlen=0).extend  # runs an iterator to its end


@dataclasses.dataclass
class Final:
    """What the walk over every hook dict at the end of the capture found."""

    paths: dict[int, str] = dataclasses.field(default_factory=dict)  # id(module) -> path
    modules: list[Module] = dataclasses.field(default_factory=list)
    params: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)  # id -> (path, name)
    order: list[int] = dataclasses.field(default_factory=list)  # trace hook ids in firing order
    seen: set[int] = dataclasses.field(default_factory=set)  # ids of the dicts settled
    # trace ids of hooks taken out of a dict that is still alive without their handle's remove()
    # (remove_spectral_norm and weight-norm removal delete their state-dict hooks from the dicts)
    deleted: set[int] = dataclasses.field(default_factory=set)
    # ids of dicts that hold every hook the capture saw in them, as their last view saw them
    unchanged: set[int] = dataclasses.field(default_factory=set)
    # trace id -> (path, name) of a hook on a parameter that the model now holds another tensor in place
    # of, on another device or of another dtype: a move made it (to or from `meta`)
    replaced: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)


def modules_of(rec: shims.Recorder, model: Any) -> tuple[list[tuple[str, Any]], list[Any]]:
    """(path, module) for the trace, and its roots: the model's (`roots.model_modules`), or, with no
    model, those of the roots (the modules of outermost calls, capture/roots.py)."""
    if isinstance(model, torch.nn.Module):
        return roots.model_modules(model), [model]
    found = roots.of_calls(rec) if model is None else []
    return roots.named_modules(found), found


def walk(book: HookBook, rec: shims.Recorder, model: Any, named: list[tuple[str, Any]]) -> Final:
    """One walk over every hook dict at the end of the capture.

    Hooks that never fired still belong in the trace, and the final dict order proves prepends:
    each dict gets a record for every hook it holds, tensor dicts get their original objects back
    (module and global dicts were never changed), and the walk gives module paths, parameter names
    and the hooks in the order PyTorch fires them (global dicts, each module's, the parameters').
    """
    final = Final()
    # `named` is the model's modules (roots.model_modules) or, with no model, the roots' (the same
    # dicts `dicts.hook_dicts(model)` reads; a model that is no module has only the global ones)
    run: list[dicts.HookDict] = []  # consecutive module dicts, or consecutive tensor dicts
    for hd in dicts.hook_dicts_in([m for _, m in named]):
        if hd.scope == MODULE or hd.scope == TENSOR:
            if run and run[-1].scope != hd.scope:
                _settle_run(book, run, final)
                run = []
            run.append(hd)
            continue
        if run:
            _settle_run(book, run, final)
            run = []
        _settle(book, hd.d, hd.kind, hd.owner, hd.scope, final, hd.tensor)
    if run:
        _settle_run(book, run, final)
    seen = [*book.seen_dicts.values()]  # dicts outside the model now: those not settled above
    found = [*map(_call, map(_first, seen))]
    outside = map(
        and_, map(is_not, found, repeat(None)), map(not_, map(final.seen.__contains__, map(id, found)))
    )
    for d, (_ref, _owner, scope) in compress(zip(found, seen), [*outside]):
        final.seen.add(id(d))
        if scope in dicts.IN_PLACE_SCOPES:
            book.unwrap(d)
        book.infer_prepends(d)
    final.deleted = book.deleted(final.unchanged)
    final.order.extend(book.api_held)  # held outside any dict (FSDP's comm hooks): registered still
    # names of the parameters some hook was on (hook_place): only those are looked for
    refs = filter(_not_none, map(_tensor_ref, book.records.values()))
    wanted = {*map(id, filter(_not_none, map(_call, refs)))}
    paths, params = final.paths, final.params
    modules = [m for _, m in named]
    keys: list[Any] = [*map(rec.ids.get, map(id, modules))]  # rec.key(m) of each, all known by now
    if None in keys:
        keys = [*map(rec.key, modules)]
    paths.update(zip(keys, map(_first, named)))
    wrapper = model if roots.compiled_inner(model) is not None else None
    if wrapper is None:
        final.modules = [*map(Module, map(_first, named), map(_name, map(type, modules)))]
    else:  # torch.compile's wrapper is named as the module it wraps: not a module of its own
        final.modules = [Module(path, type(m).__name__) for path, m in named if m is not wrapper]
    # hooks on a parameter of the model (when the capture met it): the model's by name, to see a move
    earlier = book.param_records
    if not wanted and not earlier:
        return final
    held = batched.named_params(named)  # (path, (name, parameter)) of every module's parameters
    named_params = [*map(_second, held)]
    if wanted:
        param_ids = [*map(id, map(_second, named_params))]
        hit = [*map(wanted.__contains__, param_ids)]
        where = zip(compress(map(_first, held), hit), compress(map(_first, named_params), hit))
        _run(map(params.setdefault, compress(param_ids, hit), where))  # the first name of each
    if earlier:
        now = dict(zip(zip(map(_first, held), map(_first, named_params)), map(_second, named_params)))
        for r in earlier:
            # another tensor by its name, on another device or of another dtype: a move made it (a
            # parameter the user assigned anew on the same device is no move); the old one may be gone
            path, pname, placed = r.param_of  # type: ignore[misc]
            new = now.get((path, pname))
            old = r.tensor_ref() if r.tensor_ref is not None else None
            if new is not None and new is not old and dtype_and_device(new) != placed:
                final.replaced[r.id] = (path, pname)
    return final


def _settle_run(book: HookBook, run: list[dicts.HookDict], final: Final) -> None:
    """`_settle` each dict of the run (module dicts or tensor dicts), in order; all at once when each
    module dict holds what its last view saw, or each tensor dict only this capture's shims of hooks
    it knows (the usual end: C-level passes over the dicts, no Python code per dict)."""
    ds, _kinds, owners, scopes, _tensors = zip(*run)
    dict_ids = [*map(id, ds)]
    if (
        len(run) > 1
        and len({*dict_ids}) == len(run)
        and final.seen.isdisjoint(dict_ids)
        and scopes[0] == TENSOR
    ):
        tids = book.unwrap_all(ds)  # each dict's hooks back in place, their records as they are
        if tids is not None:
            final.seen.update(dict_ids)
            final.order += tids
            # each of those hooks has its trace id: one that holds as many as the capture saw lost none
            final.unchanged.update(compress(dict_ids, map(eq, map(len, ds), map(book.counts.get, dict_ids))))
            return
    elif len(run) > 1 and len({*dict_ids}) == len(run) and final.seen.isdisjoint(dict_ids):
        known = book.all_unchanged_ids(ds, owners)
        if known is not None:
            final.seen.update(dict_ids)
            final.order += chain.from_iterable(known)
            # and no other hook was seen in it
            final.unchanged.update(
                compress(dict_ids, map(eq, map(len, known), map(book.counts.get, dict_ids)))
            )
            return
    for d, kind, owner, scope, tensor in run:
        _settle(book, d, kind, owner, scope, final, tensor)


def _settle(
    book: HookBook, d: dict, kind: str, owner: Any, scope: str, final: Final, tensor: Any = None
) -> None:
    if not d or id(d) in final.seen:
        return
    final.seen.add(id(d))
    if scope == TENSOR:
        book.unwrap(d)
    elif scope == MODULE:
        known = book.unchanged_ids(d, owner)
        if known is not None:  # as its last view saw it: every hook has its record, its prepend inferred
            final.order.extend(known)
            if len(known) == book.counts.get(id(d)):  # and no other hook was seen in it
                final.unchanged.add(id(d))
            return
    for hid, fn in [*d.items()]:  # one read: other threads may still register or remove
        if scope == TENSOR and hookapis.is_inner_hook(fn):  # a multi-grad hook's: not a hook of its own
            continue
        record = book.record(d, hid, fn, kind, owner, scope)
        if tensor is not None and record.tensor_ref is None:
            record.tensor_ref = weak(tensor)
        final.order.append(record.id)
    book.infer_prepends(d)


def snapshot(
    book: HookBook,
    rec: shims.Recorder,
    meta: Meta,
    start_ns: int,
    paths: dict[int, str],
    found_roots: list[Any],
    final: Optional[Final],
) -> build.Pending:
    """What the trace is built from, with no reference left to a module, tensor or hook."""
    final = final or Final()
    paths = {**paths, **final.paths}
    paths.update(roots.outside_paths(rec, paths))  # modules called inside the model, not part of it
    for wrapper, inner in rec.wrappers.items():  # a global hook's call for torch.compile(m): m's
        if inner in paths:
            paths.setdefault(wrapper, paths[inner])
    records = build.ordered(book.records, final.order)
    alive: Optional[set[int]] = None  # read when a node hook asks
    replaced: set[int] = set()
    replaced_params: dict[int, str] = {}
    # a module or global hook's record (not on a node): its module is its owner's path, no tensor
    plain = [
        *map(
            and_,
            map(is_, map(_node_of, records), repeat(None)),
            map(_OWN_SCOPE.get, map(_scope, records), repeat(True)),
        )
    ]
    placed = [*compress(records, plain)]
    owners = [*map(_owner, placed)]
    if None in owners:
        modules: Any = [paths.get(o[0]) if o is not None else None for o in owners]
    else:
        modules = map(paths.get, map(_first, owners))
    _run(map(setattr, placed, repeat(_MODULE_FIELD), modules))
    for field in _CLEARED_FIELDS:
        _run(map(setattr, placed, repeat(field), repeat(None)))
    for r in compress(records, map(not_, plain)):
        tensor = r.tensor_ref() if r.tensor_ref is not None else None
        # PyTorch drops a parameter's AccumulateGrad node when the parameter moves to another dtype or
        # device (`Variable.set_data`) while the node lives: a node still alive (its hook dict is)
        # whose parameter moved is no longer the one backward runs
        if r.node_of is not None and tensor is not None:
            alive = book.live_dict_ids() if alive is None else alive
            now = dtype_and_device(tensor) if r.id in alive else None
            if now is not None and now != r.node_of:
                replaced.add(r.id)
        r.module, r.tensor = hook_place(r.scope, r.owner, tensor, r.tensor_desc, paths, final.params)
        moved = final.replaced.get(r.id) if final.replaced else None
        if moved is not None and r.scope in (TENSOR, NODE):  # named as the parameter it was on
            r.module, r.tensor = moved[0], f"{moved[0]}.{moved[1]}" if moved[0] else moved[1]
            replaced_params[r.id] = r.tensor
        r.owner = r.tensor_ref = r.tensor_desc = None
    meta.torch = str(torch.__version__)  # not TorchVersion: the trace holds plain values
    meta.python = platform.python_version()
    meta.steps = rec.steps
    meta.device = build.device_of(found_roots[0] if found_roots else None)
    return build.Pending(
        meta=meta,
        start_ns=start_ns,
        modules=final.modules,
        records=records,
        paths=paths,
        hook_calls=rec.hooks,
        n_hook_calls=len(rec.hooks),
        module_calls=rec.calls,
        n_module_calls=len(rec.calls),
        step_starts=rec.step_starts,
        compiled=rec.compiled,
        deleted=final.deleted,
        replaced_nodes=replaced,
        replaced_params=replaced_params,
        in_backward=rec.in_backward,
        shapes=rec.shapes,
    )
