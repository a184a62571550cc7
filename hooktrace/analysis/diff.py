"""Ordering differences between two traces: a pure function of two `Trace` objects.

Hooks are compared by what they are, not by run-specific values: a hook is identified by
(scope, module, tensor, kind, name) plus an occurrence index among hooks with the same identity
(in registration order, i.e. by handle id), and its calls are compared per (step, phase, module
the call was for, kind). Times, handle ids, threads and file paths are ignored. A difference is a
hook added, removed, moved, fired a different number of times, or whose flags or scope changed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from ..trace import ROOT, Event, Trace

FLAGS = ("prepend", "with_kwargs", "always_call")
CHANGES = ("step", "phase", "removed", "added", "moved", "count", "scope", "flags")


@dataclass(frozen=True)
class HookKey:
    """A hook as comparable across runs."""

    scope: str
    module: Optional[str]
    tensor: Optional[str]
    kind: str
    name: str
    occurrence: int = 0

    def label(self) -> str:
        text = repr(self.name)
        if self.occurrence:
            text += f" #{self.occurrence + 1}"
        if self.scope == "global":
            text += " (global)"
        elif self.scope == "tensor":
            text += f" (tensor hook on {self.tensor})" if self.tensor else " (tensor hook)"
        return text


SeqKey = tuple[int, str, Optional[str], str]  # (step, phase, module the call was for, kind)


@dataclass(frozen=True)
class Difference:
    """One ordering difference; `str()` is a readable line naming where and which hook."""

    change: str  # one of CHANGES
    detail: str
    step: Optional[int] = None
    phase: Optional[str] = None
    module: Optional[str] = None
    kind: Optional[str] = None
    hook: Optional[str] = None  # label of the hook concerned
    expected: Optional[str] = None  # at the first position where the two orders differ
    got: Optional[str] = None

    def where(self) -> str:
        parts = []
        if self.step is not None:
            parts.append(f"step {self.step}")
        if self.phase is not None:
            parts.append(self.phase)
        if self.module is not None:
            parts.append(f"module {self.module or ROOT!r}")
        if self.kind is not None:
            parts.append(f"{self.kind} hooks")
        return ", ".join(parts)

    def __str__(self) -> str:
        where = self.where()
        return f"{where}: {self.detail}" if where else self.detail


@dataclass
class TraceDiff:
    """Result of `diff_traces`: `.equal`, `.first_divergence`, `.differences`, `.summary()`."""

    differences: list[Difference] = field(default_factory=list)
    first_divergence: Optional[str] = None
    hook_calls: tuple[int, int] = (0, 0)
    steps: tuple[int, int] = (0, 0)

    @property
    def equal(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        a, b = self.hook_calls
        if self.equal:
            return f"same hook order: {a} hook calls in {self.steps[0]} step(s)"
        n = len(self.differences)
        lines = [
            f"hook order differs: {n} difference{'s' if n != 1 else ''} "
            f"(expected {a} hook calls in {self.steps[0]} step(s), got {b} in {self.steps[1]})",
            f"first divergence: {self.first_divergence}",
        ]
        lines += [f"  - {d}" for d in self.differences]
        return "\n".join(lines)


# -- identities ----------------------------------------------------------------------------------
def _hook_keys(trace: Trace) -> dict[int, HookKey]:
    """Handle id -> HookKey; duplicates numbered in registration order (handle ids only grow)."""
    seen: Counter[tuple] = Counter()
    keys: dict[int, HookKey] = {}
    for h in sorted(trace.hooks, key=lambda x: x.id):
        base = (h.scope, h.module, h.tensor, h.kind, h.name)
        keys[h.id] = HookKey(*base, occurrence=seen[base])
        seen[base] += 1
    return keys


def _key_of(e: Event, keys: dict[int, HookKey]) -> HookKey:
    if e.hook is not None and e.hook in keys:
        return keys[e.hook]
    return HookKey("unknown", e.module, None, e.kind or "?", f"<hook {e.hook}>")


def _sequences(
    trace: Trace, keys: dict[int, HookKey]
) -> tuple[dict[SeqKey, list[HookKey]], dict[SeqKey, list[int]]]:
    """Per (step, phase, module, kind): the hooks in firing order, and each call's index among all."""
    seqs: dict[SeqKey, list[HookKey]] = {}
    where: dict[SeqKey, list[int]] = {}
    for i, e in enumerate(sorted((e for e in trace.events if e.type == "hook"), key=lambda x: x.seq)):
        sk = (e.step, e.phase, e.module, e.kind or "?")
        seqs.setdefault(sk, []).append(_key_of(e, keys))
        where.setdefault(sk, []).append(i)
    return seqs, where


