"""Module calls: which `enter` and `exit` events belong together, one rule for every consumer.

The rule, per thread: an `exit` closes the innermost open call of its module on that thread. Calls
opened inside that one and still open end with it, without an exit of their own (the trace lost
it). An `exit` that finds no open call of its module (a trace that starts inside the call) closes
nothing and is not a call: consumers show its error on its own. Calls still open when the events
end stay open. The surprise rules, the call tree (text, DOT, notebook) and the Chrome trace all
pair through `calls`, so they agree on which calls closed, whatever the trace lost.
"""

from __future__ import annotations

import operator
from typing import Iterable, NamedTuple, Optional

from ..kinds import ENTER, EXIT
from ..schema import Event, Trace, is_internal_error


class Call(NamedTuple):
    """One module call: the seqs of its `enter` and `exit` events; `exit` None when the trace has
    none (cut off, or lost inside an outer call, then `end` is that call's exit); `end` None when
    the call is still open where the events end."""

    module: Optional[str]
    step: int
    phase: str
    thread: int
    enter: int  # seq
    exit: Optional[int]  # seq of its own exit
    error: Optional[str]  # its exit's error
    end: Optional[int]  # seq of the exit that closed it: its own, or an outer call's

    def holds(self, e: Event) -> bool:
        """The event happened inside this call (on its thread)."""
        return e.thread == self.thread and self.enter < e.seq and (self.end is None or e.seq < self.end)

    @property
    def raised(self) -> bool:
        """The call ended with an exception of the model or a hook (not checkpoint's own stop)."""
        return bool(self.error) and not is_internal_error(self.error)

    @property
    def stopped(self) -> bool:
        """PyTorch stopped it itself (checkpoint's `_StopRecomputationError`)."""
        return is_internal_error(self.error)


# an event's fields read by C-level passes (`kind in map(KIND, events)`): a rule that cannot find
# anything returns without a Python-level pass over every event (issue 34: a one-step trace's build)
SEQ, STEP, TYPE, PHASE, KIND, RETURNED, ERROR = map(
    operator.attrgetter, ("seq", "step", "type", "phase", "kind", "returned", "error")
)
HOOK_ID = operator.attrgetter("hook")  # not a kind: the event's field


def in_order(events: list[Event]) -> list[Event]:
    """The events in `seq` order (the list itself when it already is; stable for repeated seqs)."""
    seqs = [*map(SEQ, events)]
    if all(map(operator.lt, seqs, seqs[1:])):
        return events
    return sorted(events, key=operator.attrgetter("seq"))


def calls(trace: Trace) -> list[Call]:
    """Every module call of the trace that has an `enter` event, in the order the calls began."""
    return pair(in_order(trace.events))


def pair(events: Iterable[Event]) -> list[Call]:
    """`calls` of events already in `seq` order."""
    stacks: dict[int, list[Event]] = {}  # thread -> enter events of its open calls
    done: dict[int, Call] = {}  # enter seq -> the call
    for e in events:
        if e.type == ENTER:
            stacks.setdefault(e.thread, []).append(e)
        elif e.type == EXIT:
            stack = stacks.get(e.thread)
            if not stack:
                continue
            for i in range(len(stack) - 1, -1, -1):
                if stack[i].module == e.module:
                    break
            else:
                continue  # no open call of its module: an exit without its enter
            start = stack[i]
            done[start.seq] = Call(
                e.module, start.step, start.phase, e.thread, start.seq, e.seq, e.error, e.seq
            )
            for lost in stack[i + 1 :]:
                done[lost.seq] = Call(
                    lost.module, lost.step, lost.phase, lost.thread, lost.seq, None, None, e.seq
                )
            del stack[i:]
    for stack in stacks.values():
        for s in stack:
            done[s.seq] = Call(s.module, s.step, s.phase, s.thread, s.seq, None, None, None)
    return [done[seq] for seq in sorted(done)]


def unmatched_exits(events: Iterable[Event], paired: list[Call]) -> list[Event]:
    """The `exit` events that closed no call (their enter is not in the trace)."""
    closed = {c.exit for c in paired}
    return [e for e in events if e.type == EXIT and e.seq not in closed]
