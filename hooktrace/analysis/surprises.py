"""Surprise rules (SPEC §4): pure functions of a Trace that explain orders people do not expect."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable, Optional

from ..schema import (
    FORWARD_KINDS,
    REGISTRATION_KINDS,
    ROOT,
    STATE_DICT_KINDS,
    TENSOR_KINDS,
    Event,
    Hook,
    Surprise,
    Trace,
    is_internal_error,
)

REPLACED = {
    "forward_pre": "the module's inputs (args/kwargs)",
    "forward": "the module's output",
    "backward_pre": "grad_output",
    "backward": "grad_input",
    "backward_legacy": "grad_input",
    "grad": "the tensor's gradient",
    "state_dict": "the state dict",
}


def where(path: Optional[str]) -> str:
    if path is None:
        return "a module outside the model"
    return f"`{path}`" if path else f"`{ROOT}`"


def label(hook: Hook) -> str:
    return f"`{hook.name}`"


def _list(names: Iterable[str], most: int = 6) -> str:
    names = list(dict.fromkeys(names))
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _groups(trace: Trace) -> list[list[Event]]:
    """Runs of consecutive hook events of one (step, phase, module, kind): one firing of a hook list."""
    groups: list[list[Event]] = []
    last = None
    for e in trace.events:
        if e.type != "hook":
            continue
        key = (e.step, e.phase, e.module, e.kind)
        if key == last:
            groups[-1].append(e)
        else:
            groups.append([e])
            last = key
    return groups


def global_first(trace: Trace) -> list[Surprise]:
    prepended = {h.id for h in trace.hooks if h.scope == "module" and h.prepend}
    global_ids = {h.id for h in trace.hooks if h.scope == "global"}
    if not prepended or not global_ids:  # the common case: nothing to look for in the events
        return []
    found: dict[int, tuple[set[int], list[int]]] = {}
    for group in _groups(trace):
        globals_seen: list[Event] = []
        for e in group:
            if e.hook in global_ids:
                globals_seen.append(e)
            elif e.hook in prepended and globals_seen:
                ids, seqs = found.setdefault(e.hook, (set(), []))
                ids.update(g.hook for g in globals_seen)
                if len(seqs) < 50:
                    seqs.extend([*(g.seq for g in globals_seen), e.seq])
    out = []
    for hid, (global_ids, seqs) in found.items():
        hook = trace.hook(hid)
        how = "registered with prepend=True" if hook.prepend_source == "registration" else "prepended"
        names = _list(label(trace.hook(g)) for g in sorted(global_ids))
        out.append(
            Surprise(
                "global-first",
                f"{label(hook)} on {where(hook.module)} was {how}, yet the global {hook.kind} hook(s) {names} "
                f"still ran before it: PyTorch runs global module hooks before every module's own hooks, and "
                f"prepend only reorders the module's own dict.",
                [hid, *sorted(global_ids)],
                sorted(set(seqs)),
            )
        )
    return out


def prepend_displaced(trace: Trace) -> list[Surprise]:
    prepended = {h.id for h in trace.hooks if h.scope == "module" and h.prepend}
    if not prepended:  # the common case: nothing to look for in the events
        return []
    module_ids = {h.id for h in trace.hooks if h.scope == "module"}
    found: dict[int, tuple[set[int], list[int]]] = {}
    for group in _groups(trace):
        before: list[Event] = []
        for e in group:
            if e.hook not in module_ids:
                continue
            if e.hook in prepended and before:
                ids, seqs = found.setdefault(e.hook, (set(), []))
                ids.update(b.hook for b in before)
                if len(seqs) < 50:
                    seqs.extend([*(b.seq for b in before), e.seq])
            before.append(e)
    out = []
    for hid, (ahead, seqs) in found.items():
        hook = trace.hook(hid)
        later = [trace.hook(a) for a in sorted(ahead)]
        names = _list(label(h) for h in later)
        out.append(
            Surprise(
                "prepend-displaced",
                f"{label(hook)} on {where(hook.module)} is flagged prepend but did not run first among the module's "
                f"{hook.kind} hooks: {names} went in front of it (a later prepend=True wins over an earlier one).",
                [hid, *sorted(ahead)],
                sorted(set(seqs)),
            )
        )
    return out


def recompute(trace: Trace) -> list[Surprise]:
    events = [
        e for e in trace.events if e.phase == "recompute" and e.type == "hook" and e.kind in FORWARD_KINDS
    ]
    if not events:
        return []
    modules = _list(where(e.module) for e in events)
    hook_ids = sorted({e.hook for e in events})
    message = (
        f"forward hooks fired again during backward ({len(events)} call(s) on {modules}): activation "
        f"checkpointing re-ran the forward, so these hooks see a second forward per step."
    )
    stopped = [
        e for e in trace.events if e.type == "exit" and e.phase == "recompute" and is_internal_error(e.error)
    ]
    if stopped:
        forward_ids = {
            (e.step, e.module, e.hook)
            for e in trace.events
            if e.type == "hook" and e.phase == "forward" and e.kind in FORWARD_KINDS
        }
        again = {(e.step, e.module, e.hook) for e in events}
        skipped = sorted(
            {hid for (step, _m, hid) in forward_ids - again if any(s.step == step for s in stopped)}
        )
        message += (
            f" The recompute stopped early in {_list(where(e.module) for e in stopped)} (PyTorch's checkpoint "
            f"stops once it has what backward needs)"
        )
        if skipped:
            message += f", so {_list(label(trace.hook(h)) for h in skipped)} did not re-run"
        message += "."
        return [Surprise("recompute", message, hook_ids, [e.seq for e in events] + [e.seq for e in stopped])]
    return [Surprise("recompute", message, hook_ids, [e.seq for e in events])]


def _never_fired_reason(trace: Trace, hook: Hook, entered: set, raised: set, backward_ran: bool) -> str:
    if hook.removed_during_run:
        return "it was removed during the run before it could fire"
    if hook.kind in STATE_DICT_KINDS:
        return "state_dict()/load_state_dict() was not called while tracing"
    if hook.kind in REGISTRATION_KINDS:
        return "no submodule, parameter or buffer was registered while tracing"
    if hook.kind not in FORWARD_KINDS and not backward_ran:
        return "no backward pass ran (--no-backward, or nothing in the output required grad)"
    if hook.scope == "module" and hook.module not in entered:
        return f"its module {where(hook.module)} was never called"
    if hook.kind == "forward" and hook.module in raised and not hook.always_call:
        return (
            f"the forward of {where(hook.module)} raised before forward hooks ran "
            f"(always_call=True would have run it)"
        )
    if hook.scope == "module" and hook.kind in ("backward_pre", "backward", "backward_legacy"):
        return (
            f"no gradient flowed through {where(hook.module)} (its outputs did not require grad or were "
            f"not used by the loss)"
        )
    if hook.scope == "tensor":
        return f"no gradient was computed for {hook.tensor or 'its tensor'}"
    if hook.registered_during_run:
        return "it was registered during the run, after the calls it would have fired for"
    return "nothing it applies to ran while tracing"


def never_fired(trace: Trace) -> list[Surprise]:
    fired = {e.hook for e in trace.events if e.type == "hook"}
    entered = {e.module for e in trace.events if e.type == "enter"}
    raised = {
        e.module for e in trace.events if e.type == "exit" and e.error and not is_internal_error(e.error)
    }
    backward_ran = any(e.phase == "backward" for e in trace.events)
    by_reason: dict[str, list[Hook]] = defaultdict(list)
    for hook in trace.hooks:
        if hook.id not in fired:
            by_reason[_never_fired_reason(trace, hook, entered, raised, backward_ran)].append(hook)
    return [
        Surprise(
            "never-fired",
            f"{_list(f'{label(h)} ({h.kind} on {h.tensor or where(h.module)})' for h in hooks)} never fired: "
            f"{reason}.",
            [h.id for h in hooks],
            [],
        )
        for reason, hooks in by_reason.items()
    ]


def replaced_value(trace: Trace) -> list[Surprise]:
    by_hook: dict[int, list[int]] = defaultdict(list)
    for e in trace.events:
        if e.type == "hook" and e.returned:
            by_hook[e.hook].append(e.seq)
    out = []
    for hid, seqs in by_hook.items():
        hook = trace.hook(hid)
        what = REPLACED.get(hook.kind, "a value PyTorch uses")
        out.append(
            Surprise(
                "replaced-value",
                f"{label(hook)} ({hook.kind} on {hook.tensor or where(hook.module)}) returned a value {len(seqs)} "
                f"time(s); it replaced {what}, so every hook after it saw the replacement.",
                [hid],
                seqs,
            )
        )
    return out


def legacy_backward(trace: Trace) -> list[Surprise]:
    legacy = [h for h in trace.hooks if h.kind == "backward_legacy"]
    if not legacy:
        return []
    seqs: dict[int, list[int]] = {h.id: [] for h in legacy}
    for e in trace.events:
        found = seqs.get(e.hook) if e.type == "hook" else None
        if found is not None and len(found) < 50:
            found.append(e.seq)
    return [
        Surprise(
            "legacy-backward",
            f"{label(h)} on {where(h.module)} uses register_backward_hook (non-full): it is attached to the "
            f"grad_fn of the output's last operation, so grad_input can miss gradients when forward has "
            f"several operations. Use register_full_backward_hook.",
            [h.id],
            seqs[h.id],
        )
        for h in legacy
    ]


def hook_error(trace: Trace) -> list[Surprise]:
    out = []
    events = trace.events
    for e in events:
        if e.type != "hook" or not e.error or is_internal_error(e.error):
            continue
        hook = trace.hook(e.hook)
        still: list[Event] = []
        for later in events[e.seq + 1 :]:
            if later.module == e.module and later.type == "exit":
                break
            if later.type == "hook" and later.module == e.module and later.kind == "forward":
                if trace.hook(later.hook).always_call:
                    still.append(later)
        message = f"{label(hook)} ({hook.kind} on {hook.tensor or where(e.module)}) raised {e.error}."
        if still:
            message += (
                f" always_call hooks that still ran: {_list(label(trace.hook(s.hook)) for s in still)}."
            )
        elif e.kind in FORWARD_KINDS:
            message += " No always_call forward hook ran after it."
        out.append(
            Surprise(
                "hook-error", message, [hook.id, *(s.hook for s in still)], [e.seq, *(s.seq for s in still)]
            )
        )
    return out


def _on_parameter(hook: Hook) -> bool:
    return (
        hook.scope == "tensor"
        and bool(hook.tensor)
        and not hook.tensor.startswith(("output of", "input of", "tensor in", "tensor"))
    )


def registered_during_run(trace: Trace) -> list[Surprise]:
    hooks = [h for h in trace.hooks if h.registered_during_run and (h.scope != "tensor" or _on_parameter(h))]
    if not hooks:
        return []
    return [
        Surprise(
            "registered-during-run",
            f"{_list(f'{label(h)} ({h.kind} on {h.tensor or where(h.module)})' for h in hooks)} "
            f"{'was' if len(hooks) == 1 else 'were'} registered while the model ran, so the hook order differs "
            f"between the call that registered {'it' if len(hooks) == 1 else 'them'} and later calls or steps.",
            [h.id for h in hooks],
            [],
        )
    ]


def _output_module(hook: Hook) -> Optional[str]:
    if hook.scope == "tensor" and hook.tensor and hook.tensor.startswith("output of "):
        path = hook.tensor[len("output of ") :]
        return "" if path == ROOT else path
    return None


def output_hook_before_backward_pre(trace: Trace) -> list[Surprise]:
    first_pre: dict[tuple[int, str], int] = {}
    for e in trace.events:
        if e.type == "hook" and e.kind == "backward_pre" and e.phase == "backward" and e.module is not None:
            first_pre.setdefault((e.step, e.module), e.seq)
    found: dict[int, list[int]] = defaultdict(list)
    for e in trace.events:
        if e.type != "hook" or e.kind not in TENSOR_KINDS:
            continue
        module = _output_module(trace.hook(e.hook))
        if module is None:
            continue
        pre = first_pre.get((e.step, module))
        if pre is not None and e.seq < pre:
            found[e.hook].extend([e.seq, pre])
    out = []
    for hid, seqs in found.items():
        hook = trace.hook(hid)
        module = _output_module(hook)
        pre_ids = sorted(
            {ev.hook for ev in trace.events if ev.seq in set(seqs) and ev.kind == "backward_pre"}
        )
        out.append(
            Surprise(
                "output-hook-before-backward-pre",
                f"tensor hook {label(hook)} on the {hook.tensor} fired before the full backward pre-hook(s) "
                f"{_list(label(trace.hook(p)) for p in pre_ids)} of {where(module)}: a hook on the output tensor "
                f"runs when its gradient is ready, before the module's backward hooks see grad_output.",
                [hid, *pre_ids],
                sorted(set(seqs)),
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
}


def find_surprises(trace: Trace) -> list[Surprise]:
    """Every rule over the trace, in the order of SPEC §4's table."""
    found: list[Surprise] = []
    for rule in RULES.values():
        found.extend(rule(trace))
    return found
