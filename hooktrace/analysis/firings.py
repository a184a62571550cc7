"""What the events say about hook lists: firings of one hook list, and whose hooks they are.

Pure functions of a Trace, shared by the surprise rules.
"""

from __future__ import annotations

from typing import Iterable, Optional

from ..kinds import GLOBAL, HOOK, NODE, OPTIMIZER, OPTIMIZER_KINDS, SAVED_TENSORS, TENSOR, names_parameter
from ..schema import ROOT, Event, Hook, Trace
from .counts import plural  # noqa: F401  (re-exported for the surprise rules)

MAX_SEQS = 50  # events named per surprise (enough to find them; the count is in the message)


def firings(trace: Trace) -> list[list[Event]]:
    """One list per firing of a hook list: consecutive hook events of one (step, phase, module, kind).

    A firing ends at any module enter/exit (the next call of the same module is another firing) and
    where a hook fires again (a module called twice in a row, or backward hooks of two calls)."""
    out: list[list[Event]] = []
    last = None
    seen: set[Optional[int]] = set()
    for e in trace.events:
        if e.type != HOOK:
            last = None
            continue
        key = (e.step, e.phase, e.module, e.kind, e.thread)
        if key == last and e.hook not in seen:
            out[-1].append(e)
            seen.add(e.hook)
        else:
            out.append([e])
            last = key
            seen = {e.hook}
    return out


_PASS_THROUGH = ("functools.py:", "contextlib.py:", "typing_extensions.py:", "warnings.py:")


def is_library_hook(hook: Hook) -> bool:
    """A hook that a library's code registered: its registration went through code inside torch
    (`registered_at` there), reached from the user's line or from no user line (`registered_by`).
    A pass-through wrapper file (functools, contextlib) as `registered_at` is not a library."""
    at = hook.registered_at
    if at is None or at == hook.registered_by:
        return False
    return not at.rsplit("/", 1)[-1].startswith(_PASS_THROUGH)


def level_of(trace: Trace, hook_ids: Iterable[Optional[int]]) -> str:
    """ "info" when every hook named is a library's own hook, else "warn"."""
    hooks = [_find(trace, h) for h in hook_ids if h is not None]
    known = [h for h in hooks if h is not None]
    if known and len(known) == len(hooks) and all(is_library_hook(h) for h in known):
        return "info"
    return "warn"


def _find(trace: Trace, hook_id: int) -> Optional[Hook]:
    try:
        return trace.hook(hook_id)
    except KeyError:
        return None


def hook_of(trace: Trace, hook_id: Optional[int]) -> Optional[Hook]:
    """The trace's hook with this id, or None (no id, or a hook the trace does not list)."""
    try:
        return trace.hook(hook_id) if hook_id is not None else None
    except KeyError:
        return None


def label(hook: Hook) -> str:
    return f"`{hook.name}`"


def names(items: Iterable[str], most: int = 6) -> str:
    """`a`, `b` and `c`; past `most`, "... and N more"."""
    unique = list(dict.fromkeys(items))
    if len(unique) > most:
        return ", ".join(unique[:most]) + f" and {len(unique) - most} more"
    if len(unique) > 1:
        return ", ".join(unique[:-1]) + f" and {unique[-1]}"
    return unique[0] if unique else ""


def where(path: Optional[str]) -> str:
    """A module path in a surprise's words: `fc`, `<root>`, or "a module outside the model" for none."""
    return f"`{path or ROOT}`" if path is not None else "a module outside the model"


def on_parameter(hook: Hook) -> bool:
    """A tensor hook on a parameter ("fc.weight"), not on an output, an input or another tensor."""
    return hook.scope == TENSOR and names_parameter(hook.tensor)


def place(hook: Hook) -> str:
    """What a hook is on, in words: its tensor, its module, or — for hooks that belong to no module —
    what they fire for (never "a module outside the model" for a global, optimizer or saved-tensor hook)."""
    if hook.tensor:
        return hook.tensor
    if hook.scope == GLOBAL:
        return "every optimizer" if hook.kind in OPTIMIZER_KINDS else "every module (global)"
    if hook.scope == OPTIMIZER:
        return "an optimizer"
    if hook.scope == SAVED_TENSORS:
        return "saved tensors"
    if hook.scope == NODE:
        return "an autograd node"
    return where(hook.module)
