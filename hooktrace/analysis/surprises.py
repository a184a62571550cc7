"""Surprise rules (docs/surprises.md): pure functions of a Trace that explain orders people do not expect.

A surprise claims only what the trace proves. Each has a level: `warn` when it changes the order or
the values a user's own hooks see, `info` for the rest (a library's own hooks, state-dict hooks
nobody asked for); `split_levels` separates them for renderers.
"""

from __future__ import annotations

import bisect
import operator
from collections import defaultdict
from itertools import islice
from typing import Callable, Collection, Iterable, Optional

from ..kinds import (
    BACKWARD,
    FORWARD,
    FORWARD_KINDS,
    GLOBAL,
    HOOK,
    MODULE,
    NODE,
    RECOMPUTE,
    SAVED_TENSORS,
    TABLE,
    TENSOR,
    TENSOR_KINDS,
    K,
)
from ..schema import ROOT, Event, Hook, Surprise, Trace, is_internal_error
from .accumulating import accumulating
from .calls import ERROR, KIND, RETURNED, Call, in_order
from .calls import calls as module_calls
from .compiled import Graphs, Windows, compiled
from .firings import MAX_SEQS, firings, hook_of, label, level_of, names, on_parameter, place, plural, where
from .identity import identity
from .never_fired import never_fired
from .recompute import recompute
from .training import forward_wrapper, step_in_grad_hook

__all__ = ["RULES", "find_surprises", "is_internal_error", "split_levels"]

# what PyTorch uses a hook's return value for, and who sees it then (kinds.TABLE)
REPLACED = {name: k.returned for name, k in TABLE.items() if k.returned is not None}


def on(hook: Hook) -> str:
    """What a hook is on: its tensor, its module, or what it fires for (firings.place)."""
    return place(hook)


_PREPEND = operator.attrgetter("prepend")


# -- order around one call ----------------------------------------------------------------------
def global_first(trace: Trace) -> list[Surprise]:
    if not any(map(_PREPEND, trace.hooks)):  # the common case, read in one C-level pass
        return []
    prepended = {h.id for h in trace.hooks if h.scope == MODULE and h.prepend}
    global_ids = {h.id for h in trace.hooks if h.scope == GLOBAL}
    if not prepended or not global_ids:  # the common case: nothing to look for in the events
        return []
    found: dict[int, tuple[set[int], list[int]]] = {}
    for firing in firings(trace):
        globals_seen: list[tuple[int, int]] = []  # (hook id, seq)
        for e in firing:
            if e.hook in global_ids:
                globals_seen.append((e.hook, e.seq))
            elif e.hook in prepended and globals_seen:
                ids, seqs = found.setdefault(e.hook, (set(), []))
                ids.update(g for g, _ in globals_seen)
                if len(seqs) < MAX_SEQS:
                    seqs.extend([*(seq for _, seq in globals_seen), e.seq])
    out = []
    for hid, (before, seqs) in found.items():
        hook = trace.hook(hid)
        how = "registered with prepend=True" if hook.prepend_source == "registration" else "prepended"
        ahead = sorted(before)
        hooks = f"hook{'s' if len(ahead) > 1 else ''} {names(label(trace.hook(g)) for g in ahead)}"
        out.append(
            Surprise(
                "global-first",
                f"{label(hook)} on {where(hook.module)} was {how}, yet the global {hook.kind} {hooks} still "
                f"ran before it: PyTorch runs global module hooks before every module's own hooks, and "
                f"prepend only reorders the module's own dict.",
                [hid, *ahead],
                sorted(set(seqs)),
                level=level_of(trace, [hid, *ahead]),
            )
        )
    return out


