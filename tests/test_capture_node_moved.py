"""A node hook on a parameter's AccumulateGrad node, then the model moved (`.double()`, `.to("cuda")`,
`run --device cuda` on a factory that registered on CPU): PyTorch drops the node (`Variable.set_data`
resets the parameter's grad accumulator when its dtype or device changes), so the hook never fires.
`never-fired` says that the parameter's move replaced its AccumulateGrad node; the nearest cases
(no move, a move to the same dtype, a hook registered after the move) say nothing of it.

Every hook logs its own label as it runs; hooktrace's order must equal that log, traced as untraced.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn

import hooktrace

MOVES: dict[str, Callable[[nn.Module], Any]] = {
    "double": lambda m: m.double(),
    "to float64": lambda m: m.to(torch.float64),
    "half": lambda m: m.half(),
}


def _accumulator(p: torch.Tensor) -> Any:
    return p.view_as(p).grad_fn.next_functions[0][0]


def _run(traced: bool, move: Callable[[nn.Module], Any], after: bool = False) -> tuple[list[str], Any]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    log: list[str] = []
    keep: list[Any] = []

    def on_acc(grad_inputs: Any, grad_outputs: Any) -> None:
        log.append("acc")

    def body() -> None:
        m[2].register_full_backward_hook(lambda *a: log.append("bwd2"))
        if not after:
            keep.append(_accumulator(m[0].weight))
            keep[0].register_hook(on_acc)
        move(m)
        if after:  # the nearest case: registered on the node backward will run
            keep.append(_accumulator(m[0].weight))
            keep[0].register_hook(on_acc)
        dtype = m[0].weight.dtype
        m(torch.ones(2, 3, dtype=dtype)).sum().backward()

    if traced:
        with hooktrace.trace(m) as t:
            body()
        return log, t.trace
    body()
    return log, None


@pytest.mark.parametrize("move", list(MOVES))
def test_a_move_that_replaced_the_accumulate_grad_node_is_said(move):
    untraced, _ = _run(False, MOVES[move])
    log, trace = _run(True, MOVES[move])
    assert log == untraced == ["bwd2"]  # PyTorch itself never runs the hook on the old node
    by_id = {h.id: h.name for h in trace.hooks}
    assert [by_id[e.hook] for e in trace.hook_events()] == ["_run.<locals>.body.<locals>.<lambda>"]
    [never] = [s for s in trace.surprises if s.rule == "never-fired"]
    [node] = [h for h in trace.hooks if h.kind == "node"]
    assert never.hooks == [node.id] and never.level == "warn"
    assert "moved to another dtype or device" in never.message
    assert "replaced the parameter's AccumulateGrad node" in never.message


@pytest.mark.parametrize("case", ["no move", "same dtype", "registered after the move"])
def test_no_move_claim_where_the_node_was_not_replaced(case):
    move = (
        (lambda m: m)
        if case == "no move"
        else (lambda m: m.float())
        if case == "same dtype"
        else MOVES["double"]
    )
    untraced, _ = _run(False, move, after=case == "registered after the move")
    log, trace = _run(True, move, after=case == "registered after the move")
    assert log == untraced == ["acc", "bwd2"] or log == untraced == ["bwd2", "acc"]
    by_id = {h.id: h for h in trace.hooks}
    traced = ["acc" if by_id[e.hook].kind == "node" else "bwd2" for e in trace.hook_events()]
    assert traced == log  # the order the hooks recorded
    assert not [s for s in trace.surprises if s.rule == "never-fired"]


def test_a_dropped_node_is_not_said_to_be_replaced():
    """The node's hook dict died with the node: a move did not replace it, the user let it go."""
    m = nn.Linear(2, 1)
    log: list[str] = []
    with hooktrace.trace(m) as t:
        _accumulator(m.weight).register_hook(lambda *a: log.append("acc"))  # the node dies right away
        m.double()
        m(torch.ones(1, 2, dtype=torch.float64)).sum().backward()
    assert log == []
    messages = [s.message for s in t.trace.surprises if s.rule == "never-fired"]
    assert messages and not any("AccumulateGrad" in msg for msg in messages)


def test_the_training_step_sample_says_it_when_its_model_moves():
    """samples/training_step.py registers on `body.weight`'s AccumulateGrad node in its factory; moved
    afterwards (here `.double()`, on a GPU `run --device cuda`), that hook never fires, and the trace says why."""
    from samples import training_step

    training_step.CALLS.clear()
    with hooktrace.trace() as t:
        target = training_step.make()
        model = target.model.double()
        model(target.inputs.double()).sum().backward()
    assert "accumulated:body.weight" not in training_step.CALLS  # PyTorch's own record
    [node] = [h for h in t.trace.hooks if h.kind == "node"]
    [never] = [s for s in t.trace.surprises if s.rule == "never-fired" and node.id in s.hooks]
    assert "replaced the parameter's AccumulateGrad node" in never.message
    assert "never fired" in never.message and "`.double()`" in never.message
    training_step._KEEP.clear()
