"""One pairing of module `enter`/`exit` events (analysis/calls.py), and every consumer agreeing on it.

The rule: per thread, an exit closes the innermost open call of its module; calls opened inside it
that are still open end with it, without an exit; an exit with no open call of its module closes
nothing; calls open at the end stay open. On an interrupted trace (a hook raising mid-forward) cut
at any event, or with an exit lost, the surprises, the tree, DOT, the Chrome trace and the HTML
report all say the same calls raised.
"""

from __future__ import annotations

import re
from typing import Optional

import pytest
import torch

import hooktrace
from hooktrace.analysis.calls import calls, unmatched_exits
from hooktrace.analysis.surprises import find_surprises
from hooktrace.render import render
from hooktrace.render.chrome import chrome_events
from hooktrace.render.html import trace_data
from hooktrace.schema import Event, Trace, is_internal_error

T1, T2 = 11, 22


def ev(seq: int, type_: str, module: Optional[str], thread: int = T1, error: Optional[str] = None) -> Event:
    return Event(seq, 0, type_, "forward", module, None, None, thread, seq * 10, 0, False, error)


def paired(*events: Event) -> list[tuple]:
    return [(c.module, c.enter, c.exit, c.end) for c in calls(Trace(events=list(events)))]


def test_nested_calls_pair_innermost_first() -> None:
    got = paired(ev(0, "enter", "a"), ev(1, "enter", "a"), ev(2, "exit", "a"), ev(3, "exit", "a"))
    assert got == [("a", 0, 3, 3), ("a", 1, 2, 2)]


def test_an_exit_ends_the_calls_opened_inside_its_call_that_lost_their_exit() -> None:
    got = paired(ev(0, "enter", "a"), ev(1, "enter", "a.b"), ev(2, "enter", "a.b.c"), ev(3, "exit", "a"))
    assert got == [("a", 0, 3, 3), ("a.b", 1, None, 3), ("a.b.c", 2, None, 3)]
    inside = calls(Trace(events=[ev(0, "enter", "a"), ev(1, "enter", "b"), ev(2, "exit", "a")]))[1]
    assert inside.holds(ev(1, "hook", "b")) is False and inside.holds(ev(5, "hook", "b")) is False


def test_an_exit_without_its_enter_closes_nothing() -> None:
    events = [ev(0, "enter", "a"), ev(1, "exit", "b", error="E: x"), ev(2, "exit", "a")]
    got = calls(Trace(events=events))
    assert [(c.module, c.enter, c.exit) for c in got] == [("a", 0, 2)]
    assert unmatched_exits(events, got) == [events[1]]


def test_calls_open_at_the_end_stay_open_and_threads_pair_apart() -> None:
    events = [
        ev(0, "enter", "a", T1),
        ev(1, "enter", "a", T2),
        ev(2, "exit", "a", T1),
        ev(3, "hook", "a", T2),
    ]
    got = calls(Trace(events=events))
    assert [(c.thread, c.exit, c.end) for c in got] == [(T1, 2, 2), (T2, None, None)]
    assert got[1].holds(events[3]) and not got[0].holds(events[3])


def test_events_out_of_seq_order_pair_in_seq_order() -> None:
    events = [ev(2, "exit", "a"), ev(0, "enter", "a"), ev(1, "enter", "a")]
    assert [(c.enter, c.exit, c.end) for c in calls(Trace(events=events))] == [(0, None, None), (1, 2, 2)]


