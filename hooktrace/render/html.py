"""The HTML report: one self-contained file (no network access) that opens in any browser.

The page holds the traces' data as JSON in a `<script type="application/json">` element and a
small vanilla-JS viewer (`html_assets/report.js`, `report.css`, inlined; no build step, no
library): the call tree of `analysis.calltree` (collapsible, runs of identical siblings collapsed
into one expandable row, as the terminal tree shows them), a timeline per thread with the phases
shaded, the surprises linked to their events, search and filters, and a selected hook's details.
The viewer spells no kind, phase or colour: `words()` sends them with the data, from kinds.py.
`diff_html` shows two traces side by side with the differing hook events marked; `ranks_html` one
trace per rank with a selector and each rank's first divergence marked.

Names come from user code and files: the JSON is escaped so that nothing in it can end the script
element (`<`, `>`, `&`, U+2028, U+2029 as `\\u` escapes), and the viewer builds the page with
`textContent` only, showing control and bidi characters as visible escapes (as `safe_text` does).
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any, Iterable, Optional, Union

import orjson

from ..analysis import calltree as ct
from ..analysis.calls import calls
from ..analysis.calltree import Node, SavedTensors
from ..analysis.counts import count
from ..analysis.hiding import hidden_of
from ..io import gc_paused
from ..kinds import (
    BACKWARD,
    ENTER,
    FORWARD,
    GLOBAL,
    GRAPH,
    OPTIMIZER_PHASE,
    OTHER,
    PHASES,
    RECOMPUTE,
    ROOT,
    TABLE,
    K,
)
from ..kinds import HOOK as HOOK_EVENT
from ..schema import PYTORCH_INTERNAL_ERRORS, Event, Trace
from .badges import BADGES, DRY_RUN_NOTE, PHASE_TITLES, times_note, title_target
from .safe import UNSAFE_CHARS

_HIDDEN = re.compile(f"[{UNSAFE_CHARS}]")

__all__ = ["diff_html", "html_report", "ranks_html", "report_data", "trace_data", "words"]

# Row types of the flattened tree (report.js reads the same numbers).
STEP, PHASE, CALL, GROUP, HOOK, SAVED, REPEAT, GRAPH_ROW = range(8)
_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}

# A row's terminal colour (`Kind.style`, as rich names it) as the page draws it on white: a kind has
# its row's colour in the page as in the terminal tree, and kinds that share a colour there share it here.
STYLE_COLOURS = {
    "cyan": "#0e7c86",
    "green": "#2f8a3a",
    "bright_green": "#5aa02c",
    "magenta": "#a23da8",
    "blue": "#2b59c3",
    "red": "#c53030",
    "yellow": "#c08a00",
    "bright_blue": "#4169e1",
    "bright_red": "#d0463a",
    "bright_magenta": "#8b3fc9",
    "bright_black": "#8a929c",
}
# The timeline's shading of each phase: the colour of its kinds, faint.
PHASE_BANDS = {
    FORWARD: "rgba(47,138,58,0.07)",
    BACKWARD: "rgba(43,89,195,0.08)",
    RECOMPUTE: "rgba(192,138,0,0.10)",
    OPTIMIZER_PHASE: "rgba(139,63,201,0.08)",
    OTHER: "rgba(100,100,100,0.06)",
}


def words() -> dict[str, Any]:
    """What the viewer knows of hooktrace's kinds (kinds.py) and badges (badges.py), sent with the
    data so that report.js and report.css spell no kind, phase, scope, event type or root label:
    each kind's colour, each phase's title and band, and the words the viewer compares with."""
    return {
        "kind_colours": {k: STYLE_COLOURS[info.style] for k, info in TABLE.items() if info.style is not None},
        "phases": {p: {"title": PHASE_TITLES[p], "band": PHASE_BANDS[p]} for p in PHASES},
        "unknown_phase": OTHER,  # the band of a phase outside the table
        "saved_kind": K.pack,  # a row of saved-tensor hooks has its colour
        "root": ROOT,
        "hook_event": HOOK_EVENT,
        "enter_event": ENTER,
        "global_scope": GLOBAL,
        "badges": BADGES,
        "internal_errors": list(PYTORCH_INTERNAL_ERRORS),  # PyTorch's own early stops: not an `error`
    }


class _Rows:
    """The call tree as columns, rows in display order (pre-order); `end[i]` is one past the last
    row of row i's subtree, so a collapsed row skips to it."""

    def __init__(self) -> None:
        self.type: list[int] = []
        self.depth: list[int] = []
        self.end: list[int] = []
        self.first: list[int] = []  # hook rows: the event's seq; containers: their first seq
        self.last: list[int] = []
        self.module: list[int] = []  # index into `strings`, -1 for none
        self.extra: list[int] = []  # step number, phase name index, repeat count, hook count
        self.errors: dict[int, str] = {}
        self.strings: dict[str, int] = {}

    def string(self, s: Optional[str]) -> int:
        if s is None:
            return -1
        return self.strings.setdefault(s, len(self.strings))

    def add(self, kind: int, depth: int, first: int, last: int, module: Optional[str], extra: int) -> int:
        self.type.append(kind)
        self.depth.append(depth)
        self.end.append(0)
        self.first.append(first)
        self.last.append(last)
        self.module.append(self.string(module))
        self.extra.append(extra)
        return len(self.type) - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "depth": self.depth,
            "end": self.end,
            "first": self.first,
            "last": self.last,
            "module": self.module,  # not a kind: the column's name
            "extra": self.extra,
            "errors": {str(k): v for k, v in self.errors.items()},
            "strings": list(self.strings),
        }


