"""Surprises of a whole training step: forward wrappers and optimizer steps vs hooks.

- `forward-wrapper`: a module's `forward` was replaced on the instance (accelerate's `cpu_offload` /
  `dispatch_model`, nnsight). PyTorch runs the forward pre-hooks before that wrapper and the forward
  hooks after it, so a pre-hook sees the module before the wrapper's work (weights still on `meta`
  or the CPU under accelerate's offload, inputs before nnsight's edits).
- `step-in-grad-hook`: an optimizer step ran inside a tensor `grad` hook of a parameter
  (`register_hook`). Such a hook runs before the gradient is accumulated into `.grad`, so that step
  used the previous `.grad` (None on the first step). The "optimizer in backward" pattern needs
  `register_post_accumulate_grad_hook`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from ..kinds import HOOK, OPTIMIZER_PHASE, K
from ..schema import Event, Surprise, Trace
from .calls import KIND, PHASE
from .calls import calls as module_calls
from .firings import hook_of, level_of, on_parameter, plural, where


def forward_wrapper(trace: Trace) -> list[Surprise]:
    """Forward pre-hooks that ran, in the same module call, before the module's forward wrapper."""
    if K.forward_wrapper not in map(KIND, trace.events):
        return []
    wrapper_events = [e for e in trace.events if e.type == HOOK and e.kind == K.forward_wrapper]
    if not wrapper_events:
        return []
    calls = [c for c in module_calls(trace) if c.module is not None]
    pre_events = [e for e in trace.events if e.type == HOOK and e.kind == K.forward_pre]
    found: dict[tuple[Optional[str], int], tuple[set[int], list[int]]] = {}
    for wrapper in wrapper_events:
        call = next((c for c in calls if c.module == wrapper.module and c.holds(wrapper)), None)
        if call is None:
            continue
        before = [e for e in pre_events if e.module == call.module and call.holds(e) and e.seq < wrapper.seq]
        if not before or wrapper.hook is None:
            continue
        ids, seqs = found.setdefault((call.module, wrapper.hook), (set(), []))
        ids.update(e.hook for e in before if e.hook is not None)
        seqs.extend([*(e.seq for e in before), wrapper.seq])
    out = []
    for (module, wrapper_id), (pre_ids, seqs) in found.items():
        wrapper_hook = hook_of(trace, wrapper_id)
        pres = [h for h in (hook_of(trace, p) for p in sorted(pre_ids)) if h is not None]
        names = ", ".join(f"`{h.name}`" for h in pres)
        wrapper_name = f"`{wrapper_hook.name}`" if wrapper_hook else "a forward wrapper"
        out.append(
            Surprise(
                "forward-wrapper",
                f"{where(module)}'s forward was replaced on the instance by {wrapper_name}; its forward "
                f"pre-hook{'s' if len(pres) > 1 else ''} {names} ran before that wrapper, so "
                f"{'they saw' if len(pres) > 1 else 'it saw'} the module and its inputs before the wrapper's "
                f"work (weights an offloading wrapper moves in, inputs it edits); forward hooks run after it.",
                [*sorted(pre_ids), wrapper_id],
                sorted(set(seqs))[:50],
                level=level_of(trace, sorted(pre_ids)),
            )
        )
    return out


def _inside(outer: Event, inner: Event) -> bool:
    """`inner` ran while `outer` was running, on its thread (hook events have start and duration)."""
    return (
        inner.thread == outer.thread
        and outer.start_ns <= inner.start_ns
        and inner.start_ns + inner.duration_ns <= outer.start_ns + outer.duration_ns
        and inner.seq > outer.seq
    )


def step_in_grad_hook(trace: Trace) -> list[Surprise]:
    """Optimizer-phase events nested in a parameter's `grad` hook: the step ran before accumulation."""
    if OPTIMIZER_PHASE not in map(PHASE, trace.events):
        return []
    steps = [e for e in trace.events if e.type == HOOK and e.phase == OPTIMIZER_PHASE]
    if not steps:
        return []
    grad_events = []
    for e in trace.events:
        if e.type == HOOK and e.kind == K.grad:
            hook = hook_of(trace, e.hook)
            if hook is not None and on_parameter(hook):
                grad_events.append((e, hook))
    found: dict[int, list[Event]] = defaultdict(list)
    for outer, hook in grad_events:
        inner = [s for s in steps if _inside(outer, s)]
        if inner:
            found[hook.id].extend([outer, *inner])
    out = []
    for hid, events in found.items():
        hook = trace.hook(hid)
        n = len({e.seq for e in events if e.kind == K.grad})
        out.append(
            Surprise(
                "step-in-grad-hook",
                f"an optimizer step ran inside `{hook.name}`, a grad hook on {hook.tensor} "
                f"({plural(n, 'call')}): a tensor grad hook runs before the gradient is accumulated into "
                f".grad, so that step used the previous .grad (None at first). Fuse the step into backward "
                f"with register_post_accumulate_grad_hook instead.",
                sorted({hid, *(e.hook for e in events if e.hook is not None)}),
                sorted({e.seq for e in events})[:50],
                level=level_of(trace, [hid]),
            )
        )
    return out
