"""Ordering differences between two traces: a pure function of two `Trace` objects.

Hooks are compared by what they are, not by run-specific values (`identity.HookKey`: scope,
module, tensor, kind, name, and an occurrence index among equal identities in registration order),
and its calls are compared per (step, phase, module the call was for, kind). Times, handle ids,
threads and file paths are ignored. A difference is a hook added, removed, moved (within its list,
or to another module), fired a different number of times, or whose flags or scope changed; then,
with the same calls per list, calls interleaved otherwise, or a hook that returned a value or
raised in one trace only. Lists are matched by `align`.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Callable, Optional, TypedDict, Union

from ..io import gc_paused
from ..kinds import HOOK
from ..schema import ROOT, Event, Trace, is_internal_error
from .align import align
from .counts import plural
from .identity import HookKey, hook_keys

FLAGS = ("prepend", "with_kwargs", "always_call", "registered_during_run")
# "interleaving": each module's calls of each kind are the same, but not in the same order overall;
# "returned" / "error": the same calls, but a hook replaced a value or raised in one trace only.
# "module": a hook fired for another module than expected (as often), e.g. hooks swapped across modules.
# not a kind: the names of changes
CHANGES = ("step", "phase", "removed", "added", "moved", "count", "scope", "flags", "module", "interleaving",
           "returned", "error")  # fmt: skip


SeqKey = tuple[int, str, Optional[str], str]  # (step, phase, module the call was for, kind)
Part = Union[int, tuple[int, str]]  # a whole step, or a whole phase of a step


class _Where(TypedDict):
    """A SeqKey as the keyword arguments of a Difference."""

    step: int
    phase: str
    module: Optional[str]
    kind: str


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
    calls: Optional[int] = None  # removed / added: how many calls

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

    def __str__(self) -> str:
        return self.summary()

    def summary(self) -> str:
        a, b = self.hook_calls
        if self.equal:
            return f"same hook order: {plural(a, 'hook call')} in {plural(self.steps[0], 'step')}"
        n = len(self.differences)
        lines = [
            f"hook order differs: {n} difference{'s' if n != 1 else ''} "
            f"(expected {plural(a, 'hook call')} in {plural(self.steps[0], 'step')}, got {b} in {self.steps[1]})",
            f"first divergence: {self.first_divergence}",
        ]
        i = 0
        while i < n:  # hooks moved in many calls of one (step, phase, module, kind): the first, then a count
            d = self.differences[i]
            j = i + 1
            while j < n and d.change == "moved" and _moved_in_same_list(d, self.differences[j]):
                j += 1
            lines.append(f"  - {d}")
            if j - i > 1:
                more = j - i - 1
                lines.append(f"    ×{more} more move{'s' if more != 1 else ''} among these {d.kind} hooks")
            i = j
        return "\n".join(lines)


def _moved_in_same_list(a: Difference, b: Difference) -> bool:
    return b.change == "moved" and (a.step, a.phase, a.module, a.kind) == (b.step, b.phase, b.module, b.kind)


def _hook_events(events: list[Event]) -> list[Event]:
    """The hook events, in seq order (sorted only when they are not already)."""
    hooks = [e for e in events if e[2] == HOOK]
    seqs = list(map(operator.itemgetter(0), hooks))
    if all(map(operator.lt, seqs, seqs[1:])):
        return hooks
    return sorted(hooks, key=operator.itemgetter(0))


def _hook_stream(
    trace: Trace, keys: dict[int, HookKey], canon: dict[HookKey, HookKey]
) -> tuple[list[Event], list[HookKey]]:
    """The hook events in seq order and the HookKey of each (C-level passes; an event whose hook the
    trace does not list gets an "unknown" key naming its handle id)."""
    hooks = _hook_events(trace.events)
    found: list[Optional[HookKey]] = list(map(keys.get, map(operator.itemgetter(5), hooks)))
    if any(map(operator.is_, found, repeat(None))):
        for i, key in enumerate(found):
            if key is None:
                e = hooks[i]
                key = HookKey("unknown", e.module, None, e.kind or "?", f"<hook {e.hook}>")
                found[i] = canon.setdefault(key, key)
    return hooks, found  # type: ignore[return-value]


_ORDER_FIELDS = operator.itemgetter(1, 3, 4, 6)  # step, phase, module, kind: what a call is compared in


def _same_order(ha: list[Event], hb: list[Event], fa: list[HookKey], fb: list[HookKey]) -> bool:
    """The same hooks in the same order, call for call (the usual `--check`): no grouping needed."""
    return fa == fb and list(map(_ORDER_FIELDS, ha)) == list(map(_ORDER_FIELDS, hb))


def _sequences(
    hooks: list[Event], keys: list[HookKey]
) -> tuple[dict[SeqKey, list[HookKey]], dict[SeqKey, list[int]]]:
    """Per (step, phase, module, kind): the hooks in firing order, and each call's index among all."""
    groups: dict[SeqKey, tuple[list[HookKey], list[int]]] = {}
    get_group = groups.get
    for i, (e, key) in enumerate(zip(hooks, keys)):
        sk = (e[1], e[3], e[4], e[6] or "?")
        group = get_group(sk)
        if group is None:
            group = groups[sk] = ([], [])
        group[0].append(key)
        group[1].append(i)
    return {sk: g[0] for sk, g in groups.items()}, {sk: g[1] for sk, g in groups.items()}


