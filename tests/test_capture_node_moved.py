"""A node hook on a parameter's AccumulateGrad node, then the model moved (`.double()`, `.to("cuda")`,
`run --device cuda` on a factory that registered on CPU): PyTorch drops the node (`Variable.set_data`
resets the parameter's grad accumulator when its dtype or device changes), so the hook never fires.
`never-fired` says that the parameter's move replaced its AccumulateGrad node; the nearest cases
(no move, a move to the same dtype, a hook registered after the move) say nothing of it.

A move that makes new parameter tensors (`--device meta`, `model.to("meta")`) leaves a node hook and
a tensor hook (post-accumulate-grad) on the old parameter: `never-fired` says the move replaced the
parameter and its node; a hooked parameter outside the model, `--device cpu` and a parameter assigned
anew on the same device say nothing of a move.

Every hook logs its own label as it runs; hooktrace's order must equal that log, traced as untraced.
"""

from __future__ import annotations

import json
from pathlib import Path
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


# -- a move that makes new parameter tensors (`--device meta`): the hooks stay on the old ones --------
def _factory(log: list[str], extra: list[Any]) -> Callable[[], Any]:
    """A factory that registers, on CPU, a node hook on `0.weight`'s AccumulateGrad node and a
    post-accumulate-grad hook on `2.weight`, and a post-accumulate-grad hook on a parameter that is
    not the model's (in `extra`); a full backward hook on `2` fires wherever the model runs."""

    def make() -> Any:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
        node = _accumulator(m[0].weight)
        extra.append(node)  # AccumulateGrad nodes live only while someone holds them
        node.register_hook(lambda *a: log.append("acc_node"))
        m[2].weight.register_post_accumulate_grad_hook(lambda p: log.append("post_acc"))
        aside = nn.Parameter(torch.ones(2))  # never part of the model, never used
        aside.register_post_accumulate_grad_hook(lambda p: log.append("aside"))
        extra.append(aside)
        m[2].register_full_backward_hook(lambda *a: log.append("bwd2"))
        return m, torch.ones(2, 3)

    return make


def _factory_run(device: str) -> tuple[list[str], list[str], Any]:
    """(the hooks' own record untraced, traced, the trace) of `hooktrace run --device <device>`."""
    from hooktrace.options import RunOptions
    from hooktrace.runs.factory import run
    from hooktrace.target import Factory

    plain: list[str] = []
    keep: list[Any] = []
    m, x = _factory(plain, keep)()
    m.to(device)(x.to(device)).sum().backward()
    log: list[str] = []
    result = run(Factory("inline:make", _factory(log, keep), "make()"), RunOptions(device=device))
    assert result.exception is None, result.error
    return plain, log, result.trace


def _labels(trace: Any) -> list[str]:
    labels = {"node": "acc_node", "post_accumulate_grad": "post_acc", "backward": "bwd2"}
    hooks = {h.id: h for h in trace.hooks}
    return [labels[hooks[e.hook].kind] for e in trace.hook_events()]


def test_run_device_meta_says_the_move_replaced_the_parameter_and_its_node():
    plain, log, trace = _factory_run("meta")
    assert log == plain == ["bwd2"]  # PyTorch runs neither hook on the old parameters
    assert _labels(trace) == log
    by_kind = {h.kind: h for h in trace.hooks if h.kind in ("node", "post_accumulate_grad") and h.module}
    assert (by_kind["node"].tensor, by_kind["post_accumulate_grad"].tensor) == ("0.weight", "2.weight")
    said = {hid: s for s in trace.surprises if s.rule == "never-fired" for hid in s.hooks}
    node, post = said[by_kind["node"].id], said[by_kind["post_accumulate_grad"].id]
    assert (
        "which replaced the parameter by a new tensor and so replaced its AccumulateGrad node" in node.message
    )
    assert "the hook stays on the old tensor" in post.message and node.level == post.level == "warn"
    # the nearest case: a parameter that is not the model's was never moved, and is not said to be
    [aside] = [h for h in trace.hooks if h.kind == "post_accumulate_grad" and not h.module]
    assert "moved" not in said[aside.id].message


def test_run_device_cpu_moves_nothing_and_says_nothing_of_it():
    plain, log, trace = _factory_run("cpu")
    assert sorted(log) == sorted(plain) == ["acc_node", "bwd2", "post_acc"] and log == plain
    assert _labels(trace) == log
    assert not any("moved" in s.message for s in trace.surprises)


@pytest.mark.parametrize("case", ["to meta", "reassigned on the same device"])
def test_inside_a_trace_only_a_move_is_said(case):
    """`model.to("meta")` inside `trace(model)` replaces the parameter (said); assigning a new parameter
    on the same device replaces it too, but no move did (not said)."""
    log: list[str] = []
    m = nn.Linear(2, 1)
    with hooktrace.trace(m) as t:
        m.weight.register_post_accumulate_grad_hook(lambda p: log.append("post_acc"))
        if case == "to meta":
            m.to("meta")
        else:
            m.weight = nn.Parameter(torch.zeros(1, 2))
        m(torch.ones(3, 2, device=m.weight.device)).sum().backward()
    assert log == []
    [never] = [s for s in t.trace.surprises if s.rule == "never-fired"]
    assert ("replaced the parameter by a new tensor" in never.message) == (case == "to meta")


def test_the_training_step_sample_on_meta_says_the_move_replaced_its_parameters():
    from typer.testing import CliRunner

    from hooktrace.cli import app

    from .global_hooks import global_module_hooks_kept

    sample = str(Path(__file__).parent.parent / "samples" / "training_step.py")
    with global_module_hooks_kept():
        result = CliRunner().invoke(app, ["run", sample, "--device", "meta", "-f", "json"])
    assert result.exit_code == 0, result.output
    messages = [s["message"] for s in json.loads(result.stdout)["surprises"] if s["rule"] == "never-fired"]
    assert any("(node on body.weight)" in m and "replaced its AccumulateGrad node" in m for m in messages)
    assert any(
        "(post_accumulate_grad on head.weight)" in m and "stays on the old tensor" in m for m in messages
    )
