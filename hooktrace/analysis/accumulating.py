"""Surprise rule `accumulating` (docs/surprises.md): hooks of the same module, kind and code registered again in
each step and never removed, so their number grows from step to step (a leak; each call runs them
all). Typical: `register_forward_hook` inside the training loop, or inside `forward`.

Proved by the events alone: from the first step in which such hooks fire, every later step fires a
strict superset of the previous step's hooks (the old ones still fire: never removed; a new one
fires: registered again). A hook registered and removed in each step fires as a new hook alone each
step, which is not growth. Needs two steps or more.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from ..kinds import GLOBAL, HOOK
from ..schema import ROOT, Hook, Surprise, Trace
from .calls import STEP
from .firings import level_of

_Code = tuple[str, Optional[str], Optional[str], str, str, Optional[str]]


def _code(hook: Hook) -> _Code:
    """What "the same hook" means here: its place, its kind and its code (not its id)."""
    return (hook.scope, hook.module, hook.tensor, hook.kind, hook.name, hook.defined_at)


def _on(hook: Hook) -> str:
    if hook.tensor:
        return f"`{hook.tensor}`"
    if hook.module is None:
        return "every module" if hook.scope == GLOBAL else "no module"
    return f"`{hook.module or ROOT}`"


def accumulating(trace: Trace) -> list[Surprise]:
    if len(set(map(STEP, trace.events))) < 2:  # one step (or none): nothing can grow
        return []
    hooks = {h.id: h for h in trace.hooks}
    fired: dict[_Code, dict[int, dict[int, int]]] = defaultdict(
        lambda: defaultdict(dict)
    )  # step -> id -> seq
    steps: set[int] = set()
    for e in trace.events:
        steps.add(e.step)
        if e.type != HOOK or e.hook is None or e.hook not in hooks:
            continue
        fired[_code(hooks[e.hook])][e.step].setdefault(e.hook, e.seq)
    last = max(steps, default=0)
    out = []
    for by_step in fired.values():
        first = min(by_step)
        if last - first < 1:
            continue
        sets = [by_step.get(s, {}) for s in range(first, last + 1)]
        if not all(set(a) < set(b) for a, b in zip(sets, sets[1:])):
            continue
        hook = hooks[next(iter(sets[0]))]
        counts = ", ".join(f"{len(ids)} in step {first + i}" for i, ids in enumerate(sets))
        new = [seq for prev, ids in zip(sets, sets[1:]) for hid, seq in ids.items() if hid not in prev]
        ids = sorted({hid for ids in sets for hid in ids})
        out.append(
            Surprise(
                "accumulating",
                f"`{hook.name}` ({hook.kind} on {_on(hook)}) is registered again in each step and never "
                f"removed: {counts}, so each call runs them all (a leak). Register it once, outside the "
                "loop, or keep its handle and remove() it.",
                ids,
                sorted([*sets[0].values(), *new])[:50],
                level=level_of(trace, ids),
            )
        )
    return out