def prepend_displaced(trace: Trace) -> list[Surprise]:
    if not any(map(_PREPEND, trace.hooks)):
        return []
    prepended = {h.id for h in trace.hooks if h.scope == MODULE and h.prepend}
    if not prepended:  # the common case: nothing to look for in the events
        return []
    module_ids = {h.id for h in trace.hooks if h.scope == MODULE}
    found: dict[int, tuple[set[int], list[int]]] = {}
    for firing in firings(trace):
        before: list[tuple[int, int]] = []  # (hook id, seq)
        for e in firing:
            if e.hook not in module_ids:
                continue
            ahead = [(b, seq) for b, seq in before if b != e.hook]
            if e.hook in prepended and ahead:
                ids, seqs = found.setdefault(e.hook, (set(), []))
                ids.update(b for b, _ in ahead)
                if len(seqs) < MAX_SEQS:
                    seqs.extend([*(seq for _, seq in ahead), e.seq])
            before.append((e.hook, e.seq))
    out = []
    for hid, (ahead_ids, seqs) in found.items():
        hook = trace.hook(hid)
        in_front = [trace.hook(a) for a in sorted(ahead_ids)]
        later_prepends = [h for h in in_front if h.prepend and h.id > hid]
        others = [h for h in in_front if h not in later_prepends]
        why = []
        if later_prepends:
            why.append(
                f"{names(label(h) for h in later_prepends)} {'were' if len(later_prepends) > 1 else 'was'} "
                f"registered later with prepend, and the latest prepend runs first"
            )
        if others:
            why.append(
                f"{names(label(h) for h in others)} {'were' if len(others) > 1 else 'was'} put in front of it "
                f"without prepend=True after it was registered (the hook dict was edited directly)"
            )
        out.append(
            Surprise(
                "prepend-displaced",
                f"{label(hook)} on {on(hook)} is flagged prepend but is not first among the module's "
                f"{hook.kind} hooks: {names(label(h) for h in in_front)} ran before it; {'; '.join(why)}.",
                [hid, *sorted(ahead_ids)],
                sorted(set(seqs)),
                level=level_of(trace, [hid, *ahead_ids]),
            )
        )
    return out


# -- values -------------------------------------------------------------------------------------
def replaced_value(trace: Trace) -> list[Surprise]:
    """Hooks whose return value PyTorch used instead of what it passed (`returned`: not None and not
    the very object it was given); the same hook re-registered every step counts as one."""
    if not any(map(RETURNED, trace.events)):
        return []
    by_hook: dict[tuple, list[Event]] = defaultdict(list)
    first: dict[tuple, Hook] = {}
    for e in trace.events:
        if e.type == HOOK and e.returned:
            hook = hook_of(trace, e.hook)
            if hook is None:
                continue
            key = identity(hook)
            first.setdefault(key, hook)
            by_hook[key].append(e)
    out = []
    for key, events in by_hook.items():
        hook = first[key]
        ids = sorted({e.hook for e in events if e.hook is not None})
        what = REPLACED.get(hook.kind, "a value PyTorch uses: what ran after it saw")
        steps = sorted({e.step for e in events})
        in_steps = (
            f" (step{'s' if len(steps) > 1 else ''} {names(str(s) for s in steps)})" if len(steps) > 1 else ""
        )
        out.append(
            Surprise(
                "replaced-value",
                f"{label(hook)} ({hook.kind} on {on(hook)}) returned a new value in "
                f"{plural(len(events), 'call')}{in_steps}; PyTorch used it in place of {what} it.",
                ids,
                [e.seq for e in events][:MAX_SEQS],
                level=level_of(trace, ids),
            )
        )
    return out


def legacy_backward(trace: Trace) -> list[Surprise]:
    if K.backward_legacy not in map(KIND, trace.hooks):  # one C-level pass over the hooks' kinds
        return []
    legacy = [h for h in trace.hooks if h.kind == K.backward_legacy]
    seqs: dict[int, list[int]] = {h.id: [] for h in legacy}
    for e in trace.events:
        found = seqs.get(e.hook) if e.type == HOOK else None  # type: ignore[arg-type]
        if found is not None and len(found) < MAX_SEQS:
            found.append(e.seq)
    return [
        Surprise(
            "legacy-backward",
            f"{label(h)} on {where(h.module)} uses register_backward_hook (non-full): PyTorch attaches it to "
            f"the grad_fn of the output's last operation, so its grad_input can miss gradients when the "
            f"module's forward has several operations. Use register_full_backward_hook.",
            [h.id],
            seqs[h.id],
            level=level_of(trace, [h.id]),
        )
        for h in legacy
    ]


def hook_error(trace: Trace) -> list[Surprise]:
    if not any(map(ERROR, trace.events)):
        return []
    out = []
    events = in_order(trace.events)
    seqs: list[int] = []
    calls: list[Call] = []
    for e in events:
        if e.type != HOOK or not e.error or is_internal_error(e.error):
            continue
        hook = hook_of(trace, e.hook)
        name = label(hook) if hook else f"hook #{e.hook}"
        if not seqs:
            seqs, calls = [x.seq for x in events], module_calls(trace)
        # the rest of the call the hook raised in: its module's innermost call holding it
        call = next((c for c in reversed(calls) if c.module == e.module and c.holds(e)), None)
        # no call holds it (its enter is not in the trace): nothing is claimed of the rest of that call
        still: list[Event] = []
        end = call.end if call is not None else None
        for later in islice(events, bisect.bisect_right(seqs, e.seq), None) if call is not None else ():
            if end is not None and later.seq >= end:
                break
            if later.type == HOOK and later.module == e.module and later.kind == K.forward:
                other = hook_of(trace, later.hook)
                if other is not None and other.always_call:
                    still.append(later)
        message = f"{name} ({e.kind} on {on(hook) if hook else where(e.module)}) raised {e.error}."
        if still:
            ran = names(label(trace.hook(s.hook)) for s in still)  # type: ignore[arg-type]
            message += f" always_call forward hook{'s' if len(still) > 1 else ''} that still ran: {ran}."
        elif e.kind in FORWARD_KINDS and call is not None and call.end is not None:  # its end is in the trace
            message += " No always_call forward hook ran after it."
        ids = [i for i in (e.hook, *(s.hook for s in still)) if i is not None]
        out.append(Surprise("hook-error", message, ids, [e.seq, *(s.seq for s in still)], level="warn"))
    return out


