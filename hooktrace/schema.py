"""The trace data: what capture records and every renderer and analysis reads (SPEC §4).

This module never imports torch, so `hooktrace render` and `hooktrace diff` start fast and
renderers can be tested with hand-built traces.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import gzip
import json
import operator
import os
import zlib
from dataclasses import asdict, dataclass, field, fields
from typing import IO, Any, Iterable, Iterator, NamedTuple, Optional

from .io import write_atomic
from .kinds import (  # noqa: F401  (re-exported: the groups analysis and capture import from here)
    FORWARD_KINDS,
    KINDS,
    MODULE_KINDS,
    PHASES,
    REGISTRATION_KINDS,
    STATE_DICT_KINDS,
    TENSOR_KINDS,
)

try:  # optional speed-up for large traces: pip install hooktrace[fast]
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

FORMAT = "hooktrace.trace"
ROOT = "<root>"  # how the root module (path "") is shown, and named in `tensor` ("output of <root>")
VERSION = 1


# Slices small enough to stay in the CPU caches (measured on 1M events: 1024 events saved 1.8 s vs
# 2.4 s with 4096; 64 KiB loaded 3.6 s vs 4.6 s with 1 MiB and 6-7 s for the whole document at once).
SAVE_CHUNK = 1024  # events encoded at a time by `save`
LOAD_CHUNK_BYTES = 1 << 16  # `load` decodes the events of larger files about this many bytes at a time
GZIP_MAGIC = b"\x1f\x8b"
GZIP_LEVEL = 1  # `save("x.json.gz")`: fastest level; trace JSON compresses well even so


# PyTorch raises this inside a checkpoint recompute to stop it early, and catches it itself: recorded
# on the module's `exit` event, it is not an error of the run (SPEC §2).
PYTORCH_INTERNAL_ERRORS = ("_StopRecomputationError",)


def is_internal_error(error: Optional[str]) -> bool:
    """True for an EVENT `error` that PyTorch raised and caught itself."""
    return bool(error) and error.split(":", 1)[0] in PYTORCH_INTERNAL_ERRORS


class TraceFormatError(ValueError):
    """A file or dict that is not a hooktrace trace of a version this code reads."""


class Event(NamedTuple):
    """One thing that happened, in the order it happened (`seq`)."""

    seq: int
    step: int
    type: str  # "hook" | "enter" | "exit"
    phase: str  # "forward" | "backward" | "recompute" | "other"
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


def _build(cls: type, data: Any, what: str) -> Any:
    """Dataclass from a dict, with a clear error for missing or unknown keys."""
    if not isinstance(data, dict):
        raise TraceFormatError(f"{what} must be an object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise TraceFormatError(f"{what} has unknown field(s): {', '.join(sorted(unknown))}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise TraceFormatError(f"{what}: {exc}") from None


_event_fields = operator.itemgetter(*EVENT_FIELDS)


def _events(items: list) -> list[Event]:
    """Events from their JSON objects: a C-level field pick per event; the slow path explains errors."""
    events = _events_fast(items)
    if events is None:
        return [_event(e, i) for i, e in enumerate(items)]
    return events


def _events_fast(items: list) -> Optional[list[Event]]:
    """Events from JSON objects that all have exactly the twelve fields, or None (then the caller
    takes the slow path). No per-event Python code: the whole pass is `map` over C functions."""
    try:
        if items and set(map(len, items)) != {len(EVENT_FIELDS)}:
            return None
        return list(map(_make_event, map(_event_fields, items)))
    except (KeyError, TypeError):  # a field missing or misnamed, or an event that is not an object
        return None


_make_event = functools.partial(tuple.__new__, Event)  # Event._make is a Python function in 3.11


def _event_dicts(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The SPEC objects of `events`: a dict literal per event (faster than dict(zip(...)))."""
    try:
        return [
            {
                "seq": seq,
                "step": step,
                "type": type_,
                "phase": phase,
                "module": module,
                "hook": hook,
                "kind": kind,
                "thread": thread,
                "start_ns": start_ns,
                "duration_ns": duration_ns,
                "returned": returned,
                "error": error,
            }
            for seq, step, type_, phase, module, hook, kind, thread, start_ns, duration_ns, returned, error in events
        ]
    except (TypeError, ValueError):  # not 12-tuples (hand-built traces): pair what there is
        return [dict(zip(EVENT_FIELDS, e)) for e in events]


