"""Each surprise rule, made to happen for real in PyTorch, with the exact hooks and events it names."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import hooktrace
from tests.oracle import Zoo


def lin() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))


def rules(trace: hooktrace.Trace, rule: str) -> list:
    return [s for s in trace.surprises if s.rule == rule]


def hook_seqs(trace: hooktrace.Trace, hook_id: int) -> list[int]:
    return [e.seq for e in trace.events if e.type == "hook" and e.hook == hook_id]


def test_global_first():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        g = zoo.glob("forward_pre", "global_pre")
        p = zoo.module(m[0], "forward_pre", "prepended", prepend=True)
        m(torch.randn(1, 3))
        g.remove()
        p.remove()
    assert zoo.traced(t.trace) == zoo.log == ["global_pre", "global_pre", "prepended", "global_pre"]
    [s] = rules(t.trace, "global-first")
    assert s.hooks == [p.id, g.id]
    g_seq = hook_seqs(t.trace, g.id)[1]
    assert s.events == [g_seq, hook_seqs(t.trace, p.id)[0]]
    assert "`hook_prepended`" in s.message and "`hook_global_pre`" in s.message


def test_prepend_displaced():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        early = zoo.module(m[0], "forward", "early_prepend", prepend=True)
        later = zoo.module(m[0], "forward", "later_prepend", prepend=True)
        m(torch.randn(1, 3))
    early.remove()
    later.remove()
    assert zoo.log == ["later_prepend", "early_prepend"]
    [s] = rules(t.trace, "prepend-displaced")
    assert s.hooks == [early.id, later.id]
    assert s.events == [hook_seqs(t.trace, later.id)[0], hook_seqs(t.trace, early.id)[0]]
    assert not rules(t.trace, "global-first")


def test_recompute_and_early_stop():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)

        def inner(self, x):
            return self.b(torch.tanh(self.a(x)))

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False).sum()

    torch.manual_seed(0)
    m = Net()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        ha = zoo.module(m.a, "forward", "a_fwd")
        hb = zoo.module(m.b, "forward", "b_fwd")
        m(torch.randn(2, 3, requires_grad=True)).backward()
    ha.remove()
    hb.remove()
    [s] = rules(t.trace, "recompute")
    recomputed = [
        e
        for e in t.trace.events
        if e.type == "hook" and e.phase == "recompute" and e.kind in ("forward_pre", "forward")
    ]  # checkpoint's own pack hooks also run in the recompute
    assert recomputed and s.hooks == sorted({e.hook for e in recomputed})
    assert set(s.events) >= {e.seq for e in recomputed}
    assert zoo.traced(t.trace) == zoo.log


def test_never_fired_with_reasons():
    m = lin()
    extra = nn.Linear(3, 3)
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        unused = zoo.module(extra, "forward", "on_unused_module")
        bw = zoo.module(m[1], "backward", "needs_backward")
        sd = m[0].register_state_dict_pre_hook(lambda *a: None)
        m(torch.randn(1, 3))
    for h in (unused, bw, sd):
        h.remove()
    found = {hid: s.message for s in rules(t.trace, "never-fired") for hid in s.hooks}
    assert "was never called" in found[unused.id] or "outside the model" in found[unused.id]
    assert "no backward pass ran" in found[bw.id]
    assert "state_dict()" in found[sd.id]


def test_replaced_value():
    m = lin()
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        doubler = zoo.module(m[0], "forward", "doubler", returns=lambda mod, args, out: out * 2)
        watcher = zoo.module(m[0], "forward", "watcher")
        m(torch.randn(1, 3))
    doubler.remove()
    watcher.remove()
    [s] = rules(t.trace, "replaced-value")
    assert s.hooks == [doubler.id] and s.events == hook_seqs(t.trace, doubler.id)
    assert "the module's output" in s.message


def test_legacy_backward():
    m = lin()
    zoo = Zoo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace(m) as t:
            h = zoo.module(m[1], "backward_legacy", "legacy")
            m(torch.randn(1, 3, requires_grad=True)).sum().backward()
    h.remove()
    [s] = rules(t.trace, "legacy-backward")
    assert s.hooks == [h.id] and s.events == hook_seqs(t.trace, h.id)
    assert "register_full_backward_hook" in s.message


def test_hook_error_names_always_call_hooks_that_still_ran():
    m = lin()
    zoo = Zoo()
    with pytest.raises(KeyError):
        with hooktrace.trace(m) as t:
            bad = zoo.module(m[0], "forward_pre", "bad", raises=KeyError("nope"))
            always = zoo.module(m[0], "forward", "always", always_call=True)
            zoo.module(m[0], "forward", "normal")
            m(torch.randn(1, 3))
    bad.remove()
    always.remove()
    assert zoo.traced(t.trace) == zoo.log == ["bad", "always"]
    [s] = rules(t.trace, "hook-error")
    assert s.hooks == [bad.id, always.id]
    assert s.events == [hook_seqs(t.trace, bad.id)[0], hook_seqs(t.trace, always.id)[0]]
    assert "KeyError" in s.message


def test_registered_during_run():
    m = lin()
    zoo = Zoo()
    added = []

    def adds_a_hook(module, args):
        if not added:
            added.append(zoo.module(m[1], "forward", "added_in_forward"))

    with hooktrace.trace(m) as t:
        h = m[0].register_forward_pre_hook(adds_a_hook)
        m(torch.randn(1, 3))
        m(torch.randn(1, 3))
    h.remove()
    added[0].remove()
    [s] = rules(t.trace, "registered-during-run")
    assert s.hooks == [added[0].id]
    assert zoo.log == ["added_in_forward", "added_in_forward"]


def test_output_hook_before_backward_pre():
    torch.manual_seed(0)
    inner = nn.Linear(3, 3)
    m = nn.Sequential(inner)
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        pre = zoo.module(inner, "backward_pre", "inner_backward_pre")

        def on_root_output(module, args, output):
            handle = output.register_hook(zoo.fn("root_output_grad"))
            zoo.labels[handle.id] = "root_output_grad"

        root = m.register_forward_hook(on_root_output)
        m(torch.randn(2, 3, requires_grad=True)).sum().backward()
    pre.remove()
    root.remove()
    assert zoo.traced(t.trace) == zoo.log == ["root_output_grad", "inner_backward_pre"]
    [s] = rules(t.trace, "output-hook-before-backward-pre")
    out_hook = next(h for h in t.trace.hooks if h.name == "hook_root_output_grad")
    # the root returns inner's output as is: it is the output of the module with the backward pre-hook
    assert out_hook.tensor == "output of 0"
    assert s.hooks == [out_hook.id, pre.id]
    assert s.events == [hook_seqs(t.trace, out_hook.id)[0], hook_seqs(t.trace, pre.id)[0]]


def test_tensor_hook_in_own_forward_hook_runs_after_backward_pre():
    """The order the `prepend` PR discussed: a forward hook's output is not yet the hooked output."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3))
    zoo = Zoo()
    with hooktrace.trace(m) as t:
        pre = zoo.module(m[0], "backward_pre", "backward_pre")

        def on_output(module, args, output):
            handle = output.register_hook(zoo.fn("output_grad"))
            zoo.labels[handle.id] = "output_grad"

        fwd = m[0].register_forward_hook(on_output)
        m(torch.randn(2, 3, requires_grad=True)).sum().backward()
    pre.remove()
    fwd.remove()
    assert zoo.traced(t.trace) == zoo.log == ["backward_pre", "output_grad"]
    assert next(h for h in t.trace.hooks if h.name == "hook_output_grad").tensor == "output of 0"
    assert not rules(t.trace, "output-hook-before-backward-pre")
