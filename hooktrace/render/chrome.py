"""Chrome Trace Event Format: open the JSON in Perfetto (ui.perfetto.dev) or chrome://tracing.

Module calls are complete (`X`) spans from their `enter` event (whose `duration_ns` is the whole
call; the matching `exit` gives the end and any exception), hooks are `X` spans inside them, on
the thread that ran them. Surprises are instant (`i`) events at the first event they name.
Times are microseconds (floats), relative to the trace's start. `tid` numbers the recording
threads 1, 2, … in order of first appearance, because Python's thread idents do not fit the 32
bits Perfetto reads (it merges such threads); the ident itself is in each event's `args.thread`
and in the thread's name. A pure function of a `Trace`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import Any, Optional

from ..analysis.calls import in_order, pair
from ..kinds import ENTER, GLOBAL, GRAPH, HOOK
from ..schema import FORMAT, ROOT, VERSION, Event, Hook, Trace, is_internal_error
from .badges import DRY_RUN_NOTE, FIRST_CALL, first_call_traced, graph_title, times_note
from .safe import UNSAFE_CHARS


def _us(ns: int) -> float:
    return ns / 1000.0


def _hook_event(e: Event, h: Optional[Hook], pid: int, tid: int) -> dict[str, Any]:
    name = h.name if h is not None else f"<unknown hook {e.hook}>"
    args: dict[str, Any] = {  # not a kind: the keys are Event's and Hook's field names
        "kind": e.kind,
        "module": e.module,
        "phase": e.phase,
        "step": e.step,
        "seq": e.seq,
        "hook": e.hook,
        "scope": h.scope if h is not None else None,
    }
    if h is not None:
        if h.tensor is not None:
            args["tensor"] = h.tensor  # not a kind: Hook's field
        args.update(
            prepend=h.prepend,
            prepend_source=h.prepend_source,
            **{GLOBAL: h.scope == GLOBAL},  # the badge, named as the scope is
            with_kwargs=h.with_kwargs,
            always_call=h.always_call,
            defined_at=h.defined_at,
            registered_at=h.registered_at,
        )
    args.update(returned=e.returned, error=e.error, thread=e.thread)
    if e.shapes is not None:  # traced with --shapes: what the hook received and returned
        args["shapes"] = e.shapes
    if e.graph is not None:  # ran inside this compiled graph: program order only, no duration
        args["graph"] = e.graph
    return {
        "name": name,
        "cat": e.phase,
        "ph": "X",
        "ts": _us(e.start_ns),
        "dur": _us(e.duration_ns),
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _call_event(
    e: Event, end: Optional[Event], own: bool, mtype: Optional[str], pid: int, tid: int
) -> dict[str, Any]:
    """`end`: the exit that ended the call (`own`: its own exit, else an outer call's; calls.py)."""
    duration = e.duration_ns
    if not duration and end is not None:
        duration = max(0, end.start_ns - e.start_ns)
    path = ROOT if e.module == "" else e.module
    return {
        "name": f"{path} ({mtype})" if mtype else str(path),
        "cat": e.phase,
        "ph": "X",
        "ts": _us(e.start_ns),
        "dur": _us(duration),
        "pid": pid,
        "tid": tid,
        "args": {  # not a kind: the keys are Event's field names
            "kind": "module_call",
            "module": e.module,
            "type": mtype,
            "phase": e.phase,
            "step": e.step,
            "seq": e.seq,
            "exit_seq": end.seq if own and end is not None else None,
            "error": end.error if own and end is not None else None,
            "stopped_by_pytorch": is_internal_error(end.error) if own and end is not None else False,
            "thread": e.thread,
        },
    }


def _graph_event(e: Event, names: list[str], pid: int, tid: int) -> dict[str, Any]:
    """One run of a compiled graph: a span holding its hooks (zero-length, in program order)."""
    return {
        "name": f"{graph_title(e.graph, e.phase)}: {', '.join(names)}",
        "cat": e.phase,
        "ph": "X",
        "ts": _us(e.start_ns),
        "dur": _us(e.duration_ns),
        "pid": pid,
        "tid": tid,
        "args": {  # not a kind: the keys are Event's field names
            "kind": "compiled_graph",
            "graph": e.graph,
            "module": e.module,
            "phase": e.phase,
            "step": e.step,
            "seq": e.seq,
            "hooks": names,
            "error": e.error,
            "thread": e.thread,
        },
    }


def _graph_hooks(events: list[Event], hooks: dict[int, Hook]) -> dict[int, list[str]]:
    """Seq of each graph run -> the names of the hooks it ran (those after it with its graph number
    on its thread), in program order."""
    latest: dict[tuple[int, Optional[int]], list[str]] = {}
    out: dict[int, list[str]] = {}
    for e in events:
        if e.type == GRAPH:
            out[e.seq] = latest[(e.thread, e.graph)] = []
        elif e.graph is not None and (e.thread, e.graph) in latest:
            h = hooks.get(e.hook) if e.hook is not None else None
            latest[(e.thread, e.graph)].append(h.name if h is not None else f"<unknown hook {e.hook}>")
    return out


def chrome_events(trace: Trace) -> list[dict[str, Any]]:
    """The `traceEvents` list: metadata first, then spans in `seq` order, then surprises."""
    pid = trace.meta.rank if trace.meta.rank is not None else 0
    events = in_order(trace.events)
    types = {m.path: m.type for m in trace.modules}
    hooks = {h.id: h for h in trace.hooks}
    by_seq = {e.seq: e for e in events}
    by_enter = {c.enter: c for c in pair(events)}

    title = f"hooktrace {trace.meta.target}" if trace.meta.target else "hooktrace"
    if trace.meta.rank is not None:
        title += f" rank {trace.meta.rank}"
    if first_call_traced(trace.meta) and events:
        title += f" (step 0: {FIRST_CALL})"
    if trace.meta.dry_run:
        title += " (dry run on meta)"
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": title}}
    ]
    phases: dict[int, dict[str, None]] = {}
    for e in events:
        phases.setdefault(e.thread, {})[e.phase] = None
    tids = {ident: n for n, ident in enumerate(phases, start=1)}
    for ident, ran in phases.items():
        tid = tids[ident]
        label = f"thread {tid} ({ident}): {', '.join(ran)}"
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
        out.append(
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        )
    exits_with_enter = {c.exit for c in by_enter.values()}
    in_graph = _graph_hooks(events, hooks)
    for e in events:
        if e.type == GRAPH:
            out.append(_graph_event(e, in_graph.get(e.seq, []), pid, tids[e.thread]))
        elif e.type == HOOK:
            hook = hooks.get(e.hook) if e.hook is not None else None
            out.append(_hook_event(e, hook, pid, tids[e.thread]))
        elif e.type == ENTER:
            call = by_enter.get(e.seq)
            end = by_seq[call.end] if call is not None and call.end is not None else None
            own = call is not None and call.exit is not None
            out.append(_call_event(e, end, own, types.get(e.module or ""), pid, tids[e.thread]))
        elif e.error is not None and e.seq not in exits_with_enter:
            # an exit whose enter was not recorded still shows its exception, as an instant
            out.append(
                {
                    "name": f"{e.module or ROOT} raised",
                    "cat": e.phase,
                    "ph": "i",
                    "s": "t",
                    "ts": _us(e.start_ns),
                    "pid": pid,
                    "tid": tids[e.thread],
                    # not a kind: the keys are Event's field names
                    "args": {"kind": "module_exit", "module": e.module, "seq": e.seq, "error": e.error},
                }
            )
    for s in trace.surprises:
        at = next((by_seq[q] for q in s.events if q in by_seq), None)
        out.append(
            {
                "name": f"surprise: {s.rule}",
                "cat": "surprise",
                "ph": "i",
                "s": "t" if at is not None else "p",
                "ts": _us(at.start_ns) if at is not None else 0.0,
                "pid": pid,
                "tid": tids[at.thread] if at is not None else 0,
                "args": {"rule": s.rule, "message": s.message, "hooks": s.hooks, "events": s.events},
            }
        )
    return out


