"""LR schedulers wrap `opt.step` on the instance: every step hook is still traced, nothing is left.

`torch.optim.lr_scheduler` replaces `opt.step` by its own wrapper around the class's `step`
wrapper (the one that calls the step hooks). Made before or inside the block, any scheduler, any
optimizer: the hooks' own record equals the trace's, traced and untraced runs give the same learning
rates and parameters, and after the block the optimizer, its `step` and the scheduler are what
an untraced run leaves.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest
import torch
import torch.optim.optimizer as optim_module
from torch import nn
from torch.optim import lr_scheduler as sched_module

import hooktrace

from .training_hooks import Log, class_state, model, pytorch_step_code

HOOKTRACE_DIR = os.path.dirname(os.path.abspath(hooktrace.__file__)) + os.sep

SCHEDULERS: dict[str, Callable[[Any], Any]] = {
    "StepLR": lambda opt: sched_module.StepLR(opt, step_size=1, gamma=0.5),
    "OneCycleLR": lambda opt: sched_module.OneCycleLR(opt, max_lr=0.5, total_steps=10),
    "LambdaLR": lambda opt: sched_module.LambdaLR(opt, lambda epoch: 0.9**epoch),
    "SequentialLR": lambda opt: sched_module.SequentialLR(
        opt,
        [sched_module.ConstantLR(opt, factor=0.5, total_iters=1), sched_module.ExponentialLR(opt, gamma=0.9)],
        milestones=[2],
    ),
    "ChainedScheduler": lambda opt: sched_module.ChainedScheduler(
        [sched_module.ConstantLR(opt, factor=0.5, total_iters=2), sched_module.ExponentialLR(opt, gamma=0.9)]
    ),
    "ReduceLROnPlateau": lambda opt: sched_module.ReduceLROnPlateau(opt, patience=0, factor=0.5),
}
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "Adam": lambda params: torch.optim.Adam(params, lr=0.1),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.1),
    "RMSprop": lambda params: torch.optim.RMSprop(params, lr=0.1),
}
STEPS = 3


def _step_scheduler(sched: Any, loss: torch.Tensor) -> None:
    if isinstance(sched, sched_module.ReduceLROnPlateau):
        sched.step(float(loss.detach()))
    else:
        sched.step()


def _plain(value: Any) -> Any:
    """What a scheduler's or optimizer's attribute is, comparable across two runs."""
    if callable(value) and not isinstance(value, (torch.Tensor, nn.Module)):
        return getattr(value, "__qualname__", type(value).__qualname__)
    if isinstance(value, torch.optim.Optimizer):
        return type(value).__name__
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return (type(value).__name__, _plain(vars(value)))
    return value


def _sched_state(sched: Any) -> Any:
    return _plain({k: v for k, v in vars(sched).items() if k != "optimizer"})


def run(traced: bool, sched_name: str, opt_names: tuple[str, ...], made_inside: bool) -> dict[str, Any]:
    m = model()
    groups = [list(m[0].parameters()), list(m[2].parameters())][: len(opt_names)]
    if len(opt_names) == 1:
        groups = [list(m.parameters())]
    opts = [OPTIMIZERS[name](params) for name, params in zip(opt_names, groups)]
    L = Log()
    handles = [optim_module.register_optimizer_step_pre_hook(L.fn("gpre"))]
    handles.append(optim_module.register_optimizer_step_post_hook(L.fn("gpost")))
    for i, opt in enumerate(opts):
        handles.append(opt.register_step_pre_hook(L.fn(f"pre{i}")))
        handles.append(opt.register_step_post_hook(L.fn(f"post{i}")))
    scheds = [] if made_inside else [SCHEDULERS[sched_name](opt) for opt in opts]
    before = [dict(vars(opt)) for opt in opts]
    lrs: list[list[float]] = []
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    ctx = hooktrace.trace(m) if traced else None
    t = ctx.__enter__() if ctx is not None else None
    try:
        if made_inside:
            scheds = [SCHEDULERS[sched_name](opt) for opt in opts]
            before = [dict(vars(opt)) for opt in opts]
        for _ in range(STEPS):
            loss = m(x).pow(2).sum()
            loss.backward()
            for opt, sched in zip(opts, scheds):
                opt.step()
                opt.zero_grad()
                _step_scheduler(sched, loss)
                lrs.append([g["lr"] for g in opt.param_groups])
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    for h in handles:
        h.remove()
    return {
        "trace": t.trace if t is not None else None,
        "L": L,
        "lrs": lrs,
        "params": [p.detach().clone() for p in m.parameters()],
        "opts": opts,
        "before": before,
        "scheds": [_sched_state(s) for s in scheds],
        "sched_objs": scheds,
        "opt_state": [
            _plain({k: v for k, v in vars(o).items() if k not in ("state", "param_groups")}) for o in opts
        ],
    }


def _step_wrappers(opt: torch.optim.Optimizer) -> list[Any]:
    """The functions `opt.step` runs through: the scheduler's wrapper (if any) and PyTorch's."""
    step = vars(opt).get("step")
    out = []
    while step is not None:
        out.append(step)
        cells = [c.cell_contents for c in (getattr(step, "__closure__", None) or ())]
        step = next((c for c in cells if callable(c) and hasattr(c, "__code__")), None)
    return out


# torch 2.8's SequentialLR passes an epoch to its first scheduler's step(), and PyTorch warns about it
# untraced as traced (2.9 on no longer does)
@pytest.mark.filterwarnings("ignore:The epoch parameter in `scheduler.step\\(\\)`:UserWarning")
@pytest.mark.parametrize("made_inside", [False, True], ids=["made_before", "made_inside"])
@pytest.mark.parametrize("sched_name", list(SCHEDULERS))
def test_every_step_hook_traced_with_a_scheduler_and_nothing_left(sched_name, made_inside):
    opt_names = ("SGD", "Adam") if sched_name in ("StepLR", "OneCycleLR") else ("AdamW",)
    plain = run(False, sched_name, opt_names, made_inside)
    got = run(True, sched_name, opt_names, made_inside)
    trace, L = got["trace"], got["L"]
    assert L.log == plain["L"].log
    assert len(L.log) == STEPS * len(opt_names) * 4
    assert L.traced(trace) == L.log  # the trace's order is the hooks' own record
    assert got["lrs"] == plain["lrs"]
    for a, b in zip(got["params"], plain["params"]):
        assert torch.equal(a, b)
    assert got["scheds"] == plain["scheds"]
    assert got["opt_state"] == plain["opt_state"]
    assert [vars(o).keys() for o in got["opts"]] == [vars(o).keys() for o in plain["opts"]]
    for opt, before in zip(got["opts"], got["before"]):
        assert all(vars(opt)[k] is v for k, v in before.items())
        assert type(opt).step.__code__ is pytorch_step_code()
        if "step" in vars(opt):  # the scheduler's wrapper around PyTorch's own
            assert hasattr(vars(opt)["step"], "_wrapped_by_lr_sched")
            assert _step_wrappers(opt)[1].__code__ is pytorch_step_code()
        for fn in _step_wrappers(opt):  # none of them is hooktrace's code (by where it lives,
            # not by name: a checkout may sit in a folder called hooktrace)
            assert not fn.__code__.co_filename.startswith((HOOKTRACE_DIR, "<hooktrace"))
            assert fn.__module__ is None or not fn.__module__.startswith("hooktrace")
    never = [s for s in trace.surprises if s.rule == "never-fired"]
    fired = {h.id for h in trace.hooks if h.name.startswith("hook_")}
    assert not [s for s in never if fired & set(s.hooks)]


def test_stored_steps_made_before_the_block_traced_and_restored():
    m = model()
    opt = torch.optim.SGD(m[0].parameters(), lr=0.1)
    sched = sched_module.StepLR(opt, step_size=1)
    stored = opt.step  # a library keeps the scheduler-wrapped step
    other = torch.optim.Adam(m[2].parameters(), lr=0.1)
    bound = other.step  # ... or an optimizer's bound step
    classes = class_state()
    L = Log()
    opt.register_step_pre_hook(L.fn("pre"))
    other.register_step_post_hook(L.fn("post"))
    with hooktrace.trace(m) as t:
        m(torch.ones(4)).sum().backward()
        stored()
        bound()
        sched.step()
    assert L.log == ["pre", "post"] and L.traced(t.trace) == ["pre", "post"]
    assert class_state() == classes
    assert opt.step is stored and _step_wrappers(opt)[1].__code__ is pytorch_step_code()
    assert bound.__func__ is type(other).step and bound.__func__.__code__ is pytorch_step_code()


def test_optimizer_made_inside_then_scheduler_after_the_block():
    m = model()
    L = Log()
    with hooktrace.trace(m) as t:

        class MyAdam(torch.optim.Adam):
            pass

        opt = MyAdam(m.parameters(), lr=0.1)
        opt.register_step_pre_hook(L.fn("pre"))
        sched = sched_module.LambdaLR(opt, lambda e: 0.5)
        m(torch.ones(4)).sum().backward()
        opt.step()
        sched.step()
    assert L.traced(t.trace) == ["pre"]
    assert MyAdam.step.__code__ is pytorch_step_code()
    assert _step_wrappers(opt)[1].__code__ is pytorch_step_code()
    opt.step()  # PyTorch's own wrapper after the block: the hook still fires
    assert L.log == ["pre", "pre"]


def _compiled_steps(traced: bool) -> tuple[list[str], list[torch.Tensor], int, int]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = sched_module.StepLR(opt, step_size=1)
    L = Log()
    opt.register_step_pre_hook(L.fn("pre"))
    step = torch.compile(opt.step, backend="eager")
    ctx = hooktrace.trace(m) if traced else None
    if ctx is not None:
        ctx.__enter__()
    try:
        for _ in range(2):
            m(torch.ones(4)).sum().backward()
            step()
            sched.step()
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    breaks = sum(counters["graph_break"].values())
    return L.log, [p.detach().clone() for p in m.parameters()], breaks, counters["stats"]["unique_graphs"]


@pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method:DeprecationWarning"
)  # torch's own, on Dynamo's import
def test_compiled_scheduler_wrapped_step_same_graphs_traced_and_untraced():
    log, params, breaks, graphs = _compiled_steps(False)
    log2, params2, breaks2, graphs2 = _compiled_steps(True)
    assert log2 == log == ["pre", "pre"]
    assert all(torch.equal(a, b) for a, b in zip(params, params2))
    assert (breaks2, graphs2) == (breaks, graphs) and graphs >= 1
