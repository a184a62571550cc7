"""Surprise rule `accumulating` (docs/surprises.md): a hook registered again in each step and never removed."""

from __future__ import annotations

import torch

import hooktrace

from .oracle import Zoo


def _rules(trace: hooktrace.Trace) -> list[str]:
    return [s.rule for s in trace.surprises]


def _train(steps: int, register, remove_each_step: bool) -> tuple[hooktrace.Trace, list[str]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    log: list[str] = []
    with hooktrace.trace(model) as t:
        for step in range(steps):
            if step:
                t.mark_step()
            handle = register(model, log, step)
            model(torch.randn(2, 3)).sum().backward()
            if remove_each_step:
                handle.remove()
    return t.trace, log


def _in_loop(model, log, step):
    def count_output(module, args, output):
        log.append(f"count_output@{step}")

    return model[0].register_forward_hook(count_output)


def test_a_hook_registered_in_the_loop_and_kept_accumulates():
    trace, log = _train(3, _in_loop, remove_each_step=False)
    fired = [e for e in trace.events if e.type == "hook"]
    assert len(fired) == len(log) == 1 + 2 + 3  # the hooks' own record: every old one still runs
    [found] = [s for s in trace.surprises if s.rule == "accumulating"]
    assert found.level == "warn"
    assert "1 in step 0, 2 in step 1, 3 in step 2" in found.message
    assert "`_in_loop.<locals>.count_output` (forward on `0`)" in found.message
    assert sorted(found.hooks) == sorted({e.hook for e in fired})


def test_registered_and_removed_each_step_does_not_accumulate():
    trace, log = _train(3, _in_loop, remove_each_step=True)
    assert len([e for e in trace.events if e.type == "hook"]) == len(log) == 3
    assert "accumulating" not in _rules(trace)


def test_one_step_cannot_show_it():
    trace, _log = _train(1, _in_loop, remove_each_step=False)
    assert "accumulating" not in _rules(trace)


def test_a_tensor_hook_registered_inside_forward_accumulates():
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 1)
            self.log: list[str] = []

        def forward(self, x):
            self.fc.weight.register_hook(self.scale)  # inside forward: one more every call
            return self.fc(x)

        def scale(self, grad):
            self.log.append("scale")

    model = Net()
    with hooktrace.trace(model) as t:
        for step in range(2):
            if step:
                t.mark_step()
            model(torch.randn(2, 3)).sum().backward()
    assert len([e for e in t.trace.events if e.type == "hook"]) == len(model.log) == 3
    [found] = [s for s in t.trace.surprises if s.rule == "accumulating"]
    assert "Net.scale` (grad on `fc.weight`)" in found.message and "1 in step 0, 2 in step 1" in found.message


def test_the_same_hooks_every_step_do_not_accumulate():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    zoo = Zoo()
    zoo.module(model, "forward", "out")
    zoo.module(model, "forward", "out2")  # two hooks with different code, registered once
    with hooktrace.trace(model) as t:
        for step in range(3):
            if step:
                t.mark_step()
            model(torch.randn(2, 3))
    assert zoo.traced(t.trace) == ["out", "out2"] * 3
    assert "accumulating" not in _rules(t.trace)
