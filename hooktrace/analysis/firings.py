"""What the events say about calls: module calls (enter..exit) and firings of one hook list.

Pure functions of a Trace, shared by the surprise rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from ..schema import Event, Hook, Trace, is_internal_error


@dataclass(frozen=True)
class Call:
    """One module call: its `enter` and `exit` events (exit None when the trace ended inside it)."""

    module: Optional[str]
    step: int
    phase: str
    thread: int
    enter: int  # seq
    exit: Optional[int]  # seq
    error: Optional[str]  # the exit event's error

    def holds(self, e: Event) -> bool:
        """The event happened inside this call (on its thread)."""
        return e.thread == self.thread and self.enter < e.seq and (self.exit is None or e.seq < self.exit)

    @property
    def raised(self) -> bool:
        """The call ended with an exception of the model or a hook (not checkpoint's own stop)."""
        return bool(self.error) and not is_internal_error(self.error)

    @property
    def stopped(self) -> bool:
        """PyTorch stopped it itself (checkpoint's `_StopRecomputationError`)."""
        return is_internal_error(self.error)


def module_calls(trace: Trace) -> list[Call]:
    """Every module call, in the order the calls began; enter/exit are paired per thread."""
    open_calls: dict[int, list[Event]] = {}
    done: list[Call] = []
    for e in trace.events:
        if e.type == "enter":
            open_calls.setdefault(e.thread, []).append(e)
        elif e.type == "exit":
            stack = open_calls.get(e.thread)
            while stack:
                start = stack.pop()
                if start.module == e.module:
                    done.append(Call(e.module, start.step, start.phase, e.thread, start.seq, e.seq, e.error))
                    break
                done.append(Call(start.module, start.step, start.phase, start.thread, start.seq, None, None))
    for stack in open_calls.values():
        done.extend(Call(s.module, s.step, s.phase, s.thread, s.seq, None, None) for s in stack)
    done.sort(key=lambda c: c.enter)
    return done


def firings(trace: Trace) -> list[list[Event]]:
    """One list per firing of a hook list: consecutive hook events of one (step, phase, module, kind).

    A firing ends at any module enter/exit (the next call of the same module is another firing) and
    where a hook fires again (a module called twice in a row, or backward hooks of two calls)."""
    out: list[list[Event]] = []
    last = None
    seen: set[Optional[int]] = set()
    for e in trace.events:
        if e.type != "hook":
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


def plural(n: int, one: str, many: Optional[str] = None) -> str:
    """`1 call`, `2 calls`; `many` for irregular words."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