# -- registration -------------------------------------------------------------------------------


def registered_during_run(trace: Trace) -> list[Surprise]:
    """A hook registered while the model ran, when the events prove the calls differ: a call of its
    module (forward kinds) or a step (other kinds) ran without it, and another with it."""
    if not any(map(operator.attrgetter("registered_during_run"), trace.hooks)):  # one C-level pass
        return []
    hooks = [
        h
        for h in trace.hooks
        if h.registered_during_run
        and h.scope not in (NODE, SAVED_TENSORS)
        and (h.scope != TENSOR or on_parameter(h))
    ]
    if not hooks:
        return []
    fired: dict[int, list[Event]] = defaultdict(list)
    for e in trace.events:
        if e.type == HOOK and e.hook is not None:
            fired[e.hook].append(e)
    calls = [c for c in module_calls(trace) if c.phase in (FORWARD, RECOMPUTE) and not c.raised]
    # one surprise per hook and module: a hook registered anew in every forward (PEFT's per-forward
    # hooks) is one finding, its registrations listed together
    found: dict[tuple, list[tuple[Hook, str, list[int]]]] = {}
    for hook in hooks:
        proof = _with_and_without(trace, hook, fired.get(hook.id, []), calls)
        if proof is not None:
            key = (hook.scope, hook.module, hook.tensor, hook.kind, hook.name, hook.defined_at)
            found.setdefault(key, []).append((hook, *proof))
    out = []
    for group in found.values():
        hook, sentence, seqs = group[0]
        ids = [h.id for h, _, _ in group]
        again = f" ({len(group)} registrations of it, each proven so)" if len(group) > 1 else ""
        out.append(
            Surprise(
                "registered-during-run",
                f"{label(hook)} ({hook.kind} on {on(hook)}) was registered while the model ran{again}: "
                f"{sentence}, so the hooks that ran differ between them.",
                ids,
                sorted({seq for _, _, more in group for seq in more}),
                level=level_of(trace, ids),
            )
        )
    return out


def _with_and_without(
    trace: Trace, hook: Hook, mine: list[Event], calls: list
) -> Optional[tuple[str, list[int]]]:
    """What ran without the hook and what with it, and the first event of each; None unless both."""
    if not mine:
        return None
    if hook.kind in FORWARD_KINDS:
        if hook.scope == GLOBAL:  # a global hook fires in every module call: its events name the module
            has = [any(e.module == c.module and c.holds(e) for e in mine) for c in calls]
            relevant, what = calls, "module call"
        else:
            relevant = [c for c in calls if c.module == hook.module]
            has = [any(c.holds(e) for e in mine) for c in relevant]
            what = f"call of {where(hook.module)}"
        n_with = sum(has)
        n_without = len(has) - n_with
        if not n_with or not n_without:
            return None
        first_without = next(c for c, h in zip(relevant, has) if not h)
        sentence = (
            f"{plural(n_without, what, what.replace('call', 'calls', 1))} ran without it and {n_with} with it"
        )
        return sentence, sorted([first_without.enter, mine[0].seq])
    phase = mine[0].phase
    steps_with = sorted({e.step for e in mine})
    steps_without = sorted({e.step for e in trace.events if e.phase == phase} - set(steps_with))
    if not steps_without:
        return None
    sentence = f"the {phase} of {_steps(steps_without)} ran without it and the {phase} of {_steps(steps_with)} with it"
    return sentence, [mine[0].seq]


def _steps(steps: list[int]) -> str:
    return f"step{'s' if len(steps) > 1 else ''} {names(str(s) for s in steps)}"


# -- tensor hooks vs module backward hooks ------------------------------------------------------
def _output_module(hook: Hook) -> Optional[str]:
    if hook.scope == TENSOR and hook.tensor and hook.tensor.startswith("output of "):
        path = hook.tensor[len("output of ") :]
        return "" if path == ROOT else path
    return None


