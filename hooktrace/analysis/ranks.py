"""Comparing the ranks of one multi-rank run: pure functions of their traces (no torch).

Hooks are matched across processes by what they are (`identity.HookKey`, as `diff` does), not by
handle id, since ids differ between processes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from ..kinds import MODULE, TENSOR
from ..schema import Hook, Trace
from .counts import plural
from .diff import TraceDiff, diff_traces
from .identity import HookKey

_MAX_DIFF_LINES = 8


def hook_key(hook: Hook) -> HookKey:
    """What makes two hooks on two ranks "the same hook" (registration counts compare per identity)."""
    return HookKey.of(hook)


def _where(module: Optional[str]) -> str:
    if module is None:
        return "no module"
    return "the root module" if module == "" else f"module '{module}'"


def hook_label(hook: Hook) -> str:
    """`extra_hook (forward hook on module '1', registered at x.py:12)`."""
    scope = "" if hook.scope == MODULE else f"{hook.scope} "
    if hook.scope == TENSOR:
        on = hook.tensor or _where(hook.module)
    else:
        on = _where(hook.module)
    flags = ", prepend" if hook.prepend else ""
    site = f", registered at {hook.registered_at}" if hook.registered_at else ""
    return f"{hook.name} ({scope}{hook.kind} hook on {on}{flags}{site})"


@dataclass(frozen=True)
class _Fired:
    """One hook event, with the hook named in a way that holds across ranks."""

    index: int  # position among the rank's hook events
    seq: int
    step: int
    phase: str
    module: Optional[str]
    kind: Optional[str]
    key: HookKey
    label: str

    def order_key(self) -> tuple:
        return (self.step, self.phase, self.module, self.kind, self.key)


def _fired(trace: Trace) -> list[_Fired]:
    out = []
    for i, e in enumerate(trace.hook_events()):
        try:
            hook: Optional[Hook] = trace.hook(e.hook) if e.hook is not None else None
        except KeyError:
            hook = None
        if hook is None:
            key = HookKey("unknown", e.module, None, e.kind or "?", f"<hook {e.hook}>")
            label = f"hook #{e.hook} ({e.kind} on {_where(e.module)})"
        else:
            key, label = hook_key(hook), hook_label(hook)
        out.append(_Fired(i, e.seq, e.step, e.phase, e.module, e.kind, key, label))
    return out


@dataclass(frozen=True)
class Divergence:
    """The first hook event where `rank` does not do what `reference` did."""

    reference: int
    rank: int
    index: int  # position in the order of hook events (0-based)
    step: int
    phase: str
    module: Optional[str]
    kind: Optional[str]
    expected: Optional[str]  # hook label on the reference rank; None: its trace had ended
    got: Optional[str]  # hook label on `rank`; None: its trace had ended
    expected_seq: Optional[int] = None
    got_seq: Optional[int] = None

    def describe(self) -> str:
        where = f"step {self.step}, {self.phase}, {_where(self.module)}, {self.kind}"
        lines = [f"first divergence: rank {self.rank} at hook event #{self.index} ({where}):"]
        ref_seq = f" (event seq {self.expected_seq})" if self.expected_seq is not None else ""
        got_seq = f" (event seq {self.got_seq})" if self.got_seq is not None else ""
        lines.append(f"  rank {self.reference} (expected): {self.expected or 'no more hooks'}{ref_seq}")
        lines.append(f"  rank {self.rank} (got):      {self.got or 'no more hooks'}{got_seq}")
        return "\n".join(lines)


@dataclass(frozen=True)
class CountDifference:
    """A hook whose registrations (`what="registered"`) or calls (`what="calls"`) differ between two ranks."""

    what: str
    label: str
    reference: int
    rank: int
    reference_count: int
    rank_count: int

    def describe(self) -> str:
        if self.what == "registered":
            if self.reference_count == 0 or self.rank_count == 0:
                only = self.rank if self.reference_count == 0 else self.reference
                count = max(self.reference_count, self.rank_count)
                times = "" if count == 1 else f" ({count} registrations)"
                return f"only on rank {only}: {self.label}{times}"
            return (
                f"registered {self.reference_count}x on rank {self.reference} but "
                f"{self.rank_count}x on rank {self.rank}: {self.label}"
            )
        return (
            f"called {self.reference_count}x on rank {self.reference} but "
            f"{self.rank_count}x on rank {self.rank}: {self.label}"
        )


@dataclass
class RankComparison:
    """`rank` against `reference`: first divergence, hooks on one rank only, different call counts."""

    reference: int
    rank: int
    events: tuple[int, int]  # hook events on the reference rank and on `rank`
    divergence: Optional[Divergence] = None
    registrations: list[CountDifference] = field(default_factory=list)
    calls: list[CountDifference] = field(default_factory=list)
    diff: Optional[TraceDiff] = None  # `hooktrace diff` of the two rank files (flags, moves per call site)

    @property
    def agree(self) -> bool:
        same = self.divergence is None and not self.registrations and not self.calls
        return same and (self.diff is None or self.diff.equal)

    def describe(self, partial: bool = False) -> str:
        """The first divergence, then (complete traces only) registrations, call counts, other differences."""
        counts = f"{self.events[1]} vs {plural(self.events[0], 'hook call')}"
        lines = [f"rank {self.rank} vs rank {self.reference} ({counts}):"]
        if self.divergence is not None:
            lines.append("  " + self.divergence.describe().replace("\n", "\n  "))
        if partial:
            lines.append("  (a trace is partial: registrations and call counts not compared)")
            return "\n".join(lines)
        if self.registrations:
            lines.append("  hooks not registered alike:")
            lines += [f"    {d.describe()}" for d in self.registrations]
        if self.calls:
            lines.append("  different call counts:")
            lines += [f"    {d.describe()}" for d in self.calls]
        if self.diff is not None and not self.diff.equal:
            found = self.diff.differences
            lines.append(f"  per call site ({len(found)} difference{'s' if len(found) != 1 else ''}):")
            lines += [f"    - {d}" for d in found[:_MAX_DIFF_LINES]]
            if len(found) > _MAX_DIFF_LINES:
                more = len(found) - _MAX_DIFF_LINES
                lines.append(f"    ... {more} more: run hooktrace diff on the two rank files")
        return "\n".join(lines)


def compare_pair(reference: Trace, other: Trace, reference_rank: int, rank: int) -> RankComparison:
    """Compare the hook order of `other` (rank `rank`) with `reference` (rank `reference_rank`)."""
    a, b = _fired(reference), _fired(other)
    result = RankComparison(reference_rank, rank, (len(a), len(b)), diff=diff_traces(reference, other))
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x is not None and y is not None and x.order_key() == y.order_key():
            continue
        at = (
            y or x
        )  # the heading tells where the differing rank was (the reference's event when it had ended)
        assert at is not None
        result.divergence = Divergence(
            reference=reference_rank,
            rank=rank,
            index=i,
            step=at.step,
            phase=at.phase,
            module=at.module,
            kind=at.kind,
            expected=x.label if x else None,
            got=y.label if y else None,
            expected_seq=x.seq if x else None,
            got_seq=y.seq if y else None,
        )
        break
    labels: dict[HookKey, str] = {}
    for trace in (reference, other):
        for h in trace.hooks:
            labels.setdefault(hook_key(h), hook_label(h))
    reg_a = Counter(hook_key(h) for h in reference.hooks)
    reg_b = Counter(hook_key(h) for h in other.hooks)
    calls_a = Counter(f.key for f in a)
    calls_b = Counter(f.key for f in b)
    for key in _ordered_keys(reference, other):
        if reg_a[key] != reg_b[key]:
            result.registrations.append(
                CountDifference("registered", labels[key], reference_rank, rank, reg_a[key], reg_b[key])
            )
        if calls_a[key] != calls_b[key]:
            result.calls.append(
                CountDifference("calls", labels[key], reference_rank, rank, calls_a[key], calls_b[key])
            )
    return result


def _ordered_keys(*traces: Trace) -> list[HookKey]:
    seen: dict[HookKey, None] = {}
    for trace in traces:
        for h in trace.hooks:
            seen.setdefault(hook_key(h), None)
    return list(seen)


def compare_ranks(traces: dict[int, Trace]) -> list[RankComparison]:
    """Every rank against the lowest rank present (rank 0 when it wrote a trace)."""
    if len(traces) < 2:
        return []
    ranks = sorted(traces)
    ref = ranks[0]
    return [compare_pair(traces[ref], traces[r], ref, r) for r in ranks[1:]]
