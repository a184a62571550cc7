"""The `order` format (docs/contract.md, Renderings): one line per hook call, for golden files and code review; and its parser.

    # hooktrace order 1: step phase module kind hook [#occurrence] [on tensor] [of module] [badges]

    # step 0 · forward
    0 forward   <root>  forward_pre   global_pre [global]
    0 forward   <root>  forward_pre   first_pre [prepend]
    0 forward   1       forward_pre   global_pre [global]

    # step 0 · backward
    0 backward  1       backward_pre  backward_pre
    0 backward  1       grad          weight_grad on 1.weight

Each line stands alone (a diff hunk needs no context to say where it is); the `#` lines are headers
for the eye and ignored when read back. A line holds only what is the same on every machine and
run: no times, handle ids, threads, file paths or line numbers. Padding is by the field's own value,
never by its neighbours', so a change touches only its own lines. Names with spaces, quotes,
brackets or characters that are not printable are written as JSON strings; the root module is
`<root>`, no module `-`.

`parse_order` reads the text back into a `Trace` that holds exactly what the lines say (its hooks,
their flags, the hook events), so `analysis.diff` compares order files like saved traces; `order_text`
of that trace gives the same lines back.
"""

from __future__ import annotations

import json
from typing import Optional, Union

from ..analysis.identity import hook_keys
from ..kinds import GLOBAL, HOOK, KINDS, MODULE, NODE, PHASES, ROOT, TABLE, TENSOR
from ..schema import Event, Hook, Meta, Trace, is_internal_error
from .badges import BADGES

VERSION = 1
HEADER = (
    f"# hooktrace order {VERSION}: step phase module kind hook [#occurrence] [on tensor] [of module] [badges]"
)
NO_MODULE = "-"  # the root module is kinds.ROOT
UNKNOWN = "unknown"  # scope of a hook the trace does not list (an event naming an unknown id)
UNKNOWN_NAME = "<unknown hook>"
PHASE_WIDTH = max(map(len, PHASES))
KIND_WIDTH = len("backward_pre ")  # the usual kinds line up; longer ones just push their line out
MODULE_WIDTH = 12  # likewise module paths up to 11 characters
# badge -> the hook or event flag it stands for, in the order they are written. `prepend` is one
# word however it was known (registered with prepend=True, or inferred from its position): how it
# was known depends on when the hook was registered, not on the order.
_HOOK_BADGES = ("prepend", GLOBAL, "with_kwargs", "always_call", "registered_during_run")
_EVENT_BADGES = ("returned", "error", "compiled")
_WORDS = {BADGES[b]: b for b in _HOOK_BADGES + _EVENT_BADGES}
_WORDS[BADGES["prepend_inferred"]] = "prepend"


# Bounds on the numbers a line holds: a step, and a `#occurrence` (each occurrence not written gets a
# never-fired stand-in, so an unbounded one would make a file of one line fill the memory).
MAX_STEP_DIGITS = 12
MAX_OCCURRENCE = 100_000
MAX_STAND_INS = 100_000


class OrderFormatError(ValueError):
    """Text that is not in the order format; the message names the line."""


# -- writing ---------------------------------------------------------------------------------------
def _token(text: str) -> str:
    """`text` as one token: as it is when every character is printable and none is a space, quote or
    bracket; else a JSON string, in which what is not printable (controls, bidi marks) is escaped."""
    if text and text.isprintable() and not any(c in text for c in ' "[]') and text[0] != "#":
        return text
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else json.dumps(c)[1:-1] for c in text) + '"'


def _module_token(path: Optional[str]) -> str:
    if path is None:
        return NO_MODULE
    if path == "":
        return ROOT
    return f'"{path}"' if path in (ROOT, NO_MODULE) else _token(path)


def _scope_of(kind: str, is_global: bool) -> str:
    """The scope a hook of `kind` has unless its line says otherwise."""
    scopes = TABLE[kind].scopes if kind in TABLE else (UNKNOWN,)
    return GLOBAL if is_global and GLOBAL in scopes else scopes[0]


def _owner_of(scope: str, event_module: Optional[str]) -> Optional[str]:
    """The hook's `module` unless its line says otherwise: the module called, for the scopes that
    belong to one (module, tensor and node hooks); none for the others."""
    return event_module if scope in (MODULE, TENSOR, NODE) else None


def order_lines(trace: Trace) -> list[str]:
    """The hook calls of `trace`, one line each, in the order they happened (no headers)."""
    return [line for line in _lines(trace) if not line.startswith("#") and line]


def order_text(trace: Trace) -> str:
    """The whole order file: the format line, then the lines under a header per step and phase."""
    return "\n".join(_lines(trace)) + "\n"


def _lines(trace: Trace) -> list[str]:
    hooks = {h.id: h for h in trace.hooks}
    keys = hook_keys(trace)
    out = [HEADER]
    part: Optional[tuple[int, str]] = None
    for e in sorted((e for e in trace.events if e.type == HOOK), key=lambda e: e.seq):
        if (e.step, e.phase) != part:
            part = (e.step, e.phase)
            out += ["", f"# step {e.step} · {e.phase}"]
        out.append(_line(e, hooks.get(e.hook) if e.hook is not None else None, keys))
    return out