def _common_part(a: list[HookKey], b: list[HookKey]) -> list[int]:
    """Indexes of `b`'s calls that `a` also has (as many times as both have them), in b's order."""
    budget = Counter(a)
    out = []
    for j, k in enumerate(b):
        if budget[k] > 0:
            budget[k] -= 1
            out.append(j)
    return out


# -- comparing one (step, phase, module, kind) ---------------------------------------------------
def _compare_list(sk: SeqKey, la: list[HookKey], lb: list[HookKey]) -> tuple[list[Difference], int, str]:
    """Differences of one (step, phase, module, kind), the index where the orders first differ, and
    what was expected and got there."""
    step, phase, module, kind = sk
    at = _Where(step=step, phase=phase, module=module, kind=kind)
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
            Difference(
                "removed", f"{r.label()} did not fire (expected {ca[r]}×)", hook=r.label(), calls=ca[r], **at
            )
        )
    for k in added:
        detail = f"{k.label()} fired {cb[k]}× (not expected)"
        out.append(Difference("added", detail, hook=k.label(), calls=cb[k], **at))
    for k in ca:
        if k in cb and ca[k] != cb[k]:
            detail = f"{k.label()} fired {cb[k]}×, expected {ca[k]}×"
            out.append(Difference("count", detail, hook=k.label(), **at))

    ia, ib = _common_part(lb, la), _common_part(la, lb)  # what both have, as indexes into la / lb
    fa, fb = [la[i] for i in ia], [lb[j] for j in ib]
    pairs = align(fa, fb)
    if len(pairs) < len(fb):
        # a call left out of the common order moved; it is paired with the left-out call of the same
        # hook in `a` (the k-th with the k-th) to say from where
        matched_a, matched_b = {i for i, _ in pairs}, {j for _, j in pairs}
        loose: dict[HookKey, list[int]] = {}
        for i, k in enumerate(fa):
            if i not in matched_a:
                loose.setdefault(k, []).append(ia[i])
        used: Counter[HookKey] = Counter()
        for j, k in enumerate(fb):
            if j not in matched_b:
                pa, pb = loose[k][used[k]] + 1, ib[j] + 1
                used[k] += 1
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
    ranked: list[tuple[int, int, Difference, str]] = []
    skipped: set[tuple[int, str]] = set()
    if {k[:2] for k in sa} == {k[:2] for k in sb}:
        return ranked, skipped
    parts: list[Callable[[SeqKey], Part]] = [lambda k: k[0], lambda k: k[:2]]
    for part_of in parts:
        groups_a: dict[Part, list[SeqKey]] = {}
        groups_b: dict[Part, list[SeqKey]] = {}
        for seqs, groups in ((sa, groups_a), (sb, groups_b)):
            for k in seqs:
                if k[:2] not in skipped:
                    groups.setdefault(part_of(k), []).append(k)
        for part in sorted(groups_a.keys() ^ groups_b.keys()):  # one level's parts: all ints or all pairs
            side, seqs, mine = (
                ("expected", sa, groups_a[part]) if part in groups_a else ("observed", sb, groups_b[part])
            )
            calls = sum(len(seqs[k]) for k in mine)
            if isinstance(part, int):
                d = Difference("step", f"only in the {side} trace ({plural(calls, 'hook call')})", step=part)
            else:
                d = Difference(
                    "phase",
                    f"only in the {side} trace ({plural(calls, 'hook call')})",
                    step=part[0],
                    phase=part[1],
                )
            ranked.append((min(position(k) for k in mine), 0, d, str(d)))
            skipped |= {k[:2] for k in mine}
    return ranked, skipped