def _tree_rows(trace: Trace) -> _Rows:
    """The call tree of `trace` flattened for the viewer (no recursion: deep models are fine)."""
    tree = ct.build(trace)
    rows = _Rows()
    one_step = len({e.step for e in tree.events}) == 1
    todo: list[tuple[str, Any, int]] = []
    if one_step and tree.steps:
        todo += [("item", p, 0) for p in reversed(tree.steps[0].children)]
    else:
        for step, same in reversed(list(ct.runs(tree.steps))):
            if same:
                todo.append(("repeat", same, 0))
            todo.append(("item", step, 0))
    while todo:
        what, obj, depth = todo.pop()
        if what == "close":
            rows.end[obj] = len(rows.type)
            continue
        if what == "repeat":
            nodes: list[Node] = obj
            i = rows.add(REPEAT, depth, nodes[0].first_seq, nodes[-1].last_seq, nodes[0].module, len(nodes))
            todo.append(("close", i, depth))
            todo += [("item", n, depth + 1) for n in reversed(nodes)]
            continue
        item: Union[Node, SavedTensors, Event] = obj
        if type(item) is Event:
            i = rows.add(HOOK, depth, item.seq, item.seq, item.module, 0)
            rows.end[i] = i + 1
            continue
        if type(item) is SavedTensors:
            i = rows.add(SAVED, depth, item.seq, item.last_seq, None, len(item.events))
            todo.append(("close", i, depth))
            todo += [("item", e, depth + 1) for e in reversed(item.events)]
            continue
        node: Node = item  # type: ignore[assignment]
        kind = {"step": STEP, "phase": PHASE, "call": CALL, "group": GROUP, GRAPH: GRAPH_ROW}[node.kind]
        extra = node.step if kind == STEP else rows.string(node.phase) if kind == PHASE else node.hooks
        extra = (node.graph or 0) if kind == GRAPH_ROW else extra
        i = rows.add(kind, depth, node.first_seq, node.last_seq, node.module, extra)
        if node.error is not None:
            rows.errors[i] = node.error
        todo.append(("close", i, depth))
        for child, same in reversed(list(ct.runs(node.children))):
            if same:
                todo.append(("repeat", same, depth + 1))
            todo.append(("item", child, depth + 1))
    return rows


def _call_spans(trace: Trace) -> dict[str, list[int]]:
    """The module calls as `analysis.calls` pairs them: enter seq, the seq of the exit that ended
    it (-1 while still open) and its nesting depth among the calls open on its thread."""
    enter: list[int] = []
    end: list[int] = []
    depth: list[int] = []
    open_calls: dict[int, list[Any]] = {}
    for c in calls(trace):
        stack = open_calls.setdefault(c.thread, [])
        while stack and stack[-1].end is not None and stack[-1].end <= c.enter:
            stack.pop()
        enter.append(c.enter)
        end.append(-1 if c.end is None else c.end)
        depth.append(len(stack))
        stack.append(c)
    return {"enter": enter, "end": end, "depth": depth}  # not a kind: the enter event's seq


def trace_data(trace: Trace, label: str = "", marks: Iterable[int] = (), note: str = "") -> dict[str, Any]:
    """One trace as the viewer reads it: the trace format itself (version 2, events as columns),
    its flattened call tree, and `marks` (seqs of events to flag: a diff's or a rank's)."""
    with gc_paused():
        doc = trace.to_dict()
        rows = _tree_rows(trace)
        spans = _call_spans(trace)
    return {
        "label": label or title_target(trace.meta) or "trace",
        "note": note,
        "trace": doc,
        "rows": rows.to_dict(),
        "calls": spans,
        "marks": sorted(set(marks)),
        "times": times_note(trace.meta),  # what the times include, or null
        # the counts in the words of every other rendering (analysis/counts.py), and what was hidden
        "counts": count(trace).phrase(),
        "hidden": left_out.phrase() if (left_out := hidden_of(trace)) is not None else None,
        "dry_run": DRY_RUN_NOTE if trace.meta.dry_run else None,
    }