def _line(e: Event, h: Optional[Hook], keys: dict) -> str:
    kind = e.kind or (h.kind if h is not None else "?")
    fields = [str(e.step), e.phase.ljust(PHASE_WIDTH), _module_token(e.module).ljust(MODULE_WIDTH)]
    fields.append(kind.ljust(KIND_WIDTH))
    if h is None:
        fields += [_token(UNKNOWN_NAME), "scope", UNKNOWN]
    else:
        fields.append(_token(h.name))
        occurrence = keys[h.id].occurrence
        if occurrence:
            fields.append(f"#{occurrence + 1}")
        if h.tensor is not None:
            fields += ["on", _token(h.tensor)]
        if h.scope != _scope_of(kind, h.scope == GLOBAL):
            fields += ["scope", _token(h.scope)]
        if h.module != _owner_of(h.scope, e.module):
            fields += ["of", _module_token(h.module)]
    flags = [b for b in _HOOK_BADGES if h is not None and _hook_flag(h, b)]
    flags += [b for b in _EVENT_BADGES if _event_flag(e, b)]
    fields += [f"[{BADGES[b]}]" for b in flags]
    return " ".join(fields).rstrip()


def _event_flag(e: Event, badge: str) -> bool:
    if badge == "returned":
        return e.returned
    if badge == "compiled":  # inside a compiled graph (its number varies from process to process)
        return e.graph is not None
    return _raised(e)


def _raised(e: Event) -> bool:
    """An error of the hook's own; not one PyTorch raises and catches itself (a checkpoint recompute
    stopped early: where it stops is PyTorch's business)."""
    return e.error is not None and not is_internal_error(e.error)


def _hook_flag(h: Hook, badge: str) -> bool:
    return h.scope == GLOBAL if badge == GLOBAL else bool(getattr(h, badge))


# -- reading ---------------------------------------------------------------------------------------
def is_order_text(data: Union[bytes, bytearray]) -> bool:
    """True unless `data` looks like a saved trace (JSON or gzip)."""
    head = data.lstrip()[:1]
    return not (data[:2] == b"\x1f\x8b" or head in (b"{", b"["))


def format_version(line: str) -> Optional[str]:
    """The version a format line (`# hooktrace order N: ...`) names, as written; None for other lines."""
    words = line.strip().lstrip("#").replace(":", " ").split()
    if not line.lstrip().startswith("#") or words[:2] != ["hooktrace", "order"]:
        return None
    return words[2] if len(words) > 2 else ""


def parse_order(text: str, *, as_file: bool = False) -> Trace:
    """The `Trace` an order text describes: its hooks (flags from the badges, occurrences numbered as
    written) and one hook event per line, in order. Lines starting with `#` and blank lines are skipped.
    A format line of another version than this one is refused; `as_file`: the text is a file's, whose
    first line must be the format line (order text given directly may leave it out).
    OrderFormatError names the first line that is not in the format."""
    lines = text.splitlines()
    _check_version(lines, as_file)
    hooks: dict[tuple, Hook] = {}
    events: list[Event] = []
    fired: list[tuple] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            key, hook, event = _parse_line(line)
        except OrderFormatError as exc:
            raise OrderFormatError(f"line {number}: {exc}: {_token(raw[:80])}") from None
        known = hooks.setdefault(key, hook)
        for flag in _HOOK_BADGES:
            if flag != GLOBAL and getattr(hook, flag):
                setattr(known, flag, True)
        events.append(event._replace(seq=len(events)))
        fired.append(key)
    numbered = _numbered(hooks)
    events = [e._replace(hook=hooks[key].id) for e, key in zip(events, fired)]
    return Trace(meta=Meta(steps=len({e.step for e in events}) or 1), hooks=numbered, events=events)


def _check_version(lines: list[str], as_file: bool) -> None:
    """A file's first line, else the first line that is not blank, may be the format line: its version
    must be this one. A file must start with it."""
    written = [(n, x) for n, x in enumerate(lines, 1) if x.strip()]
    number, first = (1, lines[0]) if as_file and lines else (written[0] if written else (1, ""))
    version = format_version(first)
    if version is None and as_file:
        what = "its first line is not the format line" if written else "it is empty"
        raise OrderFormatError(f"not an order file: {what} (# hooktrace order {VERSION}: ...)")
    if version is not None and version != str(VERSION):
        raise OrderFormatError(
            f"line {number}: order format version {_token(version) if version else '(none)'}, which this "
            f"hooktrace does not read (it reads version {VERSION})"
        )


