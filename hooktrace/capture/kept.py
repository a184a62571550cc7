"""Per process: the shims and records of module forward hooks that a later session finds unchanged.

A session makes a record and a shim for every hook the model holds as it opens (roots.record_held).
For a module's forward pre-hook and forward hook dicts, what it made is kept for the process, keyed
by the dict and its module, so that the next session over the same dict, holding the same hook
objects under the same ids in the same order, copies each record from its template and takes the
shim it had: no naming, no new function objects, nothing new for the garbage collector to walk.

What is kept holds no user object: the dict, the module and each hook by weak reference (an entry
goes when its dict or module does), the records' templates only ints and strings. A kept shim holds
its hook while a session is open, as any shim does; when the session ends its hook's cell is given
a weak proxy instead, and the hook is set in it again by the next session that finds it unchanged.
These shims write into a namespace of this process that the open session binds to its own lists
(`bind`) and that its end gives back to a sink. Forward and pre-hooks only: PyTorch calls them from
the view while the module call runs, and keeps no list of them for later (backward hooks it does).
A dict that changed, a hook that is not a plain function, a registration site known for one of its
hooks, or a hook id held by another dict first: that dict takes the session's usual path.
Consecutive kept dicts (a model's modules one after another) are taken together when all of them
hold what they held (`prewarm_dicts`): each check is one C-level pass over all the dicts and their
hooks, not Python code per dict; when one of them changed, each is taken on its own as before.
"""

from __future__ import annotations

import itertools
import os
import types
import weakref
from collections import deque
from itertools import chain, repeat
from operator import attrgetter, contains, eq, is_, methodcaller
from typing import Any, Callable, Iterable, Optional

from ..kinds import TENSOR, K
from . import shims
from .returned import SAME, _same_first

_KINDS = frozenset({K.forward_pre, K.forward})
_FUNCTION = types.FunctionType


def _drop(_record: Any) -> None:
    return None


# what the kept shims write into when no session is open
_SINK = {"counter": itertools.count(), "main": 0, "append": _drop, "module_ids": {}, "note": _drop}
_SPACES: dict[bool, dict[Optional[int], tuple[dict, Callable[..., Any]]]] = {}  # shapes -> arity -> ...


def _spaces(shapes: bool) -> dict[Optional[int], tuple[dict, Callable[..., Any]]]:
    found = _SPACES.get(shapes)
    if found is None:
        found = {}
        for arity, codes in (*shims._POSITIONAL_CODES.items(), (None, shims._GENERIC_CODE)):
            namespace = {**shims.constants(), **_SINK}
            exec(codes[shapes], namespace)  # noqa: S102 - defines `factory` over this process's namespace
            found[arity] = (namespace, namespace.pop("factory"))
        _SPACES[shapes] = found
    return found


class _Hook:
    __slots__ = ("ref", "shim", "cell", "proxy", "template", "qualname", "code")
    ref: Any  # weakref to the hook
    shim: Any
    cell: Any  # the shim's cell holding the hook (or, between sessions, `proxy`)
    proxy: Any
    template: dict  # the record's fields, owner None
    qualname: str
    code: Any


class _Entry:
    __slots__ = ("dref", "oref", "state", "module_id", "hooks", "hids", "view", "cwd")
    dref: Any
    oref: Any
    state: list  # records._state of the dict when kept
    module_id: int
    hooks: list[_Hook]
    hids: list[int]
    view: dict  # hook id -> shim
    cwd: str


# read over many dicts and hooks by C-level calls (map), not a Python loop per hook
_call = weakref.ref.__call__
_qualname, _code, _closure = attrgetter("__qualname__"), attrgetter("__code__"), attrgetter("__closure__")
_ref, _cell, _shim, _template = (
    attrgetter("ref"),
    attrgetter("cell"),
    attrgetter("shim"),
    attrgetter("template"),
)
_hook_qualname, _hook_code = attrgetter("qualname"), attrgetter("code")
_dref, _oref, _cwd, _module_id = (
    attrgetter("dref"),
    attrgetter("oref"),
    attrgetter("cwd"),
    attrgetter("module_id"),
)
_hids, _hooks, _state, _view = (
    attrgetter("hids"),
    attrgetter("hooks"),
    attrgetter("state"),
    attrgetter("view"),
)
_run: Callable[[Any], None] = deque(maxlen=0).extend  # runs an iterator to its end
# the type's own values(): an OrderedDict's in its order (dict.values would read the hash table's)
_values = methodcaller("values")
_proxy, _drop_wrapped = attrgetter("proxy"), methodcaller("pop", "__wrapped__", None)