# -- every consumer agrees on a real interrupted trace --------------------------------------------------
def _interrupted() -> Trace:
    """root -> (0: Linear, 1: Sequential -> 1.0: Linear): a forward hook on `1.0` raises mid-forward;
    the forward hooks of `1` and the root never fire because of it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))

    def boom(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        raise RuntimeError("boom")

    def never(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        return None

    model[1][0].register_forward_hook(boom)
    model[1].register_forward_hook(never)
    model.register_forward_hook(never)
    model[0].register_forward_pre_hook(lambda module, args: None)
    with pytest.raises(RuntimeError, match="boom"):
        with hooktrace.trace(model) as t:
            model(torch.randn(1, 2))
    return t.trace


def _windows(trace: Trace) -> list[tuple[str, list[Event]]]:
    """The trace cut before and after every event, and with each enter or exit event lost."""
    events = trace.events
    out = [(f"first {k}", events[:k]) for k in range(len(events) + 1)]
    out += [(f"from #{k}", events[k:]) for k in range(1, len(events))]
    out += [(f"without #{e.seq}", [x for x in events if x is not e]) for e in events if e.type != "hook"]
    return out


_TREE_CALL = re.compile(r"^[│├└─ ]*(<root>|[\w.]+) \w+  call #")


def _raised_by_each(trace: Trace) -> dict[str, list[Optional[str]]]:
    """The modules whose call (or lone exit) ended in an error, as each consumer shows it."""
    tree = render(trace, "tree", color=False, width=200, expand=True)
    assert isinstance(tree, str)
    in_tree = []
    for line in tree.splitlines():
        m = _TREE_CALL.match(line)
        if m and "  raised " in line:
            in_tree.append("" if m.group(1) == "<root>" else m.group(1))
    chrome = chrome_events(trace)
    in_chrome = [x["args"]["module"] for x in chrome if x["args"].get("kind") in ("module_call", "module_exit")
                 and x["args"].get("error") and not is_internal_error(x["args"]["error"])]  # fmt: skip
    dot = render(trace, "dot", expand=True)
    assert isinstance(dot, str)
    return {
        "tree": sorted(in_tree),
        "chrome": sorted(in_chrome),
        "dot": [None] * dot.count('label="raised: '),  # one node per call that raised
    }


def test_every_consumer_agrees_on_which_calls_closed_on_a_cut_interrupted_trace() -> None:
    whole = _interrupted()
    assert [e.type for e in whole.events].count("exit") == 4  # 1.0, 1 and the root raised, 0 returned
    checked = 0
    for name, events in _windows(whole):
        trace = Trace(whole.meta, whole.modules, whole.hooks, events)
        paired = calls(trace)
        lone = unmatched_exits(trace.events, paired)
        expected = sorted([c.module for c in paired if c.raised] + [e.module for e in lone if e.error])
        seen = _raised_by_each(trace)
        assert seen["chrome"] == expected, name
        if any(e.type == "hook" for e in events):  # else the tree and DOT say that no hook fired
            assert seen["tree"] == expected, name
            assert len(seen["dot"]) == len(expected), name
        chrome_calls = {x["args"]["seq"]: x["args"]["exit_seq"] for x in chrome_events(trace)
                        if x["args"].get("kind") == "module_call"}  # fmt: skip
        assert chrome_calls == {c.enter: c.exit for c in paired}, name
        # the HTML report: its timeline's calls are the same pairs, its tree the same raised calls
        page = trace_data(trace)
        ends = [-1 if c.end is None else c.end for c in paired]
        assert (page["calls"]["enter"], page["calls"]["end"]) == ([c.enter for c in paired], ends), name
        if any(e.type == "hook" for e in events):
            assert len(page["rows"]["errors"]) == len(seen["tree"]), name
        # the surprise about the forward hooks that never fired says "raised" exactly when every call
        # of their module that the trace has closed with the error
        surprises = [s.message for s in find_surprises(trace) if s.rule == "never-fired"]
        for module, shown in (("1", "`1`"), ("", "`<root>`")):
            of_module = [c for c in paired if c.module == module]
            says_raised = any(f"every call of {shown} raised" in m for m in surprises)
            assert says_raised == (bool(of_module) and all(c.raised for c in of_module)), (name, surprises)
        # the hook that raised: "no always_call forward hook ran after it" only when the trace holds
        # the end of the call it raised in (the same pairing); with its enter lost, nothing is claimed
        for e in events:
            if e.type == "hook" and e.error:
                holding = [c for c in paired if c.module == e.module and c.holds(e)]
                ended = bool(holding) and holding[-1].end is not None
                [error] = [s.message for s in find_surprises(trace) if s.rule == "hook-error"]
                assert ("No always_call forward hook ran after it" in error) == ended, (name, error)
        checked += bool(expected)
    assert checked >= 10  # most windows hold a raising call