def _lcs(a: list[HookKey], b: list[HookKey]) -> set[int]:
    """Indexes into `b` of one longest common subsequence of `a` and `b`."""
    n, m = len(a), len(b)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            table[i][j] = table[i + 1][j + 1] + 1 if a[i] == b[j] else max(table[i + 1][j], table[i][j + 1])
    kept: set[int] = set()
    i = j = 0
    while i < n and j < m:
        if a[i] == b[j]:
            kept.add(j)
            i += 1
            j += 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return kept


def _common_part(a: list[HookKey], b: list[HookKey]) -> list[HookKey]:
    """`b` reduced to the calls `a` also has (as many times as both have them), in b's order."""
    budget = Counter(a)
    out = []
    for k in b:
        if budget[k] > 0:
            budget[k] -= 1
            out.append(k)
    return out


# -- comparing one (step, phase, module, kind) ---------------------------------------------------
def _compare_list(sk: SeqKey, la: list[HookKey], lb: list[HookKey]) -> tuple[list[Difference], int, str]:
    """Differences of one (step, phase, module, kind), the index where the orders first differ, and
    what was expected and got there."""
    step, phase, module, kind = sk
    at = {"step": step, "phase": phase, "module": module, "kind": kind}
    ca, cb = Counter(la), Counter(lb)
    removed = [k for k in ca if k not in cb]
    added = [k for k in cb if k not in ca]
    out: list[Difference] = []

    for r in list(removed):  # same hook under another scope: a scope change, not removed + added
        twin = next((x for x in added if (x.name, x.kind, x.tensor) == (r.name, r.kind, r.tensor)), None)
        if twin is not None:
            removed.remove(r)
            added.remove(twin)
            detail = f"{twin.label()} is now {twin.scope} scope, was {r.scope}"
            out.append(Difference("scope", detail, hook=twin.label(), **at))
    for r in removed:
        out.append(
            Difference("removed", f"{r.label()} did not fire (expected {ca[r]}×)", hook=r.label(), **at)
        )
    for k in added:
        out.append(Difference("added", f"{k.label()} fired {cb[k]}× (not expected)", hook=k.label(), **at))
    for k in ca:
        if k in cb and ca[k] != cb[k]:
            detail = f"{k.label()} fired {cb[k]}×, expected {ca[k]}×"
            out.append(Difference("count", detail, hook=k.label(), **at))

    fa, fb = _common_part(lb, la), _common_part(la, lb)
    kept = _lcs(fa, fb)
    for j, k in enumerate(fb):
        if j not in kept:
            nth = fb[:j].count(k)
            pa = [i for i, x in enumerate(la) if x == k][nth] + 1
            pb = [i for i, x in enumerate(lb) if x == k][nth] + 1
            detail = f"{k.label()} moved from position {pa} to {pb} of {len(lb)}"
            out.append(Difference("moved", detail, hook=k.label(), **at))

    i = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
    expected = f"{la[i].label()} at position {i + 1}" if i < len(la) else f"no hook at position {i + 1}"
    got = lb[i].label() if i < len(lb) else "none"
    out = [replace(d, expected=expected, got=got) for d in out]
    order = {c: n for n, c in enumerate(CHANGES)}
    out.sort(key=lambda d: order[d.change])
    return out, i, f"expected {expected}, got {got}"


