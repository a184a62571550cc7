"""Issue 16 surprises on hand-made traces and on real runs: where each fires, and the nearest case where not."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn

import hooktrace
from hooktrace.analysis.surprises import find_surprises
from hooktrace.analysis.training import forward_wrapper, step_in_grad_hook
from hooktrace.schema import Event, Hook, Module, Trace

T = 7  # a thread id


def ev(seq, type_, phase, module, hook=None, kind=None, start=None, duration=1, thread=T) -> Event:
    return Event(seq, 0, type_, phase, module, hook, kind, thread, seq * 10 if start is None else start,
                 duration, False, None)  # fmt: skip


def user(hid: int, kind: str, scope: str = "module", module="fc", tensor=None, name=None) -> Hook:
    at = "train.py:10"
    return Hook(
        hid,
        kind,
        scope,
        module=module,
        tensor=tensor,
        name=name or f"h{hid}",
        registered_at=at,
        registered_by=at,
    )


def wrapped_trace(pre_first: bool) -> Trace:
    hooks = [user(1, "forward_pre"), user(2, "forward_wrapper", name="new_forward"), user(3, "forward")]
    inner = [
        ev(2, "hook", "forward", "fc", 2, "forward_wrapper"),
        ev(3, "hook", "forward", "fc", 3, "forward"),
    ]
    if pre_first:
        inner.insert(0, ev(1, "hook", "forward", "fc", 1, "forward_pre"))
    else:
        hooks = hooks[1:]
    events = [ev(0, "enter", "forward", "fc"), *inner, ev(4, "exit", "forward", "fc")]
    events = [e._replace(seq=i) for i, e in enumerate(events)]
    return Trace(modules=[Module("fc", "Linear")], hooks=hooks, events=events)


def test_forward_wrapper_after_a_users_pre_hook():
    trace = wrapped_trace(pre_first=True)
    [s] = forward_wrapper(trace)
    assert (s.rule, s.level, s.hooks) == ("forward-wrapper", "warn", [1, 2])
    assert "`h1`" in s.message and "`new_forward`" in s.message
    assert [x.rule for x in find_surprises(trace)].count("forward-wrapper") == 1


def test_forward_wrapper_without_pre_hooks_is_no_surprise():
    assert forward_wrapper(wrapped_trace(pre_first=False)) == []


def grad_hook_trace(step_inside: bool) -> Trace:
    hooks = [
        user(1, "grad", scope="tensor", module="fc", tensor="fc.weight", name="step_now"),
        Hook(
            2,
            "optimizer_step_pre",
            "optimizer",
            name="log_step",
            registered_at="t.py:3",
            registered_by="t.py:3",
        ),
    ]
    grad = ev(0, "hook", "backward", "fc", 1, "grad", start=100, duration=50)
    step_start = 120 if step_inside else 200
    step = ev(1, "hook", "optimizer", None, 2, "optimizer_step_pre", start=step_start, duration=5)
    return Trace(modules=[Module("fc", "Linear")], hooks=hooks, events=[grad, step])


def test_step_inside_a_parameters_grad_hook():
    [s] = step_in_grad_hook(grad_hook_trace(step_inside=True))
    assert s.rule == "step-in-grad-hook" and s.hooks == [1, 2] and s.events == [0, 1]
    assert "register_post_accumulate_grad_hook" in s.message and "fc.weight" in s.message


def test_step_after_backward_is_no_surprise():
    assert step_in_grad_hook(grad_hook_trace(step_inside=False)) == []


# -- the same rules on real runs (the capture of forward wrappers and optimizer hooks) ------------


def _wrap_forward(module: nn.Module) -> None:
    """accelerate's `add_hook_to_module`: forward replaced on the instance."""
    old = module.forward

    def new_forward(mod, *args, **kwargs):
        return old(*args, **kwargs)

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), old)


@pytest.mark.parametrize("with_pre_hook", [True, False])
def test_forward_wrapper_on_a_real_run(with_pre_hook):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    calls: list[str] = []
    with hooktrace.trace(model) as t:
        handles = [model[0].register_forward_hook(lambda *a: calls.append("post"))]
        if with_pre_hook:
            handles.append(model[0].register_forward_pre_hook(lambda *a: calls.append("pre")))
        _wrap_forward(model[0])
        model(torch.randn(2, 3))
    for h in handles:
        h.remove()
    assert any(e.kind == "forward_wrapper" for e in t.trace.events if e.type == "hook")
    found = [s for s in t.trace.surprises if s.rule == "forward-wrapper"]
    if with_pre_hook:
        [s] = found
        assert s.level == "warn" and handles[1].id in s.hooks
    else:
        assert found == []


@pytest.mark.parametrize("kind", ["grad", "post_accumulate_grad"])
def test_optimizer_step_inside_a_hook_on_a_real_run(kind):
    """Optimizer in backward: from a grad hook the step sees the old .grad (None); from a
    post-accumulate-grad hook it sees the new one. Only the first is a surprise."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list = []
    with hooktrace.trace(model) as t:
        pre = opt.register_step_pre_hook(lambda o, a, k: seen.append(model.weight.grad is None))
        if kind == "grad":
            h = model.weight.register_hook(lambda g: opt.step())
        else:
            h = model.weight.register_post_accumulate_grad_hook(lambda p: opt.step())
        model(torch.randn(2, 3)).sum().backward()
    h.remove()
    pre.remove()
    assert seen == [kind == "grad"]  # PyTorch itself: inside the grad hook, .grad was not there yet
    found = [s for s in t.trace.surprises if s.rule == "step-in-grad-hook"]
    assert len(found) == (1 if kind == "grad" else 0)
    if found:
        assert h.id in found[0].hooks and pre.id in found[0].hooks