_ENTRIES: dict[tuple[int, int, bool], _Entry] = {}  # (id(dict), id(module), shapes) -> entry


def _evict(key: tuple[int, int, bool], ref: Any) -> None:
    entry = _ENTRIES.get(key)
    if entry is not None and (entry.dref is ref or entry.oref is ref):
        del _ENTRIES[key]


class Kept:
    """One session's use of what the process kept: `bind` as it opens, `release` as it ends."""

    def __init__(self, rec: shims.Recorder) -> None:
        self.rec = rec
        self.shapes = rec.shapes is not None
        self.used: list[_Entry] = []
        self.cwd = ""

    def bind(self, ledger: Any) -> None:
        """The kept shims write into this session's lists until the ledger's restore reaches `release`."""
        self.cwd = os.getcwd()
        bindings = self.rec.bindings()
        for namespace, _ in _spaces(self.shapes).values():
            namespace.update(bindings)
        ledger.on_restore(self.release)

    def release(self) -> None:
        """The session is over: the kept shims write into the sink, and hold their hooks weakly again."""
        for namespace, _ in _spaces(self.shapes).values():
            namespace.update(_SINK)
        hooks = [*chain.from_iterable(map(_hooks, self.used))]
        _run(map(setattr, map(_cell, hooks), repeat("cell_contents"), map(_proxy, hooks)))
        _run(map(_drop_wrapped, map(vars, map(_shim, hooks))))
        self.used = []

    def prewarm_dicts(self, book: Any, hds: Iterable[Any], tensor: Callable[[dict, str, Any], None]) -> None:
        """`prewarm` each module or global dict of `hds` (dicts.HookDict) in order, `tensor(d, kind,
        tensor)` each tensor dict. Consecutive dicts the process kept are taken together
        (`_reuse_run`), and so are consecutive tensor dicts (HookBook.wrap_tensor_dicts)."""
        run: list[tuple[dict, Any, str, _Entry]] = []  # consecutive dicts with a kept entry
        tensors: list[tuple[dict, str, Any]] = []  # consecutive tensor dicts
        entries, shapes = _ENTRIES, self.shapes
        for d, kind, owner, scope, _tensor in hds:
            if scope == TENSOR:
                if run:
                    self._reuse_run(book, run)
                    run = []
                tensors.append((d, kind, _tensor))
                continue
            if tensors:
                _wrap_run(book, tensors, tensor)
                tensors = []
            if kind in _KINDS and owner is not None:
                entry = entries.get((id(d), id(owner), shapes))
                if entry is not None:
                    run.append((d, owner, kind, entry))
                    continue
            if run:
                self._reuse_run(book, run)
                run = []
            self.prewarm(book, d, owner, kind)
        if run:
            self._reuse_run(book, run)
        if tensors:
            _wrap_run(book, tensors, tensor)

    def _reuse_run(self, book: Any, run: list[tuple[dict, Any, str, _Entry]]) -> None:
        """`prewarm` each dict of the run, in order; all at once when every one of them holds what it
        held when kept (what `_reuse` asks of each, asked of all together in C-level passes)."""
        if len(run) > 1 and self._reuse_all(book, run):
            return
        for d, owner, kind, _ in run:
            self.prewarm(book, d, owner, kind)

    def _reuse_all(self, book: Any, run: list[tuple[dict, Any, str, _Entry]]) -> bool:
        ds, owners, _kinds, entries = zip(*run)
        if len({*map(id, ds)}) != len(ds) or book.has_any_view(ds, owners):
            return False  # a dict met twice, or one with a view made in this session
        module_ids = self.rec.module_ids
        if (
            [*map(len, ds)] != [*map(len, map(_hids, entries))]
            or [*chain.from_iterable(ds)] != [*chain.from_iterable(map(_hids, entries))]
            or not all(map(is_, map(_call, map(_dref, entries)), ds))
            or not all(map(is_, map(_call, map(_oref, entries)), owners))
            or [*map(module_ids.get, map(id, owners))] != [*map(_module_id, entries)]
        ):
            return False
        hids = [*chain.from_iterable(map(_hids, entries))]
        if len({*hids}) != len(hids) or not book.fresh_ids(hids):
            return False
        fns = [*chain.from_iterable(map(_values, ds))]
        hooks = [*chain.from_iterable(map(_hooks, entries))]
        if not (
            all(map(is_, map(_call, map(_ref, hooks)), fns))  # no id reused by another hook
            and all(map(eq, map(_cwd, entries), repeat(self.cwd)))
            and all(map(is_, map(_qualname, fns), map(_hook_qualname, hooks)))
            and all(map(is_, map(_code, fns), map(_hook_code, hooks)))
            and all(map(is_, map(_closure, fns), repeat(None)))
            and not any(map(contains, map(vars, fns), repeat("__wrapped__")))
        ):  # some dict changed, or some hook is named again: each dict on its own
            return False
        _run(map(setattr, map(_cell, hooks), repeat("cell_contents"), fns))
        _run(map(setattr, map(_shim, hooks), repeat("__wrapped__"), fns))
        self.used += entries
        book.adopt_views(
            ds,
            owners,
            [*map(_state, entries)],
            [*map(_view, entries)],
            [*map(_hids, entries)],
            map(_template, hooks),
        )
        return True

    def prewarm(self, book: Any, d: dict, owner: Any, kind: str) -> None:
        """`book.prewarm(d, owner, kind)`, from what the process kept when it can be."""
        if kind not in _KINDS or owner is None or not d or book.has_view(d, owner):
            book.prewarm(d, owner, kind)
            return
        key = (id(d), id(owner), self.shapes)
        entry = _ENTRIES.get(key)
        if entry is not None and self._reuse(book, entry, d, owner):
            return
        book.prewarm(d, owner, kind)
        self._keep(book, key, d, owner, kind)

    def _reuse(self, book: Any, entry: _Entry, d: dict, owner: Any) -> bool:
        state = book.state_of(d)
        if (
            entry.state != state
            or entry.dref() is not d
            or entry.oref() is not owner
            or entry.module_id != self.rec.module_key(owner)
            or not book.fresh_ids(entry.hids)
        ):
            return False
        hooks = entry.hooks
        fns = [*d.values()]
        for hook, fn in zip(hooks, fns):
            if hook.ref() is not fn:  # an id reused by another hook
                return False
        same_place = entry.cwd == self.cwd
        records = []
        for hook, fn in zip(hooks, fns):
            if (
                same_place
                and fn.__qualname__ is hook.qualname
                and fn.__code__ is hook.code
                and fn.__closure__ is None
                and "__wrapped__" not in fn.__dict__
            ):
                records.append(hook.template)
            else:  # named again: a closure (named after what it holds), renamed, another working directory
                records.append(book.naming(hook.template, fn))
            hook.cell.cell_contents = fn
            hook.shim.__wrapped__ = fn
        self.used.append(entry)
        book.adopt_view(d, owner, state, entry.view, entry.hids, records)
        return True

    def _keep(self, book: Any, key: tuple[int, int, bool], d: dict, owner: Any, kind: str) -> None:
        """Keep the records of the view the book just made, with shims of this process's namespace."""
        items = [*d.items()]
        if not items or any(type(fn) is not _FUNCTION for _, fn in items):
            return
        hids = [hid for hid, _ in items]
        templates = book.templates(d, hids)
        if templates is None:
            return
        entry = _Entry()
        try:
            entry.dref = weakref.ref(d, lambda ref: _evict(key, ref))
            entry.oref = weakref.ref(owner, lambda ref: _evict(key, ref))
        except TypeError:  # a plain dict, or a module without weak references: not kept
            return
        module_id = self.rec.module_key(owner)
        factory = _spaces(self.shapes)[shims.ARITY.get(kind)][1]
        same = SAME.get(kind, _same_first)
        hooks = []
        for (hid, fn), template in zip(items, templates):
            hook = _Hook()
            hook.ref, hook.template = weakref.ref(fn), template
            hook.qualname, hook.code = fn.__qualname__, fn.__code__
            hook.shim = factory(fn, hid, module_id, False, same, kind)
            hook.shim.__wrapped__ = fn
            hook.cell = hook.shim.__closure__[hook.shim.__code__.co_freevars.index("fn")]
            hook.proxy = weakref.proxy(fn)
            hooks.append(hook)
        entry.state, entry.module_id, entry.hooks, entry.cwd = book.state_of(d), module_id, hooks, self.cwd
        entry.hids = hids
        entry.view = {hid: hook.shim for hid, hook in zip(hids, hooks)}
        _ENTRIES[key] = entry
        self.used.append(entry)
        book.adopt_view(d, owner, entry.state, entry.view, hids, None)


def _wrap_run(book: Any, run: list[tuple[dict, str, Any]], tensor: Callable[[dict, str, Any], None]) -> None:
    if not book.wrap_tensor_dicts(run):  # each on its own
        for d, kind, t in run:
            tensor(d, kind, t)


def kept_count() -> int:
    """How many dicts the process keeps shims for (tests)."""
    return len(_ENTRIES)
