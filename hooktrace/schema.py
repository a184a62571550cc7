"""The trace data: what capture records and every renderer and analysis reads (SPEC §4).

`Trace`, `Hook`, `Event`, `Module`, `Meta`, `Surprise`; the checks a document must pass to become
a Trace (every field's type, references between hooks, events and surprises); `is_internal_error`.
The bytes (JSON, gzip, the column layout of version 2) are `io`'s. This module never imports torch
nor anything above it, so `hooktrace render` and `diff` start fast and renderers can be tested with
hand-built traces.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import operator
import os
from dataclasses import dataclass, field, fields
from itertools import islice, repeat
from typing import IO, Any, Callable, Container, Iterable, Iterator, NamedTuple, Optional, Sequence

from .io import (
    TraceFormatError,
    columns_json,
    decode,
    dumps,
    from_columns,
    has_types,
    index_error,
    null_among,
    read_json,
    selector,
    short,
    to_columns,
    write_json,
)
from .kinds import (  # noqa: F401  (re-exported: the groups analysis and capture import from here)
    EVENT_TYPES,
    FORWARD_KINDS,
    KINDS,
    PHASES,
    REGISTRATION_KINDS,
    SCOPES,
    STATE_DICT_KINDS,
    TENSOR_KINDS,
)

FORMAT = "hooktrace.trace"
ROOT = "<root>"  # how the root module (path "") is shown, and named in `tensor` ("output of <root>")
VERSION = 2  # what `save` and `to_dict` write
READS = (1, 2)  # the versions `load` and `from_dict` read
# Version 2 event columns that hold indices into a table: the SPEC's four, and `thread` (see README).
INDEXED = ("type", "phase", "kind", "module", "thread")
SURPRISE_LEVELS = ("warn", "info")
PREPEND_SOURCES = ("registration", "inferred")

# PyTorch raises this inside a checkpoint recompute to stop it early, and catches it itself: recorded
# on the module's `exit` event, it is not an error of the run (SPEC §2).
PYTORCH_INTERNAL_ERRORS = ("_StopRecomputationError",)


def is_internal_error(error: Optional[str]) -> bool:
    """True for an EVENT `error` that PyTorch raised and caught itself."""
    return bool(error) and error.split(":", 1)[0] in PYTORCH_INTERNAL_ERRORS


__all__ = [
    "Event",
    "Hook",
    "Meta",
    "Module",
    "Surprise",
    "Trace",
    "TraceFormatError",
    "is_internal_error",
    "load",
]


class Event(NamedTuple):
    """One thing that happened, in the order it happened (`seq`)."""

    seq: int
    step: int
    type: str  # "hook" | "enter" | "exit"
    phase: str  # "forward" | "backward" | "recompute" | "optimizer" | "other"
    module: Optional[str]
    hook: Optional[int]
    kind: Optional[str]
    thread: int
    start_ns: int
    duration_ns: int
    returned: bool
    error: Optional[str]


EVENT_FIELDS = Event._fields


@dataclass
class Hook:
    """Every hook seen: registered before the run (inventoried) or during it (intercepted)."""

    id: int
    kind: str
    scope: str
    module: Optional[str] = None
    tensor: Optional[str] = None
    name: str = "<unknown>"
    defined_at: Optional[str] = None
    registered_at: Optional[str] = None
    registered_by: Optional[str] = None
    prepend: bool = False
    prepend_source: Optional[str] = None
    with_kwargs: bool = False
    always_call: bool = False
    registered_during_run: bool = False
    removed_during_run: bool = False


@dataclass
class Surprise:
    rule: str
    message: str
    hooks: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    level: str = "warn"  # "warn" | "info"; version 1 files have none: "warn"


@dataclass
class Module:
    path: str
    type: str


@dataclass
class Meta:
    torch: str = ""
    python: str = ""
    device: str = "cpu"
    target: Optional[str] = None
    steps: int = 1
    created: str = ""
    rank: Optional[int] = None
    world_size: Optional[int] = None
    # what `hooktrace run` did about backward: "ran" (every step), "off" (--no-backward), "no-grad"
    # (skipped: nothing in the output required grad); None when not known (the Python API)
    backward: Optional[str] = None


def _record(obj: Any) -> dict[str, Any]:
    """The JSON object of a Meta, Module or Hook (their fields are plain values; faster than asdict)."""
    return {name: getattr(obj, name) for name in _field_names(type(obj))}


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


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


_INT, _STR = {int}, {str}
_OR_NULL = type(None)
_COLUMN_TYPES = {  # the Python types each event column may hold
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
}
_COLUMN_VALUES = {"type": set(EVENT_TYPES), "phase": set(PHASES), "kind": {*KINDS, None}}
_NULLABLE_INDICES = ("module", "kind")  # version 2 indexed columns where null stays null
_event_fields = operator.itemgetter(*EVENT_FIELDS)


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
    if set(map(type, items)) == {dict} and set(map(len, items)) == {len(EVENT_FIELDS)}:
        try:
            columns = [list(c) for c in zip(*map(_event_fields, items))]
        except KeyError:
            pass
        else:
            for name, column in zip(EVENT_FIELDS, columns):
                _check_values(name, column, parsed)
            by_name = dict(zip(EVENT_FIELDS, columns))
            _check_hook_events(list(map(operator.eq, by_name["type"], repeat("hook"))), by_name, False)
            return _events(columns, by_name, hook_ids)
    for i, e in enumerate(items):  # explain the first bad one
        if not isinstance(e, dict):
            raise TraceFormatError(f"events[{i}] must be an object, got {short(e)}")
        missing = [f for f in EVENT_FIELDS if f not in e]
        unknown = [short(k) for k in e if k not in EVENT_FIELDS][:5]
        problems = [f"missing {', '.join(missing)}"] * bool(missing) + [
            f"unknown {', '.join(unknown)}"
        ] * bool(unknown)
        if problems:
            raise TraceFormatError(f"events[{i}]: " + "; ".join(problems))
    raise AssertionError("unreachable")  # pragma: no cover


def _v2_events(data: Any, hook_ids: set[int], parsed: bool) -> tuple[list[Event], Container[int]]:
    """Events of version 2, checked: the tables' values, the columns' types, every index inside its
    table (decoded as the events are built, no decoded column is kept); and their seqs."""
    columns, tables = from_columns(
        data, EVENT_FIELDS, required_tables=INDEXED[:4], optional_tables=INDEXED[4:]
    )
    for name, table in tables.items():
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
    if "hook" in tables["type"]:
        _check_hook_events(selector(by_name["type"], tables["type"].index("hook")), by_name, True)
    try:
        decoded = [decode(c, tables[n]) if n in tables else c for n, c in by_name.items()]
    except KeyError:
        for name, table in tables.items():
            error = index_error(name, by_name[name], table)
            if error is not None:
                raise error from None
        raise
    return _events(decoded, by_name, hook_ids)


def _check_hook_events(is_hook: Sequence[Any], by_name: dict[str, list[Any]], kind_ints: bool) -> None:
    """Every event that `is_hook` picks has a hook id and a kind."""
    if null_among(by_name["hook"], is_hook, ints=True) or null_among(by_name["kind"], is_hook, kind_ints):
        raise TraceFormatError('events: a "hook" event without a hook id or kind')


def _events(
    values: list[Iterable[Any]], by_name: dict[str, list[Any]], hook_ids: set[int]
) -> tuple[list[Event], Container[int]]:
    """Events from the values of checked columns, after the checks that relate events to each other
    and to hooks; and the events' seqs (a range when they are 0, 1, 2, ...)."""
    seq = by_name["seq"]
    seqs: Container[int]
    if all(map(operator.lt, seq, islice(seq, 1, None))):  # increasing: no repeats, no set needed
        seqs = range(len(seq)) if not seq or (seq[0] == 0 and seq[-1] == len(seq) - 1) else set(seq)
    else:
        seqs = set(seq)
        if len(seqs) != len(seq):
            dup = next(v for v, n in collections.Counter(seq).items() if n > 1)
            raise TraceFormatError(f"events: seq {short(dup)} appears more than once")
    unknown = set(by_name["hook"]) - hook_ids - {None}
    if unknown:
        raise TraceFormatError(f'events refer to hook id {short(min(unknown))}, which is not in "hooks"')
    # tuple.__new__ in C: Event._make is Python code, twice as slow
    return list(map(tuple.__new__, repeat(Event), zip(*values))), seqs