def _numbered(hooks: dict[tuple, Hook]) -> list[Hook]:
    """The hooks with ids that number equal identities in their written occurrence order (as
    `identity.hook_keys` reads them), and a never-fired stand-in for each occurrence not written."""
    top: dict[tuple, int] = {}
    for identity, occurrence in hooks:
        top[identity] = max(top.get(identity, 0), occurrence)
    if sum(top.values()) + len(top) - len(hooks) > MAX_STAND_INS:
        raise OrderFormatError(
            f"its #occurrences leave more than {MAX_STAND_INS} occurrences of hooks unwritten"
        )
    out = []
    for n, (identity, last) in enumerate(top.items()):
        for occurrence in range(last + 1):
            hook = hooks.get((identity, occurrence))
            if hook is None:
                scope, module, tensor, kind, name = identity
                hook = Hook(0, kind, scope, module=module, tensor=tensor, name=name)
            hook.id = occurrence * 1_000_000 + n + 1
            out.append(hook)
    return sorted(out, key=lambda h: h.id)


def _tokens(line: str) -> list[str]:
    """Split on whitespace (spaces, tabs); a token starting with `"` is a JSON string, `[` runs to the
    next `]` (a badge, its words joined by one space)."""
    out: list[str] = []
    decoder = json.JSONDecoder()
    i, n = 0, len(line)
    while i < n:
        if line[i].isspace():
            i += 1
        elif line[i] == '"':
            try:
                value, i = decoder.raw_decode(line, i)
            except ValueError:
                raise OrderFormatError("an unterminated quoted name") from None
            out.append("\0" + value)  # marked: quoted (the root and no-module words are literal)
        elif line[i] == "[":
            end = line.find("]", i)
            if end < 0:
                raise OrderFormatError("a badge without its closing ]")
            out.append("[" + " ".join(line[i + 1 : end].split()) + "]")
            i = end + 1
        else:
            end = i
            while end < n and not line[end].isspace():
                end += 1
            out.append(line[i:end])
            i = end
    return out


def _text(token: str) -> str:
    return token[1:] if token.startswith("\0") else token


def _module(token: str) -> Optional[str]:
    if token == ROOT:
        return ""
    if token == NO_MODULE:
        return None
    return _text(token)


def _number(text: str) -> Optional[int]:
    """`text` as a number when it is ASCII digits only, at most MAX_STEP_DIGITS of them; else None
    (`str.isdigit` takes `²`, which `int()` refuses, and `int()` refuses more than 4,300 digits)."""
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_STEP_DIGITS:
        return None
    return int(text)


def _parse_line(line: str) -> tuple[tuple, Hook, Event]:
    tokens = _tokens(line)
    badges = [t[1:-1] for t in tokens if t.startswith("[")]
    words = [t for t in tokens if not t.startswith("[")]
    if len(words) < 5:
        raise OrderFormatError("expected step, phase, module, kind and hook")
    step_text, phase, module_text, kind, name = words[:5]
    step = _number(step_text)
    if step is None:
        raise OrderFormatError(
            f"the step must be a number of at most {MAX_STEP_DIGITS} digits 0-9, not {_token(_text(step_text)[:40])}"
        )
    if phase not in PHASES:
        raise OrderFormatError(f"unknown phase {_token(_text(phase))}; one of {', '.join(PHASES)}")
    if kind not in KINDS:
        raise OrderFormatError(f"unknown hook kind {_token(_text(kind))}")
    unknown = [b for b in badges if b not in _WORDS]
    if unknown:
        raise OrderFormatError(f"unknown badge [{unknown[0]}]")
    flags = {_WORDS[b] for b in badges}
    module = _module(module_text)
    rest = words[5:]
    occurrence = 0
    if rest and rest[0].startswith("#") and rest[0][1:].isdigit():
        written = _number(rest[0][1:])
        if written is None or written > MAX_OCCURRENCE:
            raise OrderFormatError(
                f"the occurrence must be #2 to #{MAX_OCCURRENCE} in digits 0-9, not {_token(rest[0][:40])}"
            )
        if written >= 2:  # `#0` and `#1` are never written: left for the error below
            rest.pop(0)
            occurrence = written - 1
    qualifiers: dict[str, str] = {}
    while rest:
        word = rest.pop(0)
        if word not in ("on", "of", "scope") or not rest or word in qualifiers:
            raise OrderFormatError(f"unexpected {_token(_text(word))} after the hook's name")
        qualifiers[word] = rest.pop(0)
    scope = _text(qualifiers["scope"]) if "scope" in qualifiers else _scope_of(kind, GLOBAL in flags)
    tensor = _text(qualifiers["on"]) if "on" in qualifiers else None
    owner = _module(qualifiers["of"]) if "of" in qualifiers else _owner_of(scope, module)
    name = _text(name)
    hook = Hook(0, kind, scope, module=owner, tensor=tensor, name=name)
    for flag in _HOOK_BADGES:
        if flag != GLOBAL and flag in flags:
            setattr(hook, flag, True)
    if hook.prepend:
        hook.prepend_source = "registration"
    error = "error" if "error" in flags else None
    graph = 0 if "compiled" in flags else None  # a graph's number is not in the text
    event = Event(0, step, HOOK, phase, module, None, kind, 0, 0, 0, "returned" in flags, error, None, graph)
    return ((scope, owner, tensor, kind, name), occurrence), hook, event