def _event(data: Any, index: int) -> Event:
    if isinstance(data, dict):
        try:
            return Event(**data)
        except TypeError as exc:
            raise TraceFormatError(f"events[{index}]: {exc}") from None
    if isinstance(data, (list, tuple)) and len(data) == len(EVENT_FIELDS):
        return Event(*data)
    raise TraceFormatError(f"events[{index}] must be an object with fields {', '.join(EVENT_FIELDS)}")


class Trace:
    """A complete trace: meta, module table, hooks, events and surprises.

    Events are kept as `Event` named tuples (compact, attribute access); everything else as
    small dataclasses. `to_dict()` gives exactly the JSON layout of SPEC §4.
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
        return {
            "format": FORMAT,
            "version": VERSION,
            "meta": asdict(self.meta),
            "modules": [asdict(m) for m in self.modules],
            "hooks": [asdict(h) for h in self.hooks],
            "events": _event_dicts(self.events),
            "surprises": [asdict(s) for s in self.surprises],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Trace:
        if not isinstance(data, dict):
            raise TraceFormatError("not a hooktrace trace: the top level must be a JSON object")
        if data.get("format") != FORMAT:
            raise TraceFormatError(
                f'not a hooktrace trace: expected "format": "{FORMAT}", got {data.get("format")!r}'
            )
        if data.get("version") != VERSION:
            raise TraceFormatError(
                f"unsupported trace version {data.get('version')!r}; this hooktrace reads version {VERSION}"
            )
        for key in ("meta", "modules", "hooks", "events", "surprises"):
            if key not in data:
                raise TraceFormatError(f"trace is missing the {key!r} field")
        for key in ("modules", "hooks", "events", "surprises"):
            if not isinstance(data[key], list):
                raise TraceFormatError(f"trace field {key!r} must be a list")
        return cls(
            meta=_build(Meta, data["meta"], "meta"),
            modules=[_build(Module, m, f"modules[{i}]") for i, m in enumerate(data["modules"])],
            hooks=[_build(Hook, h, f"hooks[{i}]") for i, h in enumerate(data["hooks"])],
            events=_events(data["events"]),
            surprises=[_build(Surprise, s, f"surprises[{i}]") for i, s in enumerate(data["surprises"])],
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the trace as JSON (SPEC §4); orjson is used when installed (hooktrace[fast]).

        The bytes are those of `dumps(self.to_dict())` plus a newline, written SAVE_CHUNK events at a
        time, so a million events never exist as a million dicts at once. A path ending in
        ``.gz`` gets the same JSON gzip-compressed (opt-in; `load` reads either).
        """
        write_atomic(path, functools.partial(_write_file, self, os.fspath(path).endswith(".gz")))

    def write_json(self, fh: IO[bytes]) -> None:
        """Write the bytes of `save` to a binary file object (`sys.stdout.buffer`, a socket file...),
        SAVE_CHUNK events at a time."""
        with gc_paused():
            for part in self._json_parts():
                fh.write(part)

    def to_json(self) -> bytes:
        """The bytes `save` writes: SPEC §4 JSON and a newline, as `dumps(self.to_dict())` would give,
        several times faster for large traces (use `write_json` to stream them instead)."""
        with gc_paused():
            return b"".join(self._json_parts())

    def _json_parts(self) -> Iterator[bytes]:
        head = dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "meta": asdict(self.meta),
                "modules": [asdict(m) for m in self.modules],
                "hooks": [asdict(h) for h in self.hooks],
            }
        )
        yield head[:-1] + b',"events":['  # the encoders are compact: the object ends with its "}"
        events = self.events
        for start in range(0, len(events), SAVE_CHUNK):
            if start:
                yield b","
            yield dumps(_event_dicts(events[start : start + SAVE_CHUNK]))[1:-1]
        yield b'],"surprises":' + dumps([asdict(s) for s in self.surprises]) + b"}\n"

    def __repr__(self) -> str:
        return (
            f"<hooktrace.Trace target={self.meta.target!r} hooks={len(self.hooks)} "
            f"events={len(self.events)} surprises={len(self.surprises)}>"
        )

    # -- Jupyter -------------------------------------------------------------------------
    def _repr_svg_(self) -> Optional[str]:
        """Jupyter shows the trace as its SVG graph when Graphviz's `dot` is installed."""
        import shutil

        if shutil.which("dot") is None:
            return None
        from .render import RenderError
        from .render.dot import svg

        try:
            return svg(self)
        except RenderError:
            return None

    def _repr_html_(self) -> Optional[str]:
        """Without `dot`, the tree as HTML (Jupyter prefers HTML, so nothing when the SVG is there)."""
        import io
        import shutil

        if shutil.which("dot") is not None:
            return None
        from rich.console import Console
        from rich.text import Text

        from .render.tree import tree_text

        console = Console(
            file=io.StringIO(), record=True, width=120, color_system="truecolor", force_terminal=True
        )
        console.print(Text.from_ansi(tree_text(self, width=120, color=True)), soft_wrap=True)
        return console.export_html(
            inline_styles=True,
            code_format="<pre style=\"font-family:Menlo,'DejaVu Sans Mono',consolas,monospace;"
            'line-height:1.25;font-size:12px">{code}</pre>',
        )


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: building or reading millions of small acyclic containers otherwise makes
    it rescan the whole heap again and again (several times slower on large traces)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def dumps(data: Any) -> bytes:
    """Compact JSON bytes: orjson when installed (several times faster on large traces), else the stdlib."""
    if _orjson is not None:
        return _orjson.dumps(data)
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