def report_data(mode: str, views: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The whole document: `mode` is `trace`, `diff` or `ranks`; `views` one `trace_data` each."""
    return {
        "format": "hooktrace.report",
        "version": 1,
        "mode": mode,
        "unsafe": _js_class(UNSAFE_CHARS),  # what the viewer shows as escapes, as safe_text does
        "words": words(),
        "views": views,
        **extra,
    }


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON spells characters past U+FFFF
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _json_for_script(data: Any) -> str:
    """JSON that cannot end or confuse the `<script>` element holding it, and that holds no hidden
    or reordering character raw (they are `\\u` escapes: the same strings once parsed)."""
    try:
        text = orjson.dumps(data).decode("utf-8")
    except TypeError:  # a lone surrogate in a name: JSON's own \\u escape keeps it
        text = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    return _HIDDEN.sub(_json_escape, text).translate(_ESCAPES)


def _js_class(chars: str) -> str:
    """The character class of `safe.UNSAFE_CHARS` for a JavaScript regex with the `u` flag."""
    return "[" + "".join(c if c == "-" else f"\\u{{{ord(c):x}}}" for c in chars) + "]"


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("html_assets").joinpath(name).read_text(encoding="utf-8")


def page(data: dict[str, Any], title: str) -> str:
    """The self-contained HTML document for `data` (from `report_data`)."""
    safe_title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>{safe_title}</title>\n"
        f"<style>\n{_asset('report.css')}</style>\n</head>\n<body>\n"
        '<div id="app"><p class="loading">Loading the hooktrace report…</p></div>\n'
        f'<script type="application/json" id="hooktrace-data">{_json_for_script(data)}</script>\n'
        f"<script>\n{_asset('report.js')}</script>\n"
        "</body></html>\n"
    )


def _title(trace: Trace, prefix: str = "hooktrace") -> str:
    from .safe import safe_text

    target = title_target(trace.meta)
    return safe_text(f"{prefix} {target}" if target else prefix)


def html_report(trace: Trace) -> str:
    """The `html` renderer: the report of one trace."""
    return page(report_data("trace", [trace_data(trace)]), _title(trace))


def diff_html(a: Trace, b: Trace, a_name: str = "A", b_name: str = "B") -> str:
    """`hooktrace diff A B -f html`: both traces side by side, the differing hook events marked and
    the differences listed (the text `diff` prints)."""
    from ..analysis.diff import diff_traces, differing_events

    result = diff_traces(a, b)
    marks_a, marks_b = differing_events(a, b)
    views = [trace_data(a, a_name, marks_a, "expected"), trace_data(b, b_name, marks_b, "observed")]
    data = report_data(
        "diff",
        views,
        diff={
            "equal": result.equal,
            "summary": result.summary(),
            "first_divergence": result.first_divergence,
            "differences": [str(d) for d in result.differences],
        },
    )
    return page(data, _title(a, "hooktrace diff"))


def ranks_html(
    traces: dict[int, Trace], names: Optional[dict[int, str]] = None, missing: Iterable[int] = ()
) -> str:
    """`hooktrace ranks ... -f html` (and `run --nproc N -f html`): one view per rank, a selector,
    each rank's first divergence from the lowest rank marked and described; `names` a note per rank
    (its file), `missing` the ranks of the world that have no trace."""
    from ..analysis.ranks import compare_ranks

    comparisons = compare_ranks(traces)
    marks: dict[int, set[int]] = {r: set() for r in traces}
    described: list[dict[str, Any]] = []
    for c in comparisons:
        d = c.divergence
        if d is not None:
            if d.expected_seq is not None:
                marks[c.reference].add(d.expected_seq)
            if d.got_seq is not None:
                marks[c.rank].add(d.got_seq)
        described.append(
            {
                "rank": c.rank,
                "reference": c.reference,
                "agree": c.agree,
                "text": c.describe(),
                "expected_seq": d.expected_seq if d else None,
                "got_seq": d.got_seq if d else None,
            }
        )
    names = names or {}
    views = [trace_data(traces[r], f"rank {r}", marks[r], names.get(r, "")) for r in sorted(traces)]
    data = report_data(
        "ranks",
        views,
        ranks={"ranks": sorted(traces), "comparisons": described, "missing": sorted(missing)},
    )
    first = traces[min(traces)] if traces else Trace()
    return page(data, _title(first, "hooktrace ranks"))
