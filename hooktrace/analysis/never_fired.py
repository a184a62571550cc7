"""`never-fired`: a registered hook that did not fire, with the reason when the trace proves it.

A reason is stated as fact only when the events (or `meta.backward`, what `hooktrace run` did) prove
it; otherwise the message says the trace does not show why. Backward hooks under `--no-backward`
(`meta.backward == "off"`) are what the user asked for: no surprise.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from itertools import compress
from operator import attrgetter, eq
from typing import Collection, Optional

from ..kinds import (
    BACKWARD,
    ENTER,
    EXIT,
    FORWARD,
    FORWARD_KINDS,
    GLOBAL,
    HOOK,
    INPUT_OF,
    MODULE,
    NODE,
    OPTIMIZER_KINDS,
    OUTPUT_OF,
    REGISTRATION_KINDS,
    SAVED_TENSORS,
    STATE_DICT_KINDS,
    TABLE,
    TENSOR,
    K,
)
from ..schema import Event, Hook, Surprise, Trace, is_internal_error
from .calls import HOOK_ID, TYPE, Call, calls
from .firings import is_library_hook, place, plural, where

_HOOK_ID_OF = attrgetter("id")  # a hook's id

CONTAINERS = ("ModuleList", "ModuleDict", "ParameterList", "ParameterDict")
NOT_ASKED = "info"  # hooks of calls nobody made (state_dict(), registrations): not surprising


def _since(trace: Trace) -> str:
    """When the hook could have fired: after its registration, unless steps ran untraced first
    (`run --warmup`, `exec --start`), where it may have fired unseen: then only the traced steps."""
    return "in the traced steps" if trace.meta.warmup else "after it was registered"


def _label(hook: Hook) -> str:
    return f"`{hook.name}`"


def _names(items: list[str], most: int = 6) -> str:
    unique = list(dict.fromkeys(items))
    if len(unique) > most:
        return ", ".join(unique[:most]) + f" and {len(unique) - most} more"
    return ", ".join(unique[:-1]) + f" and {unique[-1]}" if len(unique) > 1 else "".join(unique)


def _inside(path: Optional[str], parent: str) -> bool:
    """`path` is a strict descendant of module `parent`."""
    if path is None or path == parent:
        return False
    return parent == "" or path.startswith(parent + ".")


@dataclass
class _Facts:
    """What the events say, computed once per trace."""

    trace: Trace
    fired: set = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)
    entered: set = field(default_factory=set)
    types: dict = field(default_factory=dict)
    backward_steps: set = field(default_factory=set)
    kinds_fired: set = field(default_factory=set)
    errors: list[Event] = field(default_factory=list)
    replaced: set = field(default_factory=set)
    replaced_params: set = field(default_factory=set)
    unseen_backward: Optional[str] = None

    @classmethod
    def of(cls, trace: Trace) -> _Facts:
        facts = cls(trace)
        for e in trace.events:
            if e.type == HOOK:
                facts.fired.add(e.hook)
                facts.kinds_fired.add(e.kind)
            elif e.type == ENTER:
                facts.entered.add(e.module)
            if e.phase == BACKWARD:
                facts.backward_steps.add(e.step)
            if e.error and (e.type == HOOK or (e.type == EXIT and not is_internal_error(e.error))):
                facts.errors.append(e)
        facts.calls = calls(trace)
        facts.types = {m.path: m.type for m in trace.modules}
        return facts

    @property
    def backward_ran(self) -> Optional[bool]:
        """True when the trace proves a backward pass ran, None when it cannot tell."""
        if self.trace.meta.backward == "ran" or self.backward_steps:
            return True
        return None


def never_fired(
    trace: Trace,
    exclude: frozenset[int] | set[int] = frozenset(),
    in_graph: Optional[Collection[int]] = None,
    replaced: Collection[int] = frozenset(),
    replaced_params: Collection[int] = frozenset(),
    unseen_backward: Optional[str] = None,
) -> list[Surprise]:
    """`exclude`: hooks the capture saw taken out of their dict again (no surprise that they did not
    fire). `in_graph`: hooks of a module that ran compiled (torch.compile), which ran inside the graph,
    not one by one; by default those the trace's own `compiled` surprises name (a loaded trace).
    `replaced`: node hooks whose AccumulateGrad node their parameter's move replaced (the capture saw
    it: the trace alone does not show it). `replaced_params`: hooks on a parameter of the model, or on its
    AccumulateGrad node, that a move replaced by a new tensor (to or from `meta`: the capture saw the
    model hold another tensor by that name). `unseen_backward`: which backward pass ran inside the
    capture untraced, when the driver saw one (`exec --step-on forward`: the backward of the forward
    before the window), named in the reason of backward hooks that did not fire."""
    if in_graph is None:
        in_graph = {hid for s in trace.surprises if s.rule == "compiled" for hid in s.hooks}
    # the hooks that fired first (one pass): the rest of the facts only when some hook did not
    fired = set(compress(map(HOOK_ID, trace.events), map(partial(eq, HOOK), map(TYPE, trace.events))))
    if fired.issuperset(map(_HOOK_ID_OF, trace.hooks)):  # every hook fired: one C-level pass
        return []
    silent = [h for h in trace.hooks if h.id not in fired and h.id not in in_graph and h.id not in exclude]
    if not silent:
        return []
    facts = _Facts.of(trace)
    facts.replaced = set(replaced)
    facts.replaced_params = set(replaced_params)
    facts.unseen_backward = unseen_backward
    groups: dict[tuple[str, str], list[Hook]] = defaultdict(list)
    for hook in silent:
        found = _reason(facts, hook)
        if found is None:
            continue
        reason, level = found
        if level == "warn" and is_library_hook(hook):
            level = "info"
        groups[(reason, level)].append(hook)
    out = []
    for (reason, level), hooks in groups.items():
        listed = _names([f"{_label(h)} ({h.kind} on {place(h)})" for h in hooks])
        reason = reason.replace("{its}", "its" if len(hooks) == 1 else "their")
        out.append(
            Surprise(
                "never-fired", f"{listed} never fired: {reason}.", [h.id for h in hooks], [], level=level
            )
        )
    return out


def _reason(facts: _Facts, hook: Hook) -> Optional[tuple[str, str]]:
    """(reason, level) for a hook that never fired, or None when that is no surprise."""
    kind = hook.kind
    if hook.removed_during_run:
        return "it was removed while the model ran", "warn"
    if hook.scope == SAVED_TENSORS and (hook.defined_at or "").startswith("torch/"):
        return None  # PyTorch's own pack/unpack (checkpoint's `_recomputation_hook` never unpacks by design)
    if kind == K.comm and hook.name.endswith("(built-in)"):
        return "a built-in (C++) comm hook runs inside DDP's reducer, where hooktrace cannot see it", "info"
    if kind in STATE_DICT_KINDS:
        call = TABLE[kind].call
        family = [k for k in STATE_DICT_KINDS if TABLE[k].call == call]
        if not facts.kinds_fired.intersection(family):
            return f"no {call} call was made while tracing", NOT_ASKED
        return f"{call} ran while tracing, but no call reached {where(hook.module)}", NOT_ASKED
    if kind in REGISTRATION_KINDS:
        return f"no {TABLE[kind].call} was registered after it, while tracing", NOT_ASKED
    if kind in OPTIMIZER_KINDS:
        if TABLE[kind].call is not None:  # its state_dict() or load_state_dict()
            return f"the optimizer's {TABLE[kind].call} was not called while tracing", NOT_ASKED
        if hook.scope == GLOBAL:
            return f"no optimizer's step() ran {_since(facts.trace)}", "warn"
        return f"its optimizer's step() did not run {_since(facts.trace)}", "warn"
    if hook.scope == MODULE and hook.module is not None and hook.module not in facts.entered:
        return _never_called(facts, hook)
    if hook.scope == MODULE and hook.module is None:
        return "its module is not part of the traced model", "warn"
    if kind in (K.fsdp_all_gather, K.fsdp_reduce_scatter):
        return _fsdp_collective_reason(facts, kind)
    info = TABLE.get(kind)
    if info is not None and info.phase == BACKWARD:
        return _backward_reason(facts, hook)
    if kind in FORWARD_KINDS or kind == K.forward_wrapper:
        return _forward_reason(facts, hook)
    return "the trace does not show why", "warn"


def _fsdp_collective_reason(facts: _Facts, kind: str) -> tuple[str, str]:
    what = "all-gather" if kind == K.fsdp_all_gather else "reduce-scatter"
    if facts.trace.meta.world_size == 1:
        return (
            f"on a one-rank process group FSDP2 runs no {what} (it copies), so it calls no custom one",
            "info",
        )
    return (
        f"the trace does not show why (FSDP2 calls a custom {what} only when the process group has more "
        f"than one rank; on one rank it copies instead)",
        "warn",
    )


def _never_called(facts: _Facts, hook: Hook) -> tuple[str, str]:
    if facts.types.get(hook.module, "") in CONTAINERS:
        return "{its} module is a container (ModuleList, ModuleDict), which PyTorch never calls", "warn"
    return "{its} module was never called while tracing", "warn"


def _forward_reason(facts: _Facts, hook: Hook) -> tuple[str, str]:
    if hook.scope == GLOBAL:
        if not facts.entered:
            return "no module was called while tracing", "warn"
        return "the trace does not show why (modules were called)", "warn"
    mine = [c for c in facts.calls if c.module == hook.module]
    if hook.kind == K.forward and mine and all(c.raised for c in mine) and not hook.always_call:
        return (
            f"every call of {where(hook.module)} raised before its forward hooks ran "
            f"(always_call=True would have run it)",
            "warn",
        )
    if hook.registered_during_run:
        return (
            f"it was registered while the model ran, and no later call of {where(hook.module)} reached it",
            "warn",
        )
    return (
        f"the trace does not show why ({where(hook.module)} was called {plural(len(mine), 'time')})",
        "warn",
    )


def _backward_reason(facts: _Facts, hook: Hook) -> Optional[tuple[str, str]]:
    backward = facts.trace.meta.backward
    if backward == "off":
        return None  # --no-backward: what the user asked for
    if hook.id in facts.replaced:  # the capture saw it: whether or not a backward pass ran
        return (
            "{its} parameter was moved to another dtype or device (`.to()`, `.double()`, `--device`) after "
            "the hook was registered, which replaced the parameter's AccumulateGrad node: backward runs the "
            "new node, not the one the hook is on (register it after the move)",
            "warn",
        )
    if hook.id in facts.replaced_params:
        moved = (
            "{its} parameter was moved after the hook was registered (`--device meta`, or another move that "
            "makes new parameter tensors), which replaced the parameter by a new tensor"
        )
        if hook.scope == NODE:
            return (
                f"{moved} and so replaced its AccumulateGrad node: backward runs the new parameter's node, "
                "not the one the hook is on (register it after the move, or build the model on that device)",
                "warn",
            )
        return (
            f"{moved}, with an AccumulateGrad node of its own: the hook stays on the old tensor, which "
            "backward no longer reaches (register it after the move, or build the model on that device)",
            "warn",
        )
    if backward == "no-grad":
        return "backward was skipped: nothing in the output required grad", "warn"
    if facts.unseen_backward is not None:  # a backward ran in the capture, untraced
        return (
            f"{facts.unseen_backward}, so {{its}} calls there, if any, were not seen, and no traced "
            "backward called it",
            "info",
        )
    if facts.backward_ran is None:
        last_error = facts.errors[-1] if facts.errors else None
        if last_error is not None:
            return (
                f"{where(last_error.module)} raised {last_error.error} and no backward hook fired after it",
                "warn",
            )
        return "no backward hook fired at all, so the trace does not show whether a backward pass ran", "warn"
    if hook.scope == MODULE and hook.kind in (K.backward_pre, K.backward):
        return _full_backward_reason(facts, hook), "warn"
    if hook.scope == TENSOR:
        return f"no gradient for {hook.tensor or 'its tensor'} was computed {_since(facts.trace)}", "warn"
    if hook.scope == NODE:
        return f"backward did not run its autograd node {_since(facts.trace)}", "warn"
    return "backward ran, but the trace does not show why it did not call it", "warn"


def _full_backward_reason(facts: _Facts, hook: Hook) -> str:
    """Backward ran. When gradient reached the inside of the module but not the output it returned,
    the loss used a tensor from inside the call: say so. Else the trace does not show why."""
    module = hook.module
    assert module is not None
    steps = {c.step for c in facts.calls if c.module == module and c.phase == FORWARD}
    evidence = _gradient_inside(facts, module, steps)
    if not evidence:
        return (
            f"backward ran, but no gradient was computed for the output {where(module)} returned "
            f"(the trace does not show why: it may not require grad, or not lead to the loss)"
        )
    reason = (
        f"backward ran and gradient reached {_names(evidence)} inside {where(module)}, but not the output "
        f"{where(module)} returned, which carries its full backward hooks: the loss was computed from a "
        f"tensor taken inside its call"
    )
    keepers = _forward_hooks_that_fired(facts, module)
    if keepers:
        reason += (
            f", such as the output its forward hook {_names(keepers)} received — PyTorch wraps the output for "
            f"backward hooks only after the forward hooks ran"
        )
    return reason


def _gradient_inside(facts: _Facts, module: str, steps: set) -> list[str]:
    """Hooks that prove gradient flowed inside `module` in a step where it was called: backward hooks
    of submodules called only inside it, and gradient hooks of its parameters."""
    trace = facts.trace
    found: list[str] = []
    outer = [c for c in facts.calls if c.module == module and c.phase == FORWARD]
    for e in trace.events:
        if e.type != HOOK or e.phase != BACKWARD or e.step not in steps:
            continue
        try:
            other = trace.hook(e.hook) if e.hook is not None else None
        except KeyError:
            other = None
        if other is None:
            continue
        if other.scope == MODULE and _inside(e.module, module):
            inner = [
                c for c in facts.calls if c.module == e.module and c.phase == FORWARD and c.step == e.step
            ]
            if inner and all(
                any(o.enter < c.enter and (o.end or 1 << 62) > c.enter for o in outer) for c in inner
            ):
                found.append(f"{where(e.module)} ({_label(other)})")
        elif (
            other.scope == TENSOR
            and other.tensor
            and not other.tensor.startswith((OUTPUT_OF + " ", INPUT_OF + " "))
        ):
            if other.module == module or _inside(other.module, module):
                found.append(f"{other.tensor} ({_label(other)})")
    return found


def _forward_hooks_that_fired(facts: _Facts, module: str) -> list[str]:
    trace = facts.trace
    out = []
    for e in trace.events:
        if e.type == HOOK and e.kind == K.forward and e.module == module and e.phase == FORWARD:
            try:
                hook = trace.hook(e.hook) if e.hook is not None else None
            except KeyError:
                hook = None
            if hook is not None and hook.scope == MODULE:
                out.append(_label(hook))
    return out
