"""The trace data: what capture records and every renderer and analysis reads (docs/format.md).

`Trace`, `Hook`, `Event`, `Module`, `Meta`, `Surprise`, `is_internal_error`: the data model alone.
A document becomes a Trace through `validate` (the load-time checks); the bytes (JSON, gzip, the
column layout of version 2) are `io`'s. This module imports only `io` and `kinds`, never torch, so
`hooktrace render` and `diff` start fast and renderers can be tested with hand-built traces.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field, fields
from typing import IO, Any, Iterable, Iterator, NamedTuple, Optional

from .io import TraceFormatError, dumps, gc_paused, write_json
from .io.columns import columns_json, to_columns
from .kinds import GRAPH, HOOK
from .kinds import ROOT as ROOT  # re-exported: the data model names the root so

FORMAT = "hooktrace.trace"
VERSION = 2  # what `save` and `to_dict` write (a trace with `graph` events: GRAPH_VERSION)
GRAPH_VERSION = 3  # version 2 plus `graph` events and the `graph` column (torch.compile)
READS = (1, 2, 3)  # the versions `load` and `from_dict` read
# Version 2 event columns that hold indices into a table: the format's four, and `thread` (see README).
INDEXED = ("type", "phase", "kind", "module", "thread")  # not a kind: column names
SURPRISE_LEVELS = ("warn", "info")
PREPEND_SOURCES = ("registration", "inferred")

# PyTorch raises this inside a checkpoint recompute to stop it early, and catches it itself: recorded
# on the module's `exit` event, it is not an error of the run (docs/format.md, EVENT).
PYTORCH_INTERNAL_ERRORS = ("_StopRecomputationError",)
META_DEVICE = "meta"  # `meta.device` of a dry run: shapes, no values (`run --device meta`)


def is_internal_error(error: Optional[str]) -> bool:
    """True for an EVENT `error` that PyTorch raised and caught itself."""
    return error is not None and error.split(":", 1)[0] in PYTORCH_INTERNAL_ERRORS


__all__ = [
    "Event",
    "Hook",
    "Meta",
    "Module",
    "Surprise",
    "Trace",
    "TraceFormatError",
    "is_internal_error",
]


class Event(NamedTuple):
    """One thing that happened, in the order it happened (`seq`)."""

    seq: int
    step: int
    type: str  # "hook" | "enter" | "exit" | "graph"
    phase: str  # "forward" | "backward" | "recompute" | "optimizer" | "other"
    module: Optional[str]
    hook: Optional[int]
    kind: Optional[str]
    thread: int
    start_ns: int
    duration_ns: int
    returned: bool
    error: Optional[str]
    # what the hook received and returned (traced with --shapes), e.g. `(f32[8,16] cpu,) -> f32[8,4] cpu`
    shapes: Optional[str] = None
    # torch.compile (version 3): the number of the compiled graph a `graph` event ran, or a hook
    # event ran inside (with no Python call of its own: program order, no duration); else None
    graph: Optional[int] = None


EVENT_FIELDS = Event._fields
# The columns every version 2 file has; `shapes` is written only when an event has one, and both
# `shapes` and `graph` when an event has a graph (version 3).
REQUIRED_FIELDS = EVENT_FIELDS[:-2]
OPTIONAL_INDEXED = ("shapes",)  # optional columns that hold indices into a table of the same name
OPTIONAL_FIELDS = ("shapes", "graph")  # not a kind: column names
_type_of = operator.itemgetter(2)
_shapes_of = operator.itemgetter(12)  # an event of another length is refused by io, whatever this says


@dataclass
class Hook:
    """Every hook seen: held by the model when traced (found in its dicts) or registered during it (intercepted)."""

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
    # steps that ran untraced before the traced ones: `run --warmup N` (N), `exec --start K` (K); 0
    # means the traced steps include the model's first calls; None when not known (the Python API)
    warmup: Optional[int] = None
    # the clocks at capture start, which events' start_ns count from: time.perf_counter_ns() and
    # time.time_ns() read together (aligns the trace with other tools' timelines); None when unknown
    clock_perf_ns: Optional[int] = None
    clock_unix_ns: Optional[int] = None

    @property
    def dry_run(self) -> bool:
        """The model ran on the meta device: hooks saw shapes, never values (a dry run)."""
        return self.device == META_DEVICE or self.device.startswith(META_DEVICE + ":")


def _record(obj: Any) -> dict[str, Any]:
    """The JSON object of a Meta, Module or Hook (their fields are plain values; faster than asdict)."""
    return {name: getattr(obj, name) for name in _field_names(type(obj))}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


class Trace:
    """A complete trace: meta, module table, hooks, events and surprises.

    Events are kept as `Event` named tuples (compact, attribute access); everything else as
    small dataclasses. `to_dict()` gives the version 2 document of docs/format.md.
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

    def module_paths(self) -> list[str]:
        """The module paths of the module table; of the events when the table is empty."""
        return [m.path for m in self.modules] or sorted({e.module for e in self.events} - {None})  # type: ignore[arg-type]

    def hook_events(self) -> Iterator[Event]:
        return (e for e in self.events if e.type == HOOK)

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The version 2 document of docs/format.md (events as columns)."""
        with gc_paused():
            events = to_columns(self.events, *self._columns())
            return {**self._head(), "events": events, "surprises": self._surprises()}

    def _columns(self) -> tuple[tuple[str, ...], tuple[str, ...], int]:
        """The event columns to write (`shapes` only when traced, `graph` only when a graph ran),
        those that index a table, and how many values an event has."""
        try:
            graphs, shapes = self._has_graphs(), any(map(_shapes_of, self.events))
        except IndexError:  # an event of another length: refused by io, whatever this says
            graphs, shapes = True, True
        if graphs:
            return EVENT_FIELDS, INDEXED + OPTIONAL_INDEXED, len(EVENT_FIELDS)
        if shapes:
            return EVENT_FIELDS[:-1], INDEXED + OPTIONAL_INDEXED, len(EVENT_FIELDS)
        return REQUIRED_FIELDS, INDEXED, len(EVENT_FIELDS)

    def _has_graphs(self) -> bool:
        return GRAPH in map(_type_of, self.events)

    def graph_events(self) -> Iterator[Event]:
        """Each run of a compiled graph (torch.compile's forward graphs, compiled autograd's)."""
        return (e for e in self.events if e.type == GRAPH)

    def _head(self) -> dict[str, Any]:
        meta, modules = _record(self.meta), [_record(m) for m in self.modules]
        hooks = [_record(h) for h in self.hooks]
        try:
            version = GRAPH_VERSION if self._has_graphs() else VERSION
        except IndexError:  # an event of another length: refused by io, whatever this says
            version = VERSION
        return {"format": FORMAT, "version": version, "meta": meta, "modules": modules, "hooks": hooks}

    def _surprises(self) -> list[dict[str, Any]]:
        return [
            dict(rule=s.rule, level=s.level, message=s.message, hooks=list(s.hooks), events=list(s.events))
            for s in self.surprises
        ]

    def _json_chunks(self) -> list[bytes]:
        """The bytes of `dumps(self.to_dict())` and a newline, in chunks (io.columns_json)."""
        with gc_paused():
            events = columns_json(self.events, *self._columns())
            head = dumps(self._head())[:-1]  # without its closing brace
            return [head, b',"events":', *events, b',"surprises":', dumps(self._surprises()), b"}\n"]

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