class Trace:
    """A complete trace: meta, module table, hooks, events and surprises.

    Events are kept as `Event` named tuples (compact, attribute access); everything else as
    small dataclasses. `to_dict()` gives the version 2 document of SPEC §4.
    """

    def __init__(
        self,
        meta: Meta | None = None,
        modules: Iterable[Module] = (),
        hooks: Iterable[Hook] = (),
        events: Iterable[Event] = (),
        surprises: Iterable[Surprise] = (),
    ) -> None:
        self.meta = meta or Meta()
        self.modules = list(modules)
        self.hooks = list(hooks)
        self.events = list(events)
        self.surprises = list(surprises)
        self._hooks_by_id: dict[int, Hook] | None = None

    # -- lookups -------------------------------------------------------------------------
    def hook(self, hook_id: int) -> Hook:
        """The hook with this id (KeyError if the trace has none)."""
        if self._hooks_by_id is None or len(self._hooks_by_id) != len(self.hooks):
            self._hooks_by_id = {h.id: h for h in self.hooks}
        return self._hooks_by_id[hook_id]

    def hook_events(self) -> Iterator[Event]:
        return (e for e in self.events if e.type == "hook")

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The version 2 document of SPEC §4 (events as columns)."""
        with gc_paused():
            events = to_columns(self.events, EVENT_FIELDS, INDEXED)
            return {**self._head(), "events": events, "surprises": self._surprises()}

    def _head(self) -> dict[str, Any]:
        meta, modules = _record(self.meta), [_record(m) for m in self.modules]
        hooks = [_record(h) for h in self.hooks]
        return {"format": FORMAT, "version": VERSION, "meta": meta, "modules": modules, "hooks": hooks}

    def _surprises(self) -> list[dict[str, Any]]:
        return [
            dict(rule=s.rule, level=s.level, message=s.message, hooks=list(s.hooks), events=list(s.events))
            for s in self.surprises
        ]

    def _json_chunks(self) -> list[bytes]:
        """The bytes of `dumps(self.to_dict())` and a newline, in chunks (io.columns_json)."""
        with gc_paused():
            events = columns_json(self.events, EVENT_FIELDS, INDEXED)
            head = dumps(self._head())[:-1]  # without its closing brace
            return [head, b',"events":', *events, b',"surprises":', dumps(self._surprises()), b"}\n"]

    @classmethod
    def from_dict(cls, data: Any) -> Trace:
        """A Trace from a version 1 or 2 document; TraceFormatError (one line) for anything else."""
        with gc_paused(long_lived=True):
            return _from_dict(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the version 2 JSON document and a newline, atomically (a temporary file in the same
        folder, then renamed: a failed save leaves an earlier file at `path` as it was). A path
        ending in ``.gz`` gets the same JSON gzip-compressed (`load` reads either)."""
        with gc_paused():
            write_json(path, self._json_chunks())

    def write_json(self, fh: IO[bytes]) -> None:
        """Write the bytes of `save` to a binary file object (`sys.stdout.buffer`, a socket file...)."""
        fh.writelines(self._json_chunks())

    def to_json(self) -> bytes:
        """The bytes `save` writes: the version 2 JSON document and a newline."""
        with gc_paused():
            return b"".join(self._json_chunks())

    def __repr__(self) -> str:
        return (
            f"<hooktrace.Trace target={self.meta.target!r} hooks={len(self.hooks)} "
            f"events={len(self.events)} surprises={len(self.surprises)}>"
        )


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
            f"unsupported trace version {short(version)}; this hooktrace reads versions 1 and 2"
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


@contextlib.contextmanager
def gc_paused(long_lived: bool = False) -> Iterator[None]:
    """Pause the cyclic GC: building or reading millions of small acyclic containers otherwise makes
    it rescan the whole heap again and again (several times slower on large traces).

    `long_lived`: what the block made lives on (a loaded trace). When that is over 50,000 containers
    they go straight to the oldest generation (gc.freeze + gc.unfreeze: two list splices), not
    through two young passes (0.2-0.4 s for 1M events); not when the process froze objects itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if long_lived and gc.get_count()[0] > 50_000 and not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()


def load(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file of version 1 or 2 (plain or gzip-compressed JSON, whatever the file's name);
    TraceFormatError, with one line saying what is wrong, for anything else."""
    with gc_paused(long_lived=True):
        return _from_dict(read_json(path), parsed=True)
