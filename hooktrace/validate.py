"""Load-time checks: a JSON document (docs/format.md, version 1 or 2) becomes a `Trace` only when every
field has its type and allowed values and hooks, events and surprises refer to each other.

`from_dict` and `load` are the only ways in; the bytes are `io`'s, the data model is `schema`'s.
"""

from __future__ import annotations

import collections
import operator
import os
from dataclasses import fields
from itertools import islice, repeat
from typing import Any, Callable, Container, Iterable, Optional, Sequence

from .io import TraceFormatError, gc_paused, read_json, short
from .io.columns import decode, from_columns, has_types, index_error, null_among, selector
from .kinds import EVENT_TYPES, GRAPH, HOOK, KINDS, PHASES, SCOPES
from .schema import (
    EVENT_FIELDS,
    FORMAT,
    INDEXED,
    OPTIONAL_FIELDS,
    OPTIONAL_INDEXED,
    PREPEND_SOURCES,
    READS,
    REQUIRED_FIELDS,
    SURPRISE_LEVELS,
    Event,
    Hook,
    Meta,
    Module,
    Surprise,
    Trace,
)

__all__ = ["TraceFormatError", "from_dict", "load"]


def load(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file of version 1 or 2 (plain or gzip-compressed JSON, whatever the file's name);
    TraceFormatError, with one line saying what is wrong, for anything else."""
    with gc_paused(long_lived=True):
        return _from_dict(read_json(path), parsed=True)


def from_dict(data: Any) -> Trace:
    """A Trace from a version 1 or 2 document; TraceFormatError (one line) for anything else."""
    with gc_paused(long_lived=True):
        return _from_dict(data)


# -- field checks -------------------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return type(v) is int


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {  # annotation -> (check, what it wants)
    "int": (_is_int, "an integer"),
    "str": (lambda v: type(v) is str, "a string"),
    "bool": (lambda v: type(v) is bool, "true or false"),
    "Optional[str]": (lambda v: v is None or type(v) is str, "a string or null"),
    "Optional[int]": (lambda v: v is None or type(v) is int, "an integer or null"),
    "list[int]": (lambda v: type(v) is list and all(map(_is_int, v)), "a list of integers"),
}
_CHOICES: dict[tuple[type, str], tuple[Any, ...]] = {
    (Hook, "kind"): KINDS,
    (Hook, "scope"): SCOPES,
    (Hook, "prepend_source"): (None, *PREPEND_SOURCES),
    (Surprise, "level"): SURPRISE_LEVELS,
}


def _build(cls: type, data: Any, what: str) -> Any:
    """A dataclass from its JSON object: every field of the right type (TraceFormatError if not)."""
    if not isinstance(data, dict):
        raise TraceFormatError(f"{what} must be an object, got {short(data)}")
    known = {f.name: f for f in fields(cls)}
    unknown = [k for k in data if k not in known]
    if unknown:
        names = ", ".join(short(k) for k in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise TraceFormatError(f"{what} has unknown field(s): {names}")
    for name, f in known.items():
        if name not in data:
            if f.default is f.default_factory:  # both MISSING: a required field
                raise TraceFormatError(f"{what} is missing the field {name!r}")
            continue
        value = data[name]
        check, wanted = _CHECKS[f.type]  # type: ignore[index]
        if not check(value):
            raise TraceFormatError(f"{what}.{name} must be {wanted}, got {short(value)}")
        choices = _CHOICES.get((cls, name))
        if choices is not None and value not in choices:
            raise TraceFormatError(
                f"{what}.{name} is {short(value)}; expected one of {', '.join(map(str, choices))}"
            )
    return cls(**data)


_INT: set[type] = {int}
_STR: set[type] = {str}
_OR_NULL = type(None)
_COLUMN_TYPES: dict[str, set[type]] = {  # the Python types each event column may hold
    "seq": _INT,
    "step": _INT,
    "type": _STR,
    "phase": _STR,
    "module": {str, _OR_NULL},
    "hook": {int, _OR_NULL},
    "kind": {str, _OR_NULL},
    "thread": _INT,
    "start_ns": _INT,
    "duration_ns": _INT,
    "returned": {bool},
    "error": {str, _OR_NULL},
    "shapes": {str, _OR_NULL},
    "graph": {int, _OR_NULL},
}
_COLUMN_VALUES: dict[str, set[Optional[str]]] = {
    "type": set(EVENT_TYPES),
    "phase": set(PHASES),
    "kind": {*KINDS, None},
}
_NULLABLE_INDICES = ("module", "kind", "shapes")  # not a kind: indexed columns where null stays null
_event_fields = operator.itemgetter(*REQUIRED_FIELDS)  # version 1: no `shapes`


def _check_values(name: str, values: list[Any], parsed: bool = False) -> None:
    """Every value of one event column (or version 2 table) has its field's type and allowed value."""
    wanted = _COLUMN_TYPES[name]
    if not has_types(values, wanted, parsed):
        bad = next(v for v in values if type(v) not in wanted)
        raise TraceFormatError(f'event field "{name}" holds {short(bad)}; expected {_type_words(wanted)}')
    allowed = _COLUMN_VALUES.get(name)
    if allowed is not None and not set(values) <= allowed:
        bad = next(v for v in values if v not in allowed)
        raise TraceFormatError(
            f'event field "{name}" holds {short(bad)}; expected one of {", ".join(sorted(map(str, allowed)))}'
        )


def _type_words(types: set[type]) -> str:
    words = {int: "integers", str: "strings", bool: "true/false", _OR_NULL: "null"}
    return " or ".join(words[t] for t in (int, str, bool, _OR_NULL) if t in types)


def _v1_events(items: list[Any], hook_ids: set[int], parsed: bool) -> tuple[list[Event], Container[int]]:
    """Events of version 1 (one object of exactly the twelve fields each), checked; and their seqs."""
    if not items:
        return [], ()
    if set(map(type, items)) == {dict} and set(map(len, items)) == {len(REQUIRED_FIELDS)}:
        try:
            columns = [list(c) for c in zip(*map(_event_fields, items))]
        except KeyError:
            pass
        else:
            for name, column in zip(REQUIRED_FIELDS, columns):
                _check_values(name, column, parsed)
            columns += [[None] * len(items), [None] * len(items)]  # shapes, graph
            by_name = dict(zip(EVENT_FIELDS, columns))
            _check_hook_events(list(map(operator.eq, by_name["type"], repeat(HOOK))), by_name, False)
            return _events(columns, by_name, hook_ids)
    for i, e in enumerate(items):  # explain the first bad one
        if not isinstance(e, dict):
            raise TraceFormatError(f"events[{i}] must be an object, got {short(e)}")
        missing = [f for f in REQUIRED_FIELDS if f not in e]
        unknown = [short(k) for k in e if k not in REQUIRED_FIELDS][:5]
        problems = [f"missing {', '.join(missing)}"] * bool(missing) + [
            f"unknown {', '.join(unknown)}"
        ] * bool(unknown)
        if problems:
            raise TraceFormatError(f"events[{i}]: " + "; ".join(problems))
    raise AssertionError("unreachable")  # pragma: no cover


def _v2_events(data: Any, hook_ids: set[int], parsed: bool) -> tuple[list[Event], Container[int]]:
    """Events of version 2, checked: the tables' values, the columns' types, every index inside its
    table (decoded as the events are built, no decoded column is kept); and their seqs."""
    found, tables = from_columns(
        data, EVENT_FIELDS, INDEXED[:4], INDEXED[4:] + OPTIONAL_INDEXED, optional=OPTIONAL_FIELDS
    )
    count = len(found[0] or ())
    # only an optional column can be missing: `shapes` (traced without --shapes), `graph` (nothing
    # ran compiled), null for every event
    columns = [[None] * count if c is None else c for c in found]
    for name, table in tables.items():
        if None in table:  # null stays null in the column itself
            raise TraceFormatError(f'events table "{name}" holds null; a null value is null in its column')
        _check_values(name, table)
        if len(set(table)) != len(table):
            raise TraceFormatError(f'events table "{name}" repeats a value')
    by_name = dict(zip(EVENT_FIELDS, columns))
    for name, column in by_name.items():
        if name not in tables:
            _check_values(name, column, parsed)
        elif not has_types(column, {int, _OR_NULL} if name in _NULLABLE_INDICES else _INT, parsed):
            bad = next(
                v for v in column if type(v) is not int and (v is not None or name not in _NULLABLE_INDICES)
            )
            raise TraceFormatError(
                f'events column "{name}" holds {short(bad)}; expected indices into its table'
            )
    if HOOK in tables["type"]:
        _check_hook_events(selector(by_name["type"], tables["type"].index(HOOK)), by_name, True)
    if "shapes" in tables:
        hook = tables["type"].index(HOOK) if HOOK in tables["type"] else None
        if any(s is not None and t != hook for t, s in zip(by_name["type"], by_name["shapes"])):
            raise TraceFormatError('events: a "shapes" value on an event that is not a hook call')
    _check_graphs(tables["type"], by_name)
    try:
        decoded = [decode(c, tables[n]) if n in tables else c for n, c in by_name.items()]
    except KeyError:
        for name, table in tables.items():
            error = index_error(name, by_name[name], table)
            if error is not None:
                raise error from None
        raise
    return _events(decoded, by_name, hook_ids)


def _check_graphs(types: list[Any], by_name: dict[str, list[Any]]) -> None:
    """`graph` events have a graph number; only they and hook events have one (docs/format.md)."""
    graphs = by_name["graph"]
    if GRAPH not in types and graphs.count(None) == len(graphs):
        return
    graph = types.index(GRAPH) if GRAPH in types else None
    hook = types.index(HOOK) if HOOK in types else None
    for t, g in zip(by_name["type"], graphs):
        if (t == graph and g is None) or (g is not None and t != graph and t != hook):
            raise TraceFormatError('events: a "graph" event without a graph number, or one on an event '
                                   "that is neither a graph run nor a hook call")  # fmt: skip


def _check_hook_events(is_hook: Sequence[Any], by_name: dict[str, list[Any]], kind_ints: bool) -> None:
    """Every event that `is_hook` picks has a hook id and a kind."""
    if null_among(by_name["hook"], is_hook, ints=True) or null_among(by_name["kind"], is_hook, kind_ints):
        raise TraceFormatError('events: a "hook" event without a hook id or kind')


def _events(
    values: Sequence[Iterable[Any]], by_name: dict[str, list[Any]], hook_ids: set[int]
) -> tuple[list[Event], Container[int]]:
    """Events from the values of checked columns, after the checks that relate events to each other
    and to hooks; and the events' seqs (a range when they are 0, 1, 2, ...)."""
    seq = by_name["seq"]
    seqs: Container[int]
    if not all(map(operator.lt, seq, islice(seq, 1, None))):  # stored in the order they happened
        counts = collections.Counter(seq)
        dup = next((v for v in seq if counts[v] > 1), None)
        if dup is not None:
            raise TraceFormatError(f"events: seq {short(dup)} appears more than once")
        i = next(i for i, (a, b) in enumerate(zip(seq, islice(seq, 1, None))) if not a < b)
        raise TraceFormatError(
            f"events: seq {short(seq[i + 1])} comes after seq {short(seq[i])}; events are stored in seq order"
        )
    if seq and seq[0] < 0:
        raise TraceFormatError(f"events: seq {short(seq[0])} is negative; seq counts from 0")
    seqs = range(len(seq)) if not seq or (seq[0] == 0 and seq[-1] == len(seq) - 1) else set(seq)
    unknown = set(by_name["hook"]) - hook_ids - {None}
    if unknown:
        raise TraceFormatError(f'events refer to hook id {short(min(unknown))}, which is not in "hooks"')
    # tuple.__new__ in C: Event._make is Python code, twice as slow
    return list(map(tuple.__new__, repeat(Event), zip(*values))), seqs


def _from_dict(data: Any, parsed: bool = False) -> Trace:
    """`parsed`: `data` is what `io.loads` returned (JSON's types alone), so columns can be checked
    at C speed."""
    if (
        isinstance(data, dict)
        and "traceEvents" in data
        or (isinstance(data, list) and data and isinstance(data[0], dict) and "ph" in data[0])
    ):
        raise TraceFormatError(
            "this is a Chrome trace (for Perfetto), not a hooktrace trace: open it in https://ui.perfetto.dev, "
            "and give hooktrace the .json that `hooktrace run -o` or `Trace.save` wrote"
        )
    if not isinstance(data, dict):
        raise TraceFormatError("not a hooktrace trace: the top level must be a JSON object")
    if data.get("format") != FORMAT:
        raise TraceFormatError(
            f'not a hooktrace trace: expected "format": "{FORMAT}", got {short(data.get("format"))}'
        )
    version = data.get("version")
    if type(version) is not int or version not in READS:
        raise TraceFormatError(
            f"unsupported trace version {short(version)}; this hooktrace reads versions 1, 2 and 3"
        )
    for key in ("meta", "modules", "hooks", "events", "surprises"):
        if key not in data:
            raise TraceFormatError(f"trace is missing the {key!r} field")
    for key in ("modules", "hooks", "surprises") + (("events",) if version == 1 else ()):
        if not isinstance(data[key], list):
            raise TraceFormatError(f"trace field {key!r} must be a list")
    hooks = [_build(Hook, h, f"hooks[{i}]") for i, h in enumerate(data["hooks"])]
    hook_ids = {h.id for h in hooks}
    if len(hook_ids) != len(hooks):
        dup = next(i for i, n in collections.Counter(h.id for h in hooks).items() if n > 1)
        raise TraceFormatError(f"hooks: id {dup} appears more than once")
    read_events = _v1_events if version == 1 else _v2_events
    events, seqs = read_events(data["events"], hook_ids, parsed)
    surprises = [_build(Surprise, s, f"surprises[{i}]") for i, s in enumerate(data["surprises"])]
    for i, s in enumerate(surprises):
        if not set(s.hooks) <= hook_ids or not all(map(seqs.__contains__, s.events)):
            raise TraceFormatError(
                f"surprises[{i}] refers to a hook id or event seq that the trace does not have"
            )
    return Trace(
        meta=_build(Meta, data["meta"], "meta"),
        modules=[_build(Module, m, f"modules[{i}]") for i, m in enumerate(data["modules"])],
        hooks=hooks,
        events=events,
        surprises=surprises,
    )