def loads(raw: bytes) -> Any:
    if _orjson is not None:
        return _orjson.loads(raw)
    return json.loads(raw)


def load(path: str | os.PathLike[str]) -> Trace:
    """Read a trace written by `Trace.save` (plain or gzip-compressed JSON, whatever the file's name);
    TraceFormatError for anything else."""
    with open(path, "rb") as fh:
        raw = fh.read()
    with gc_paused():
        if raw[:2] == GZIP_MAGIC:
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError, zlib.error) as exc:
                raise TraceFormatError(f"{os.fspath(path)} is not a readable gzip file: {exc}") from None
        trace = _load_large(raw) if len(raw) >= LOAD_CHUNK_BYTES else None
        if trace is not None:
            return trace
        try:
            data = loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and orjson's error are ValueErrors
            raise TraceFormatError(f"{os.fspath(path)} is not valid JSON: {exc}") from None
        return Trace.from_dict(data)


_EVENTS_START = b'"events":[{"seq":'  # a key "events" whose array opens with an event object
_EVENTS_END = b'}],"surprises":'  # the last event's "}", the array's "]", then the next key
_EVENT_SPLIT = b'},{"seq":'  # between two events


def _load_large(raw: bytes) -> Optional[Trace]:
    """A large trace in compact layout (what `save` writes), its events decoded a slice at a time so
    that no more than a slice's worth of dicts exists at once. None when the layout is anything else
    or anything is wrong: the caller then decodes the whole document, which explains errors.

    The three markers contain an unescaped quote, so they cannot occur inside a JSON string; the
    rest of the document (everything but the events) is decoded and checked as usual, and each
    slice of events must decode on its own, so a file this misreads would not be valid JSON.
    """
    start = raw.find(_EVENTS_START)
    end = raw.rfind(_EVENTS_END)
    if start < 0 or end < start:
        return None
    first = start + len(_EVENTS_START) - len(b'{"seq":')  # the first event's "{"
    try:
        rest = loads(raw[:first] + raw[end + 1 :])  # the document with an empty events array
        if not isinstance(rest, dict) or rest.get("events") != []:
            return None
        trace = Trace.from_dict(rest)
        view = memoryview(raw)
        events: list[Event] = []
        pos = first
        while pos <= end:
            cut = raw.find(_EVENT_SPLIT, pos + LOAD_CHUNK_BYTES, end + 1)
            stop = end + 1 if cut < 0 else cut + 1
            piece = _events_fast(loads(b"[" + view[pos:stop] + b"]"))
            if piece is None:
                return None
            events += piece
            pos = stop + 1
    except (ValueError, UnicodeDecodeError, TraceFormatError):
        return None
    trace.events = events
    return trace


def _write_file(trace: Trace, compress: bool, fh: IO[bytes]) -> None:
    if not compress:
        trace.write_json(fh)
        return
    with gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=GZIP_LEVEL) as packed:
        trace.write_json(packed)  # type: ignore[arg-type]
