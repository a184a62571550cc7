"""How many: the one place the numbers every rendering and message shows are computed.

One vocabulary, the same numbers in the tree's summary, the `wrote` line, the SVG title, the
notebook and the rank summaries:

- **hooks registered**: distinct hooks the trace knows (registered before the run or during it);
- **hooks that fired**: distinct hooks among them that PyTorch called at least once;
- **hook calls**: hook events (one per call of a hook);
- **module calls**: `enter` events (one per call of a module).

"Distinct" does not grow with `--steps`: a hook that code registers anew in every step and removes
again (checkpoint's saved-tensor hooks, a hook registered per step and removed after it) is one
hook. Hooks with the same identity (scope, module, tensor, kind, name: `identity.py`) are counted
as many times as the most of them that fired in any one step, so hooks that really pile up from
step to step (the `accumulating` surprise) still count one each. A hook that never fired is placed
in the step where hooks registered just before it (lower handle ids) fired first.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional

from ..ids import family  # handle ids, synthetic ids, copies' ids: order only within a family
from ..kinds import ENTER, HOOK
from ..schema import Event, Trace
from .identity import identity

__all__ = ["Counts", "count", "plural", "summary"]


def plural(n: int, one: str, many: Optional[str] = None) -> str:
    """`1 hook`, `2 hooks`; `many` for irregular words."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


@dataclass(frozen=True)
class Counts:
    """The numbers of one trace (or of the part of it a view shows)."""

    registered: int  # distinct hooks registered
    fired: int  # distinct hooks that fired
    hook_calls: int
    module_calls: int
    modules: int  # distinct modules that were called or ran a hook
    steps: int

    def phrase(self) -> str:
        """`13 hooks registered, 11 fired, 50 hook calls, 14 module calls` (the words everywhere)."""
        return (
            f"{plural(self.registered, 'hook')} registered, {self.fired} fired, "
            f"{plural(self.hook_calls, 'hook call')}, {plural(self.module_calls, 'module call')}"
        )


def count(trace: Trace, events: Optional[Iterable[Event]] = None) -> Counts:
    """The counts of `trace`; of `events` only (a view's part of it) when given: hooks registered
    are then the hooks those events name."""
    whole = events is None
    evs = trace.events if events is None else list(events)
    hook_steps: dict[int, set[int]] = defaultdict(set)
    module_calls = 0
    modules = set()
    steps = set()
    for e in evs:
        steps.add(e.step)
        if e.module is not None:
            modules.add(e.module)
        if e.type == HOOK and e.hook is not None:
            hook_steps[e.hook].add(e.step)
        elif e.type == ENTER:
            module_calls += 1
    hook_calls = sum(1 for e in evs if e.type == HOOK)
    known = {h.id: identity(h) for h in trace.hooks}
    ids = set(known) if whole else set()
    ids |= set(hook_steps)
    fired = _distinct({i: hook_steps[i] for i in hook_steps}, known)
    placed = dict(hook_steps)
    placed.update(_place_unfired(ids - set(hook_steps), hook_steps, min(steps, default=0)))
    registered = _distinct(placed, known)
    return Counts(registered, fired, hook_calls, module_calls, len(modules), len(steps))


def _distinct(steps_of: dict[int, set[int]], known: dict[int, tuple]) -> int:
    """Per identity, the most hooks of it present in one step; summed over identities."""
    per: Counter[tuple] = Counter()
    for hook_id, steps in steps_of.items():
        ident = known.get(hook_id, ("?", hook_id))
        for step in steps:
            per[(ident, step)] += 1
    most: dict[tuple, int] = {}
    for (ident, _), n in per.items():
        most[ident] = max(most.get(ident, 0), n)
    return sum(most.values())


def _place_unfired(unfired: set[int], fired: dict[int, set[int]], first_step: int) -> dict[int, set[int]]:
    """A step for each hook that never fired: the first step of the closest fired hook registered
    before it (same id family), else the first step."""
    by_family: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for hook_id, steps in fired.items():
        by_family[family(hook_id)].append((hook_id, min(steps)))
    for rows in by_family.values():
        rows.sort()
    placed = {}
    for hook_id in unfired:
        rows = by_family.get(family(hook_id), [])
        i = bisect.bisect_left(rows, (hook_id,))
        placed[hook_id] = {rows[i - 1][1] if i else first_step}
    return placed


def summary(trace: Trace) -> str:
    """The counts every rendering shows, and the surprises: a session's repr."""
    return f"{count(trace).phrase()}, {plural(len(trace.surprises), 'surprise')}"