def _flag_differences(
    a: Trace, b: Trace, ka: dict[int, HookKey], kb: dict[int, HookKey]
) -> list[tuple[HookKey, Difference]]:
    """Hooks present in both traces whose registration flags differ."""
    hb = {kb[h.id]: h for h in b.hooks}
    out = []
    for h in sorted(a.hooks, key=lambda x: x.id):
        key = ka[h.id]
        other = hb.get(key)
        if other is None:
            continue
        changed = [
            f"{f} {getattr(h, f)} → {getattr(other, f)}" for f in FLAGS if getattr(h, f) != getattr(other, f)
        ]
        if changed:
            detail = f"{key.label()} ({key.scope} hook): {', '.join(changed)}"
            out.append((key, Difference("flags", detail, module=key.module, kind=key.kind, hook=key.label())))
    return out


def _missing_parts(
    sa: dict[SeqKey, list[HookKey]], sb: dict[SeqKey, list[HookKey]], position: Callable[[SeqKey], int]
) -> tuple[list[tuple[int, int, Difference, str]], set[tuple[int, str]]]:
    """Whole steps, then whole phases of a step, that only one trace has: one difference each."""
    ranked = []
    skipped: set[tuple[int, str]] = set()
    parts = [(0, lambda k: k[0]), (1, lambda k: k[:2])]
    for level, part_of in parts:
        in_a = {part_of(k) for k in sa if k[:2] not in skipped}
        in_b = {part_of(k) for k in sb if k[:2] not in skipped}
        for part in sorted(in_a ^ in_b):
            side, seqs = ("expected", sa) if part in in_a else ("observed", sb)
            mine = [k for k in seqs if part_of(k) == part]
            calls = sum(len(seqs[k]) for k in mine)
            if level == 0:
                d = Difference("step", f"only in the {side} trace ({calls} hook calls)", step=part)
            else:
                d = Difference(
                    "phase", f"only in the {side} trace ({calls} hook calls)", step=part[0], phase=part[1]
                )
            ranked.append((min(position(k) for k in mine), 0, d, str(d)))
            skipped |= {k[:2] for k in mine}
    return ranked, skipped


def diff_traces(a: Trace, b: Trace) -> TraceDiff:
    """How the hook order of `b` (observed) differs from `a` (expected)."""
    ka, kb = _hook_keys(a), _hook_keys(b)
    sa, where_a = _sequences(a, ka)
    sb, where_b = _sequences(b, kb)
    result = TraceDiff(
        hook_calls=(sum(map(len, sa.values())), sum(map(len, sb.values()))),
        steps=(len({k[0] for k in sa}), len({k[0] for k in sb})),
    )

    def position(sk: SeqKey, i: int = 0) -> int:
        """Where call `i` of `sk` is in the expected trace (the observed one if `a` lacks it)."""
        for where in (where_a, where_b):
            calls = where.get(sk)
            if calls:
                return calls[min(i, len(calls) - 1)] + (1 if i >= len(calls) else 0)
        return 0

    ranked, skipped = _missing_parts(sa, sb, position)
    for sk in list(sa) + [k for k in sb if k not in sa]:
        la, lb = sa.get(sk, []), sb.get(sk, [])
        if sk[:2] in skipped or la == lb:
            continue
        diffs, i, divergence = _compare_list(sk, la, lb)
        for n, d in enumerate(diffs):
            ranked.append((position(sk, i), 1 + n, d, f"{d.where()}: {divergence}; {d.detail}"))

    first_call: dict[HookKey, int] = {}
    for sk, keys in sa.items():
        for i, k in zip(where_a[sk], keys):
            first_call[k] = min(i, first_call.get(k, i))
    for key, d in _flag_differences(a, b, ka, kb):
        ranked.append((first_call.get(key, 10**9), 10_000, d, str(d)))

    ranked.sort(key=lambda r: (r[0], r[1]))
    result.differences = [r[2] for r in ranked]
    result.first_divergence = ranked[0][3] if ranked else None
    return result