def diff_traces(a: Trace, b: Trace) -> TraceDiff:
    """How the hook order of `b` (observed) differs from `a` (expected).

    Linear in the number of events (the cyclic GC is paused: it would rescan millions of events);
    traces with the same order call for call are recognised without grouping their calls.
    """
    with gc_paused():
        return _diff(a, b)


def _diff(a: Trace, b: Trace) -> TraceDiff:
    canon: dict[HookKey, HookKey] = {}
    ka, kb = hook_keys(a, canon), hook_keys(b, canon)
    ha, fa = _hook_stream(a, ka, canon)
    hb, fb = _hook_stream(b, kb, canon)
    steps = (len(set(map(operator.itemgetter(1), ha))), len(set(map(operator.itemgetter(1), hb))))
    result = TraceDiff(hook_calls=(len(ha), len(hb)), steps=steps)
    ranked: list[tuple[int, int, Difference, str]] = []
    if not _same_order(ha, hb, fa, fb):
        ranked = _order_differences(*_sequences(ha, fa), *_sequences(hb, fb))
        if not ranked:
            ranked = _interleaving(ha, hb, fa, fb)
    else:
        ranked = _marks(ha, hb, fa)

    flagged = _flag_differences(a, b, ka, kb)
    if flagged:
        ids = list(map(id, fa))  # keys are one object each (canon): found by identity, in C
        for key, d in flagged:
            first_call = ids.index(id(key)) if id(key) in ids else 10**9
            ranked.append((first_call, 10_000, d, str(d)))

    ranked.sort(key=lambda r: (r[0], r[1]))
    result.differences = [r[2] for r in ranked]
    result.first_divergence = ranked[0][3] if ranked else None
    return result


def _order_differences(
    sa: dict[SeqKey, list[HookKey]],
    where_a: dict[SeqKey, list[int]],
    sb: dict[SeqKey, list[HookKey]],
    where_b: dict[SeqKey, list[int]],
) -> list[tuple[int, int, Difference, str]]:
    """(position, rank, difference, first-divergence text) for each ordering difference."""

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
    return _across_modules(ranked)


def _call(e: Event, key: HookKey) -> str:
    return f"{key.label()} ({e.kind} hook of module {e.module or ROOT!r}, {e.phase}, step {e.step})"


def _interleaving(
    ha: list[Event], hb: list[Event], fa: list[HookKey], fb: list[HookKey]
) -> list[tuple[int, int, Difference, str]]:
    """Every (step, phase, module, kind) has the same calls, yet they interleave otherwise (modules
    called in another order): one difference, at the first call that differs."""
    i = next(
        i
        for i, (x, y) in enumerate(zip(fa, fb))
        if x is not y or _ORDER_FIELDS(ha[i]) != _ORDER_FIELDS(hb[i])
    )
    expected, got = _call(ha[i], fa[i]), _call(hb[i], fb[i])
    detail = (
        f"each module's hooks fire in the same order, but the calls interleave otherwise: "
        f"hook call {i + 1} expected {expected}, got {got}"
    )
    d = Difference("interleaving", detail, step=ha[i].step, expected=expected, got=got)
    return [(i, 0, d, str(d))]


