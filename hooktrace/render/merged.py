"""One Chrome/Perfetto file: torch.profiler's events and hooktrace's, on one timeline.

The trace's clock anchor (`meta.clock_unix_ns`, read with `meta.clock_perf_ns` at capture start)
places hooktrace's events on the profiler's wall-clock timeline (its `ts` are microseconds after
`baseTimeNanoseconds`). The two clocks are read at slightly different moments and the profiler's is
its own, so the anchor is refined by the median offset between the midpoint of each traced hook call
and that of the profiler's matching `hook <kind> <name>` range (the n-th call of a hook matches its
n-th range). Midpoints, not starts: hooktrace's clock reads around a hook call enclose the range's
opening and closing, so its span is a few µs longer at both ends.
hooktrace's events keep their own process (pid 0, or the rank; the profiler's is the OS pid).
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from ..kinds import HOOK
from ..schema import Trace
from .chrome import chrome_events

__all__ = ["hook_offset_us", "merge_profile"]


def _base_us(profile: dict[str, Any]) -> float:
    return float(profile.get("baseTimeNanoseconds", 0)) / 1000.0


def hook_offset_us(trace: Trace, profile: dict[str, Any], shift_us: float) -> Optional[float]:
    """Median of (profiler range midpoint - traced hook midpoint - shift_us) over matching hook
    calls, in µs; None when no hook call matches a range."""
    hooks = {h.id: h.name for h in trace.hooks}
    ours: dict[str, list[float]] = {}
    for e in sorted((e for e in trace.events if e.type == HOOK), key=lambda e: e.start_ns):
        ours.setdefault(f"hook {e.kind} {hooks.get(e.hook) if e.hook is not None else None}", []).append(
            (e.start_ns + e.duration_ns / 2) / 1000.0 + shift_us
        )
    theirs: dict[str, list[float]] = {}
    for e in profile.get("traceEvents", []):
        name = e.get("name")
        if e.get("ph") == "X" and isinstance(name, str) and name in ours:
            theirs.setdefault(name, []).append(float(e["ts"]) + float(e.get("dur", 0)) / 2)
    offsets = [t - o for name, starts in theirs.items() for t, o in zip(sorted(starts), ours[name])]
    return statistics.median(offsets) if offsets else None


def merge_profile(trace: Trace, profile: dict[str, Any]) -> dict[str, Any]:
    """`profile` (torch.profiler's exported Chrome trace) with hooktrace's events added, aligned.

    `otherData.hooktrace_offset_us` says how far the median match moved the anchor (None: no
    matching hook range, the anchor alone placed the events)."""
    if trace.meta.clock_unix_ns is None:
        raise ValueError("the trace has no clock anchor (meta.clock_unix_ns); trace it again")
    shift = trace.meta.clock_unix_ns / 1000.0 - _base_us(profile)
    refine = hook_offset_us(trace, profile, shift)
    shift += refine or 0.0
    added: list[dict[str, Any]] = []
    for e in chrome_events(trace):
        e = dict(e)
        if "ts" in e:
            e["ts"] = e["ts"] + shift
        added.append(e)
    merged = dict(profile)
    merged["traceEvents"] = list(profile.get("traceEvents", [])) + added
    other = dict(merged.get("otherData") or {})
    other["hooktrace_offset_us"] = refine
    merged["otherData"] = other
    return merged