def chrome_trace(trace: Trace) -> dict[str, Any]:
    """The whole Trace Event Format document as a dict."""
    meta = asdict(trace.meta)
    meta.update(format=FORMAT, version=VERSION, hooks=len(trace.hooks), events=len(trace.events))
    note = times_note(trace.meta)
    if note is not None:
        meta["times"] = note
    if trace.meta.dry_run:
        meta["dry_run"] = DRY_RUN_NOTE
    return {"traceEvents": chrome_events(trace), "displayTimeUnit": "ns", "otherData": meta}


# characters JSON may carry raw that a terminal or an XML/UTF-8 reader must not get (see render.safe)
_UNSAFE_JSON = re.compile(f"[{UNSAFE_CHARS}]")


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON spells a character past U+FFFF as its UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _dumps(value: Any) -> str:
    """Compact JSON, readable non-ASCII kept, but every control character as a `\\uXXXX` escape
    (the same value once decoded), so the file is safe to print to a terminal."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return _UNSAFE_JSON.sub(_json_escape, text)


def chrome_json(trace: Trace) -> str:
    """JSON text, one trace event per line so files diff and grep well."""
    doc = chrome_trace(trace)
    lines = ",\n".join(_dumps(ev) for ev in doc["traceEvents"])
    rest = {k: v for k, v in doc.items() if k != "traceEvents"}
    tail = _dumps(rest)[1:]
    return '{"traceEvents":[\n' + lines + "\n]," + tail + "\n"
