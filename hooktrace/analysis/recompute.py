"""The `recompute` surprise: forward hooks that fired again during backward.

Activation checkpointing runs a module's forward a second time inside autograd's backward, so its
forward hooks see two forwards in one step. PyTorch's non-reentrant checkpoint may stop that
recompute early (it raises and catches `_StopRecomputationError` once backward has what it needs);
then hooks that fired in the first forward's call can miss the second, and the message names them.
"""

from __future__ import annotations

from ..kinds import FORWARD, FORWARD_KINDS, HOOK, RECOMPUTE
from ..schema import Hook, Surprise, Trace
from .calls import PHASE
from .calls import calls as module_calls
from .firings import MAX_SEQS, hook_of, label, level_of, names, place, plural, where


def recompute(trace: Trace) -> list[Surprise]:
    if RECOMPUTE not in map(PHASE, trace.events):
        return []
    events = [e for e in trace.events if e.type == HOOK and e.phase == RECOMPUTE and e.kind in FORWARD_KINDS]
    if not events:
        return []
    hook_ids = sorted({e.hook for e in events if e.hook is not None})
    modules = names(where(e.module) for e in events)
    message = (
        f"forward hooks fired again during backward ({plural(len(events), 'call')} on {modules}): the forward "
        f"of these modules ran again while autograd's backward ran, as activation checkpointing does, so "
        f"these hooks saw a second forward in the step."
    )
    calls = module_calls(trace)
    stopped = [c for c in calls if c.phase == RECOMPUTE and c.stopped]
    seqs = [e.seq for e in events]
    if stopped:
        message += (
            f" PyTorch's checkpoint stopped the recompute early (it raised and caught "
            f"_StopRecomputationError in {names(where(c.module) for c in stopped)}) once it had what "
            f"backward needed"
        )
        skipped = _did_not_rerun(trace, calls, stopped)
        if skipped:
            message += f", so {names(f'{label(h)} (on {place(h)})' for h in skipped)} did not re-run"
        message += "."
        seqs += [c.exit for c in stopped if c.exit is not None]
    return [
        Surprise("recompute", message, hook_ids, sorted(seqs)[:MAX_SEQS], level=level_of(trace, hook_ids))
    ]


def _did_not_rerun(trace: Trace, calls: list, stopped: list) -> list[Hook]:
    """Forward-kind hooks that fired inside a module's forward call but not inside its recompute
    call that PyTorch stopped: only for modules called once in that step's forward (so the two calls
    are surely the same), and only hooks inside that call (the checkpointed region)."""
    hook_events = [e for e in trace.events if e.type == HOOK and e.kind in FORWARD_KINDS]
    missing: dict[int, Hook] = {}
    for stop in stopped:
        forward = [c for c in calls if c.phase == FORWARD and c.step == stop.step and c.module == stop.module]
        if len(forward) != 1 or forward[0].exit is None:
            continue
        first = {(e.module, e.hook) for e in hook_events if forward[0].holds(e)}
        again = {(e.module, e.hook) for e in hook_events if stop.holds(e)}
        for _module, hid in sorted(first - again, key=lambda k: (str(k[0]), k[1] or -1)):
            hook = hook_of(trace, hid)
            if hook is not None:
                missing.setdefault(hook.id, hook)
    return list(missing.values())
