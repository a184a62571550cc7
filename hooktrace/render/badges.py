"""The words every rendering uses: badges, phase titles, times and locations, from one table.

The tree, DOT/SVG, Chrome and the notebook all call these, so a hook flagged `prepend` reads the
same everywhere (docs/contract.md, Renderings), and every word is passed through `safe_text` where it may come from user
code or a file. No rich, no graphviz here.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from ..analysis.counts import plural  # noqa: F401  (re-exported for the renderers)
from ..kinds import BACKWARD, GLOBAL, OPTIMIZER_PHASE, PHASES, RECOMPUTE
from ..schema import ROOT, Event, Hook, Meta, is_internal_error
from .safe import safe_text

# Said once by every rendering of a trace whose model ran on meta (`Meta.dry_run`).
DRY_RUN_NOTE = "dry run on meta: shapes only, no values; times are not compute times"

# badge -> the word shown. The flags' own names (PyTorch's register_* arguments), so a user can
# search for them; `prepend` and `global` are the contract's words.
BADGES = {
    "prepend": "prepend",
    "prepend_inferred": "prepend (inferred)",
    GLOBAL: GLOBAL,
    "with_kwargs": "with_kwargs",
    "always_call": "always_call",
    "registered_during_run": "registered during run",
    "returned": "returned",
    "error": "error",
    # a hook call inside a graph torch.compile made: program order only, no Python call, no duration
    "compiled": "compiled",
}

PHASE_TITLES = {
    **{phase: phase for phase in PHASES},
    RECOMPUTE: "recompute (forward again during backward)",
    OPTIMIZER_PHASE: "optimizer (optimizer.step)",
}

# What the times are (`meta.warmup`): 0 when the traced steps include the model's first calls, N
# after `run --warmup N` / `exec --start N`, None when not known (the Python API, older traces).
FIRST_CALL = "times include first-call work"
FIRST_CALL_HINT = "run a step untraced first: --warmup 1, or --start 1 with exec"


def first_call_traced(meta: Meta) -> bool:
    """The traced steps began with the model's first calls: step 0's times include first-call work."""
    return meta.warmup == 0


def times_note(meta: Meta) -> Optional[str]:
    """One phrase on what the times include, or None when the trace does not say."""
    if first_call_traced(meta):
        return f"step 0's {FIRST_CALL}; {FIRST_CALL_HINT}"
    if meta.warmup:
        return f"after {plural(meta.warmup, 'warm-up step')}, untraced"
    return None


INFO_HINT = "--all-surprises shows them"


def badges(h: Optional[Hook], events: Iterable[Event] = ()) -> list[str]:
    """Badge words for hook `h` (None when the trace does not know it) fired as `events`."""
    out: list[str] = []
    if h is not None:
        if h.prepend:
            out.append(BADGES["prepend_inferred" if h.prepend_source == "inferred" else "prepend"])
        if h.scope == GLOBAL:
            out.append(BADGES[GLOBAL])
        if h.with_kwargs:
            out.append(BADGES["with_kwargs"])
        if h.always_call:
            out.append(BADGES["always_call"])
        if h.registered_during_run:
            out.append(BADGES["registered_during_run"])
    events = list(events)
    if any(e.returned for e in events):
        out.append(BADGES["returned"])
    if any(e.error is not None and not is_internal_error(e.error) for e in events):
        out.append(BADGES["error"])  # checkpoint's own early stop is PyTorch's, not an error
    if any(e.graph is not None for e in events):
        out.append(BADGES["compiled"])
    return out


def graph_title(number: Optional[int], phase: str) -> str:
    """What a run of a compiled graph is called: Dynamo's forward graphs and compiled autograd's."""
    what = "compiled autograd graph" if phase == BACKWARD else "torch.compile graph"
    return f"{what} {number} (hooks in program order)"


def hook_name(h: Optional[Hook], hook_id: Optional[int]) -> str:
    return safe_text(h.name) if h is not None else f"<unknown hook {hook_id}>"


def module_name(path: Optional[str]) -> str:
    """How a module path is shown: the root as `<root>`, hooks of no module as `no module`."""
    if path is None:
        return "no module"
    return ROOT if path == "" else safe_text(path)


def short_error(error: str) -> str:
    """`"ExceptionType: message"`, or just the type when the message is empty; one line."""
    return safe_text(error.rstrip().rstrip(":"))


def fmt_ns(ns: int) -> str:
    if ns < 1_000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return f"{ns / 1_000:.1f}µs"
    if ns < 1_000_000_000:
        return f"{ns / 1_000_000:.2f}ms"
    return f"{ns / 1_000_000_000:.2f}s"


def factory_file(meta: Meta) -> Optional[str]:
    """The file of the factory in `meta.target` (`FILE.py:NAME` or `package.module:NAME`), as it
    appears in `defined_at`; None when there is no target."""
    target = meta.target
    if not target:
        return None
    head = target.rsplit(":", 1)[0] if ":" in target else target
    if head.endswith(".py"):
        return head
    return head.replace(".", "/") + ".py"


_CELL = re.compile(r"^(In \[\d+\]):(\d+)$")


def site(where: Optional[str]) -> str:
    """A `defined_at` / `registered_at` value as shown: a notebook cell's `In [3]:2` as
    `In [3], line 2` (as IPython's tracebacks say it), anything else as it is."""
    if not where:
        return ""
    cell = _CELL.match(where)
    return safe_text(f"{cell[1]}, line {cell[2]}" if cell else where)


def location(defined_at: Optional[str], meta: Meta) -> str:
    """`defined_at` as shown: only the file's name when it is the factory's own file."""
    if not defined_at:
        return ""
    if _CELL.match(defined_at):
        return site(defined_at)
    own = factory_file(meta)
    if own is not None:
        file, _, line = defined_at.rpartition(":")
        if file == own or file.endswith("/" + own):
            return safe_text(f"{own.rsplit('/', 1)[-1]}:{line}")
    return safe_text(defined_at)


def _file(where: str) -> str:
    file, _, line = where.rpartition(":")
    return file if file and line.isdigit() else where


def user_site(h: Optional[Hook]) -> Optional[str]:
    """The user's line that registered `h` (`registered_by`), when its code is defined in another
    file (a library's hook, torch's saved-tensor hooks): the line to look for in your own code."""
    if h is None or not h.registered_by or not h.defined_at:
        return None
    return h.registered_by if _file(h.registered_by) != _file(h.defined_at) else None


def title_target(meta: Meta) -> str:
    """`meta.target` for a title: an absolute path cut to its file name."""
    target = meta.target or ""
    head, sep, name = target.rpartition(":") if ":" in target else (target, "", "")
    if head.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", head):
        head = re.split(r"[\\/]", head)[-1]
    return safe_text(head + sep + name)


def surprise_level(s: object) -> str:
    """`warn` or `info` (traces written before levels existed: `warn`)."""
    return getattr(s, "level", None) or "warn"


def split_surprises(surprises: list, all_surprises: bool = False) -> tuple[list, int]:
    """(the surprises to show, how many `info` ones are only counted): every `warn` is shown;
    `info` ones only when `all_surprises`."""
    if all_surprises:
        return list(surprises), 0
    shown = [s for s in surprises if surprise_level(s) != "info"]
    return shown, len(surprises) - len(shown)


def info_line(hidden: int) -> str:
    return f"+{hidden} info surprise{'s' if hidden != 1 else ''}; {INFO_HINT}"
