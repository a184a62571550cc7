"""A module called inside the model but not part of it (transformers with the `kernels` package wraps
functions such as the rotary embedding in such `Func` modules) is named by its class, `(outside) Func`,
and what it holds under that: in events, hooks, the tree, DOT, HTML, the order lines and surprises.

Every hook logs its own label as it runs; hooktrace's order must equal that log, and the model runs
the same traced as untraced.
"""

from __future__ import annotations

import json

import torch
from torch import nn

import hooktrace
from hooktrace.render import render

from .training_hooks import Log


class Func(nn.Module):
    """A function wrapped in a module of its own, with a module inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * 2


class Net(nn.Module):
    def __init__(self, outside: list[nn.Module]) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self._outside = outside  # a plain list: not a submodule, not in named_modules()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._outside[0](self.fc(x)).sum()


def _build(L: Log) -> tuple[Net, Func]:
    torch.manual_seed(0)
    func = Func()
    net = Net([func])
    func.register_forward_pre_hook(L.fn("func_pre"))
    func.register_forward_hook(L.fn("func_fwd", returns=lambda m, i, o: o * 1))  # replaces the output
    func.proj.register_forward_hook(L.fn("proj_fwd"))
    func.register_full_backward_hook(L.fn("func_bwd"))
    net.fc.register_forward_hook(L.fn("fc_fwd"))
    return net, func


def _run(traced: bool) -> tuple[list[str], list[torch.Tensor], hooktrace.Trace | None]:
    L = Log()
    net, func = _build(L)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    if traced:
        with hooktrace.trace(net) as t:
            net(x).backward()
        trace = t.trace
    else:
        net(x).backward()
        trace = None
    grads = [p.grad.clone() for p in [*net.parameters(), *func.parameters()]]
    return L.log, grads, trace


def test_an_outside_module_is_named_by_its_class_everywhere():
    untraced_log, untraced_grads, _ = _run(False)
    log, grads, trace = _run(True)
    assert trace is not None
    assert log == untraced_log and all(torch.equal(a, b) for a, b in zip(grads, untraced_grads))
    names = {h.id: h for h in trace.hooks}
    fired = [names[e.hook] for e in trace.hook_events()]
    labels = [h.name[len("hook_") :] for h in fired]
    assert labels == log  # the order the hooks recorded
    by_label = dict(zip(labels, trace.hook_events()))
    assert by_label["func_pre"].module == "(outside) Func"
    assert by_label["func_fwd"].module == "(outside) Func"
    assert by_label["func_bwd"].module == "(outside) Func"
    assert by_label["proj_fwd"].module == "(outside) Func.proj"
    assert by_label["fc_fwd"].module == "fc"
    assert {h.module for h in trace.hooks} == {"fc", "(outside) Func", "(outside) Func.proj"}
    calls = {e.module for e in trace.events if e.type == "enter"}
    assert calls == {"", "fc", "(outside) Func", "(outside) Func.proj"}
    assert [m.path for m in trace.modules] == ["", "fc"]  # the model's modules stay the model's
    [replaced] = [s for s in trace.surprises if s.rule == "replaced-value"]
    assert "(outside) Func" in replaced.message
    for fmt in ("tree", "dot", "html", "order", "json", "chrome"):
        text = render(trace, fmt)
        assert "(outside) Func" in text, fmt
        assert fmt == "html" or "no module" not in text, fmt  # the page's script holds the words
    assert json.loads(trace.to_json())["events"]  # the format holds it as a plain path


def test_an_outside_module_that_is_gone_by_the_end_is_named_by_its_class():
    L = Log()

    class Fresh(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    class PerCall(nn.Module):  # makes its helper module anew at each call, as a function wrapper may
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return Fresh()(x)

    handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: L.log.append(type(m).__name__))
    try:
        m = PerCall()
        with hooktrace.trace(m) as t:
            m(torch.ones(1))
            m(torch.ones(1))
    finally:
        handle.remove()
    trace = t.trace
    assert [e.module for e in trace.hook_events()] == ["(outside) Fresh", "", "(outside) Fresh", ""]
    assert L.log == ["Fresh", "PerCall"] * 2


def test_a_module_of_the_model_is_not_outside():
    """The nearest case: the same Func held as a submodule is named by its path."""
    L = Log()
    net, func = _build(L)
    net.inner = func  # now part of the model
    with hooktrace.trace(net) as t:
        net(torch.randn(2, 4)).backward()
    modules = {e.module for e in t.trace.hook_events()}
    assert modules == {"fc", "inner", "inner.proj"}
    assert not any("(outside)" in render(t.trace, f) for f in ("tree", "order"))