def output_hook_before_backward_pre(trace: Trace) -> list[Surprise]:
    if K.backward_pre not in map(KIND, trace.events):
        return []
    first_pre: dict[tuple[int, str], Event] = {}
    for e in trace.events:
        if e.type == HOOK and e.kind == K.backward_pre and e.phase == BACKWARD and e.module is not None:
            first_pre.setdefault((e.step, e.module), e)
    if not first_pre:
        return []
    found: dict[int, list[Event]] = defaultdict(list)
    for e in trace.events:
        if e.type != HOOK or e.kind not in TENSOR_KINDS:
            continue
        hook = hook_of(trace, e.hook)
        module = _output_module(hook) if hook else None
        if module is None:
            continue
        pre = first_pre.get((e.step, module))
        if pre is not None and e.seq < pre.seq:
            found[e.hook].extend([e, pre])  # type: ignore[index]
    out = []
    for hid, events in found.items():
        hook = trace.hook(hid)
        pre_ids = sorted({ev.hook for ev in events if ev.kind == K.backward_pre and ev.hook is not None})
        pres = names(label(trace.hook(p)) for p in pre_ids)
        out.append(
            Surprise(
                "output-hook-before-backward-pre",
                f"tensor hook {label(hook)} on the {hook.tensor} fired before the full backward pre-hook"
                f"{'s' if len(pre_ids) > 1 else ''} {pres} of {where(_output_module(hook))}: a hook on the "
                f"output tensor runs when its gradient is ready, before the module's backward hooks see "
                f"grad_output.",
                [hid, *pre_ids],
                sorted({ev.seq for ev in events})[:MAX_SEQS],
                level=level_of(trace, [hid, *pre_ids]),
            )
        )
    return out


RULES: dict[str, Callable[[Trace], list[Surprise]]] = {
    "global-first": global_first,
    "prepend-displaced": prepend_displaced,
    "recompute": recompute,
    "never-fired": never_fired,
    "replaced-value": replaced_value,
    "legacy-backward": legacy_backward,
    "hook-error": hook_error,
    "registered-during-run": registered_during_run,
    "output-hook-before-backward-pre": output_hook_before_backward_pre,
    "accumulating": accumulating,
    "forward-wrapper": forward_wrapper,  # hooktrace's additions (docs/surprises.md): a whole training step's rules
    "step-in-grad-hook": step_in_grad_hook,
}


def find_surprises(
    trace: Trace,
    deleted: Collection[int] = frozenset(),
    compiled_calls: Optional[Windows] = None,
    replaced_nodes: Collection[int] = frozenset(),
    compiled_graphs: Optional[Graphs] = None,
    replaced_params: Collection[int] = frozenset(),
    unseen_backward: Optional[str] = None,
) -> list[Surprise]:
    """Every rule over the trace, in the order of docs/surprises.md's table, then `compiled`. The capture's
    facts, when known: `deleted`, ids of hooks their own code took out of their dict again
    (remove_spectral_norm): they are no never-fired; `compiled_calls`, the module calls that ran
    compiled (capture/build.py `compiled_windows`); `replaced_nodes`, node hooks on an AccumulateGrad node
    that their parameter's move to another dtype or device replaced; `replaced_params`, hooks on a
    parameter (or its AccumulateGrad node) that a move replaced by a new tensor (to or from `meta`);
    `compiled_graphs`, the hooks Dynamo compiled into each graph (capture/build.py `compiled_graphs`);
    `unseen_backward`, a backward pass the driver saw run inside the capture untraced (never_fired)."""
    in_graph = compiled(trace, compiled_calls or {}, compiled_graphs)
    # a trace analysed again (loaded) keeps its own `compiled` surprises: never_fired reads them
    hidden = {hid for s in in_graph for hid in s.hooks} if compiled_calls is not None else None
    found: list[Surprise] = []
    for name, rule in RULES.items():
        if name == "never-fired":
            found.extend(
                never_fired(
                    trace,
                    exclude=set(deleted),
                    in_graph=hidden,
                    replaced=set(replaced_nodes),
                    replaced_params=set(replaced_params),
                    unseen_backward=unseen_backward,
                )
            )
        else:
            found.extend(rule(trace))
    return found + in_graph


def split_levels(surprises: Iterable[Surprise]) -> tuple[list[Surprise], list[Surprise]]:
    """(warn, info), each in the order given: renderers show every `warn` and sum the `info` ones up
    ("+N info surprises") unless asked for all. A missing or unknown level counts as `warn`."""
    warn: list[Surprise] = []
    info: list[Surprise] = []
    for s in surprises:
        (info if getattr(s, "level", "warn") == "info" else warn).append(s)
    return warn, info