def _raised(error: Optional[str]) -> bool:
    return error is not None and not is_internal_error(error)


def _marks(ha: list[Event], hb: list[Event], keys: list[HookKey]) -> list[tuple[int, int, Difference, str]]:
    """The same calls in the same order: the calls where a hook returned a value, or raised, in one
    trace only."""
    out = []
    for i, (x, y) in enumerate(zip(ha, hb)):
        label = keys[i].label()
        changed = []
        if x.returned != y.returned:
            changed.append(
                (
                    "returned",
                    f"{label} {'now' if y.returned else 'no longer'} returns a value that replaces what it was given",
                )
            )
        if _raised(x.error) != _raised(y.error):
            changed.append(
                ("error", f"{label} now raises {y.error}" if y.error else f"{label} no longer raises")
            )
        for change, detail in changed:
            d = Difference(
                change, detail, step=x.step, phase=x.phase, module=x.module, kind=x.kind, hook=label
            )
            out.append((i, 2, d, str(d)))
    return out


def _across_modules(ranked: list[tuple[int, int, Difference, str]]) -> list[tuple[int, int, Difference, str]]:
    """A hook that did not fire for one module and fired as often for another, in the same step, phase
    and kind (the same code hooked on another module): one difference saying so, not two."""
    added = [r for r in ranked if r[2].change == "added"]
    merged: dict[int, tuple[int, int, Difference, str]] = {}  # id of a `removed` row -> its merged row
    for r in ranked:
        d = r[2]
        if d.change != "removed":
            continue
        twin = next(
            (a for a in added if a[2].hook == d.hook and a[2].calls == d.calls and a[2].module != d.module
             and (a[2].step, a[2].phase, a[2].kind) == (d.step, d.phase, d.kind)),
            None,
        )  # fmt: skip
        if twin is not None:
            added.remove(twin)
            new = twin[2].module
            detail = f"{d.hook} fired for module {new or ROOT!r} instead of {d.module or ROOT!r} ({d.calls}×)"
            m = replace(d, change="module", detail=detail)  # not a kind: a change
            merged[id(r)] = (min(r[0], twin[0]), r[1], m, str(m))
            merged[id(twin)] = None  # type: ignore[assignment]
    return [merged.get(id(r), r) for r in ranked if not (id(r) in merged and merged[id(r)] is None)]


def differing_events(a: Trace, b: Trace) -> tuple[set[int], set[int]]:
    """The seqs of the hook events that differ: in each (step, phase, module, kind) list of calls,
    those of `a` and of `b` left unmatched when the two lists are aligned as `diff_traces` aligns
    them (added, removed, moved, or called a different number of times)."""
    with gc_paused():
        canon: dict[HookKey, HookKey] = {}
        ha, fa = _hook_stream(a, hook_keys(a, canon), canon)
        hb, fb = _hook_stream(b, hook_keys(b, canon), canon)
        if _same_order(ha, hb, fa, fb):
            return set(), set()
        sa, where_a = _sequences(ha, fa)
        sb, where_b = _sequences(hb, fb)
        out_a: set[int] = set()
        out_b: set[int] = set()
        for sk in list(sa) + [k for k in sb if k not in sa]:
            la, lb = sa.get(sk, []), sb.get(sk, [])
            if la == lb:
                continue
            pairs = align(la, lb) if la and lb else []
            matched_a = {p for p, _ in pairs}
            matched_b = {q for _, q in pairs}
            out_a.update(ha[where_a[sk][i]].seq for i in range(len(la)) if i not in matched_a)
            out_b.update(hb[where_b[sk][i]].seq for i in range(len(lb)) if i not in matched_b)
        return out_a, out_b
